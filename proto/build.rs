//! Compiles `scd/v1/scd.proto` and `atp/v1/*.proto` with the pure-Rust protox
//! compiler (no system protoc) into OUT_DIR, each with a descriptor set for
//! gRPC reflection.

use prost::Message;

const ATP: [&str; 8] = ["common", "identity", "handshake", "context", "routing", "fault", "task", "service"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);

    let scd = "scd/v1/scd.proto";
    println!("cargo:rerun-if-changed={scd}");
    let fds = protox::compile([scd], ["."])?;
    std::fs::write(out.join("scd_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::ScdCodec")
        // these carry content or secrets: src/redact.rs prints sizes instead
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

    let atp: Vec<String> = ATP.iter().map(|f| format!("atp/v1/{f}.proto")).collect();
    for f in &atp {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(&atp, ["."])?;
    std::fs::write(out.join("atp_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::ScdCodec")
        // task payloads and context chunks: src/redact.rs prints sizes instead
        .skip_debug([".atp.v1.ContextChunk", ".atp.v1.TaskSubmit", ".atp.v1.TaskResult", ".atp.v1.TaskCheckpoint"])
        .compile_fds(fds)?;
    Ok(())
}
