//! The `gateway.v1` API: protobuf messages, tonic client and server stubs,
//! proto3-JSON (de)serialisation, and the configuration validation that the
//! control plane applies before commit and data planes apply before use.

pub mod cidr;
pub mod defaults;
pub mod hash;
pub mod spec;
pub mod validate;

/// Generated protobuf types and gRPC stubs of package `gateway.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod v1 {
    tonic::include_proto!("gateway.v1");
    include!(concat!(env!("OUT_DIR"), "/gateway.v1.serde.rs"));
}

/// The encoded `FileDescriptorSet` of every gateway proto, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/gateway_descriptor.bin"));

pub use hash::config_hash;
pub use validate::{ValidationError, validate_config};
