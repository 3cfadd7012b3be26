//! The pure core of agentos: domain types, events, the fold that turns events into state, names, flags and URNs. No I/O happens here.

mod catalog_index;
pub mod command;
pub mod decide;
pub mod depth;
pub mod entry;
pub mod error;
pub mod event;
pub mod expr;
pub mod flagmap;
pub mod flags;
pub mod job;
pub mod message_id;
pub mod name;
pub mod net;
pub mod net_state;
pub mod search;
pub mod state;
pub mod time;
pub mod toolhelp;
pub mod urn;

pub use error::{CoreError, ErrorKind};

/// The model that always exists and holds the global catalog.
pub const DEFAULT_MODEL: &str = "default";
/// The place inside every model that holds its catalog entries.
pub const CATALOG_PLACE: &str = "p-tool-catalog";
/// The operator's principal id, the same across token rotations.
pub const OPERATOR_ID: &str = "operator";

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
