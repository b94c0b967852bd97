//! # scd-did
//!
//! The general trust code that both `scd serve` and the ATP stack build on,
//! with no protocol logic and no server:
//!
//! | module | what it holds |
//! |---|---|
//! | [`key`] | Ed25519 keys as multibase and `did:key`, strict verification |
//! | [`document`] | DID documents: their W3C JSON, the key they assert, where a `did:wba` document lies in a local directory |
//! | [`identity`] | an agent's key and DID, in a 0600 key file |
//! | [`nonce`] | replay logs: which (sender, nonce) pairs were seen |
//! | [`wba`] | the ANP `DIDWba` `Authorization` header that `scd serve --auth did-wba` checks |
//! | [`time`] | the one clock and RFC 3339 parser, on `jiff` |
//!
//! Nothing here reaches the network: a did:wba document is read from a
//! directory the operator controls.
#![warn(missing_docs)]

pub mod document;
pub mod error;
pub mod identity;
pub mod key;
pub mod nonce;
pub mod time;
pub mod wba;

pub use error::{Error, Result};
pub use identity::Identity;
/// The `atp.v1` messages a DID document and an agent id travel in.
pub use scd_proto::atp::v1 as pb;
