//! A snapshot's memory as the registry keeps it: pieces stored once, compressed, in packs,
//! and per snapshot an index over them (`index`); the page digests that find memory a push
//! need not send (`pages`); what a push sends (`plan`); the packs themselves (`pack`).

pub mod index;
pub mod pack;
pub mod pages;
pub mod plan;

pub use index::MemoryIndex;
pub use pages::PageTable;
