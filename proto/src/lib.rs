//! The `gateway.v1` API: protobuf messages, tonic client and server stubs,
//! proto3-JSON (de)serialisation, and the configuration validation that the
//! control plane applies before commit and data planes apply before use.

pub mod cidr;
pub mod defaults;
pub mod field_diff;
pub mod hash;
pub mod spec;
pub mod validate;

/// Generated protobuf types and gRPC stubs of package `gateway.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod v1 {
    tonic::include_proto!("gateway.v1");
    include!(concat!(env!("OUT_DIR"), "/gateway.v1.serde.rs"));
}

/// By hand (build.rs skips the derive): a certificate's `Debug` shows
/// whether it has a private key, never the key, so no log line or error
/// that formats a configuration can leak one.
impl std::fmt::Debug for v1::Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("name", &self.name)
            .field("sni_hosts", &self.sni_hosts)
            .field("cert_chain_pem", &self.cert_chain_pem)
            .field(
                "private_key_pem",
                &if self.private_key_pem.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("private_key_set", &self.private_key_set)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("sha256_fingerprint", &self.sha256_fingerprint)
            .field("subject_alt_names", &self.subject_alt_names)
            .finish()
    }
}

/// The encoded `FileDescriptorSet` of every gateway proto, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/gateway_descriptor.bin"));

pub use hash::{config_hash, config_hash_with_issuers};
pub use validate::{ValidationError, validate_config};
