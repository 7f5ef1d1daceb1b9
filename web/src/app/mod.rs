//! The server's sandboxes and what a page can do with them: launch, split (snapshot while
//! running, fork into a new sandbox, delete the snapshot), suspend, resume, close. Every
//! containerd call goes through chalkctl's library on a blocking thread, each operation
//! with a client (and so a lease) of its own.
//!
//! Layers, each using only those below it: `housekeeping` (reaping, shutdown, reclaiming an
//! earlier run's leftovers) -> `operations` (what a page asks for) -> `state` (the server's
//! sandboxes by id, within the limits) -> `entry` (one sandbox: its state, terminal and
//! screen); `containerd` (the blocking chalk-client calls they share) and `error` sit below.

mod containerd;
mod entry;
mod error;
mod housekeeping;
mod operations;
mod state;

#[cfg(test)]
mod tests;

pub use containerd::OWNER_LABEL;
pub use entry::{Entry, Out, State};
pub use error::ApiError;
pub use state::{random_hex, App, Config};
