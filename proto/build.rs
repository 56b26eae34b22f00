//! Compiles `gateway/v1/*.proto` with protox (pure Rust, no protoc needed),
//! generates tonic stubs, proto3-JSON serde impls (pbjson) for seed files,
//! and writes the descriptor set that gRPC reflection serves.

use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "gateway/v1/config.proto",
        "gateway/v1/admin.proto",
        "gateway/v1/discovery.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_bytes = fds.encode_to_vec();
    std::fs::write(out.join("gateway_descriptor.bin"), &descriptor_bytes)?;

    tonic_prost_build::configure()
        // Certificate's Debug is written by hand (lib.rs): it must never print private_key_pem.
        .skip_debug([".gateway.v1.Certificate"])
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;

    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .build(&[".gateway.v1"])?;
    Ok(())
}
