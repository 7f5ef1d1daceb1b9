//! chalk-web: the two demo pages over containerd and chalk-shim — a live terminal split into
//! forks, and a sandbox suspended and resumed from the browser. The server owns each
//! sandbox's terminal (fifos of its own) and drives containerd through chalkctl's library.

pub mod app;
pub mod assets;
pub mod limits;
pub mod procs;
pub mod protocol;
pub mod replay;
pub mod server;
pub mod terminal;
