//! The HTTP listener (`--http-addr`): Prometheus metrics at `/metrics`.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::Metrics;
use super::ScdService;

/// Serves Prometheus text on `addr` (`GET /metrics`), a minimal HTTP/1.1 responder.
pub async fn serve_metrics(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, service: Arc<ScdService>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        let service = service.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics") {
                let stats = service.scd.cache_stats();
                let gauges = [
                    ("scd_queue_depth", "Embed requests waiting for the encoder.", service.batcher.depth() as f64),
                    ("scd_sessions", "Live sessions.", service.scd.session_count() as f64),
                    ("scd_cache_hits", "Embedding cache hits.", stats.hits as f64),
                    ("scd_cache_misses", "Embedding cache misses.", stats.misses as f64),
                    ("scd_cache_bytes", "Embedding cache size in bytes.", stats.bytes as f64),
                ];
                ("200 OK", metrics.render(&gauges))
            } else {
                ("404 Not Found", "see /metrics\n".to_string())
            };
            let reply = format!("HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            let _ = sock.write_all(reply.as_bytes()).await;
        });
    }
}
