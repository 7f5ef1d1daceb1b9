//! The Task layer on fakes: a runtime that keeps its sandboxes in memory (their "processes"
//! are pids no host has), containerd's records and an event sink that records. No
//! containerd, no runsc.

mod checkpoint;
mod fakes;
mod lifecycle;
mod pod_restore;
