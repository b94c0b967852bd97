//! `scd serve`: the gRPC service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use scd_engine::extract::{Scd, ScdConfig};

use crate::config::ModelArgs;
use crate::grpc::http::HttpLimits;
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
    /// Texts (rows) merged into one encoder call at most.
    #[arg(long, env = "SCD_BATCH_TEXTS", default_value_t = 64)]
    batch_texts: usize,
    /// Tokens merged into one encoder call at most (each text's tokens plus 2
    /// specials); a single request over it runs alone.
    #[arg(long, env = "SCD_MAX_BATCH_TOKENS", default_value_t = 8192)]
    max_batch_tokens: usize,
    /// Connections to --http-addr open at once; more are closed on accept.
    #[arg(long, env = "SCD_HTTP_MAX_CONNECTIONS", default_value_t = 256)]
    http_max_connections: usize,
    /// Milliseconds an HTTP connection has to send a complete request head
    /// (idle keep-alive connections included) before it is closed.
    #[arg(long, env = "SCD_HTTP_HEADER_TIMEOUT_MS", default_value_t = 5000)]
    http_header_timeout_ms: u64,
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
    anyhow::ensure!(args.max_batch_tokens > 0, "--max-batch-tokens: must be at least 1");
    anyhow::ensure!(args.http_max_connections > 0, "--http-max-connections: must be at least 1");
    anyhow::ensure!(args.http_header_timeout_ms > 0, "--http-header-timeout-ms: must be at least 1");
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
        max_batch_tokens: args.max_batch_tokens,
        max_concurrent_compress: args.max_concurrent_compress,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let http = HttpLimits {
        max_connections: args.http_max_connections,
        header_timeout: Duration::from_millis(args.http_header_timeout_ms),
    };
    rt.block_on(serve(scd, ServeConfig { addr: args.addr, http_addr: args.http_addr, limits, http }))
}
