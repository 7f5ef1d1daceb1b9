//! The operations on sandboxes, each a small API with typed options and results, over
//! [`crate::containerd`] and [`crate::records`].

pub mod attach;
pub mod exec;
pub mod expire;
pub mod fork;
pub mod fork_options;
pub mod fork_running;
pub mod logs;
pub mod network;
pub mod parts;
pub mod remove;
pub mod resume;
pub mod run;
pub mod snapshot;
pub mod tree;
pub mod wait;
