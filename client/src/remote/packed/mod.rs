//! Snapshots whose memory travels as pieces (`chalk_runtime::snapshot::packed`): `push.rs`
//! sends only the pieces a repository lacks, `fetch.rs` puts the memory file back together
//! from them on a pull.

pub mod fetch;
pub mod push;
