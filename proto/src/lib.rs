//! # scd-proto
//!
//! The wire contracts, generated once (protox + tonic-prost-build in
//! `build.rs`) and shared by the SCD service and the ATP stack:
//!
//! - [`scd::v1`]: the SCD service (`proto/scd/v1/scd.proto`);
//! - [`atp::v1`]: the Agent Transport Protocol (`proto/atp/v1/*.proto`),
//!   wire-compatible with the reference implementation's `atp.v1`
//!   (same field numbers and types; SCD only adds).
//!
//! Both use [`codec::ScdCodec`], which answers an undecodable message with
//! INVALID_ARGUMENT, and messages that carry content or secrets print sizes,
//! never text, in `Debug` (`redact.rs`).
//!
//! ```
//! use scd_proto::atp::v1::{AgentId, CapabilityProbe};
//! use prost::Message;
//! let probe = CapabilityProbe { from: Some(AgentId { uuid: "did:key:z6Mk…".into() }), nonce: 7, ..Default::default() };
//! let bytes = probe.encode_to_vec();
//! assert_eq!(CapabilityProbe::decode(bytes.as_slice()).unwrap().nonce, 7);
//! ```
#![warn(missing_docs)]

pub mod codec;
pub mod context;
mod redact;

/// `scd.v1`: the SCD service.
pub mod scd {
    /// Generated protobuf and gRPC code for `scd.v1`.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("scd.v1");

        /// Encoded file descriptor set of `scd.v1`, for reflection.
        pub const DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/scd_descriptor.bin"));

        /// The metadata key with which an INVALID_ARGUMENT status names the
        /// engine parameter it is about, by its wire name (`scd-param:
        /// max_context_tokens`), so that a client (`scd mcp --server`) names
        /// it its own way by the typed field and reads no name out of the
        /// message. Part of the contract: the server sets it, clients read it.
        pub const PARAM_KEY: &str = "scd-param";
    }
}

/// `atp.v1`: the Agent Transport Protocol.
pub mod atp {
    /// Generated protobuf and gRPC code for `atp.v1`.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("atp.v1");

        /// Encoded file descriptor set of `atp.v1`, for reflection.
        pub const DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/atp_descriptor.bin"));
    }
}

/// `Debug` prints of content: `<N bytes>` (the context model's own type).
pub use scd_context::Redacted;
