//! Training-config rewrites: change a few values in a JSON, YAML or TOML file by dotted path, touching
//! nothing else, and write it back safely. The planning (formats, documents, edits checked node by
//! node) is pure and lives in memwatch-core (`memwatch_core::rewrite`, re-exported here); this crate
//! adds the write ([`write`](mod@write)).

pub use memwatch_core::rewrite::*;

mod root;
pub mod write;
