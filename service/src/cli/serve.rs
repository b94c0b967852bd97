//! `scd serve`: the gRPC service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use scd_engine::extract::{Scd, ScdConfig};

use crate::config::ModelArgs;
use crate::grpc::{serve, Limits, ServeConfig};

/// Arguments of `scd serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// gRPC address (port 0 picks a free port; the chosen one is printed).
    #[arg(long, env = "SCD_ADDR", default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// Prometheus metrics address (GET /metrics); unset disables it.
    #[arg(long, env = "SCD_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Embed requests that may wait for the encoder; more are RESOURCE_EXHAUSTED.
    #[arg(long, env = "SCD_QUEUE_SIZE", default_value_t = 256)]
    queue_size: usize,
    /// Texts merged into one encoder call.
    #[arg(long, env = "SCD_BATCH_TEXTS", default_value_t = 64)]
    batch_texts: usize,
    /// Compress / RequestContext calls in flight at once; more are RESOURCE_EXHAUSTED.
    #[arg(long, env = "SCD_MAX_CONCURRENT_COMPRESS", default_value_t = 8)]
    max_concurrent_compress: usize,
    /// Texts per Embed request.
    #[arg(long, env = "SCD_MAX_TEXTS", default_value_t = 256)]
    max_texts: usize,
    /// Fields per Compress request.
    #[arg(long, env = "SCD_MAX_FIELDS", default_value_t = 256)]
    max_fields: usize,
    /// Largest request message in bytes.
    #[arg(long, env = "SCD_MAX_REQUEST_BYTES", default_value_t = 16 << 20)]
    max_request_bytes: usize,
    /// Embedding cache bound in bytes.
    #[arg(long, env = "SCD_CACHE_BYTES", default_value_t = 256 << 20)]
    cache_bytes: usize,
    /// Session lifetime after last use, seconds.
    #[arg(long, env = "SCD_SESSION_TTL_S", default_value_t = 1800)]
    session_ttl_s: u64,
    /// Sessions held at once.
    #[arg(long, env = "SCD_MAX_SESSIONS", default_value_t = 10_000)]
    max_sessions: usize,
}

/// Runs `scd serve`.
pub fn run(model: &ModelArgs, args: ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.queue_size > 0, "--queue-size: must be at least 1");
    anyhow::ensure!(args.max_texts > 0 && args.max_fields > 0, "--max-texts/--max-fields: must be at least 1");
    let encoder = Arc::new(model.load_encoder()?);
    let cfg = ScdConfig {
        cache_bytes: args.cache_bytes,
        session_ttl: Duration::from_secs(args.session_ttl_s),
        max_sessions: args.max_sessions,
        ..ScdConfig::default()
    };
    let scd = Arc::new(Scd::new(encoder, cfg));
    let limits = Limits {
        max_texts: args.max_texts,
        max_fields: args.max_fields,
        max_request_bytes: args.max_request_bytes,
        queue_size: args.queue_size,
        batch_texts: args.batch_texts.max(1),
        max_concurrent_compress: args.max_concurrent_compress,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(serve(scd, ServeConfig { addr: args.addr, http_addr: args.http_addr, limits }))
}
