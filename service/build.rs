//! Compiles proto/scd/v1/scd.proto with the pure-Rust protox compiler (no
//! system protoc) into OUT_DIR, with a descriptor set for gRPC reflection.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/scd/v1/scd.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("scd_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::grpc::codec::ScdCodec")
        // these carry content or secrets: grpc/redact.rs prints sizes instead
        .skip_debug([
            ".scd.v1.Field",
            ".scd.v1.Task",
            ".scd.v1.CompressRequest",
            ".scd.v1.CompressResponse",
            ".scd.v1.ContextRequest",
            ".scd.v1.EmbedRequest",
            ".scd.v1.CountTokensRequest",
            ".scd.v1.CloseSessionRequest",
            ".scd.v1.OpenSessionResponse",
        ])
        .compile_fds(fds)?;
    Ok(())
}
