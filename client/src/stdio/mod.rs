//! A sandbox's stdio as chalkctl keeps it: where (`state`), the keeper process that holds
//! the init's fifos and logs its output (`keeper`, `log`), reading a fifo to its end (`pump`), and this side's terminal for
//! `exec -t` and `attach` (`tty`, `detach`).

pub mod detach;
pub mod keeper;
pub mod log;
pub mod pump;
pub mod state;
pub mod tty;
