//! The process's one tracing subscriber.

use tracing::{Level, Metadata};
use tracing_subscriber::filter::{filter_fn, FilterExt as _};
use tracing_subscriber::layer::{Filter, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{fmt, EnvFilter, Layer as _, Registry};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event.
    Json,
}

/// Whether `meta` may be logged whatever `RUST_LOG` says: the MCP SDK
/// (`rmcp`) logs whole requests and responses, tool arguments included (and
/// with them confidential field content), at debug level and notifications
/// at info, so its events below `warn` never are.
fn sdk_capped(meta: &Metadata<'_>) -> bool {
    let t = meta.target();
    let sdk = t == "rmcp" || t.starts_with("rmcp::");
    !sdk || *meta.level() <= Level::WARN
}

/// The filter of `rust_log` (or, when unset or invalid, `default_level`
/// with ONNX Runtime's own events at `warn`: its session set-up logs some
/// 200 lines at info), and `rmcp` events at `warn` and above only.
pub fn filter(rust_log: Option<&str>, default_level: &str) -> impl Filter<Registry> + Send + Sync + 'static {
    let env = rust_log
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{default_level},ort=warn")));
    env.and(filter_fn(sdk_capped))
}

/// Installs the subscriber: `RUST_LOG` filters (default `warn` for CLI
/// commands, `info` for the server), except that the MCP SDK's events
/// below `warn` are always dropped; logs go to stderr.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = filter(std::env::var(EnvFilter::DEFAULT_ENV).ok().as_deref(), default_level);
    // colour codes only for a person at a terminal, never into a file or a journal
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => tracing_subscriber::registry().with(layer.with_filter(filter)).init(),
        LogFormat::Json => tracing_subscriber::registry().with(layer.json().with_filter(filter)).init(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What events reach a subscriber with `filter(rust_log, "info")`.
    fn logged(rust_log: Option<&str>) -> String {
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let layer = fmt::layer()
            .with_writer(move || -> Box<dyn Write> {
                struct W(Arc<Mutex<Vec<u8>>>);
                impl Write for W {
                    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                        self.0.lock().unwrap().extend_from_slice(b);
                        Ok(b.len())
                    }
                    fn flush(&mut self) -> std::io::Result<()> {
                        Ok(())
                    }
                }
                Box::new(W(sink.clone()))
            })
            .with_filter(filter(rust_log, "info"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "rmcp::service", "request sk_live_SECRET_4242");
            tracing::info!(target: "rmcp::service", "received notification sk_live_SECRET_4242");
            tracing::warn!(target: "rmcp::service", "rmcp warning");
            tracing::debug!(target: "scd_service::mcp", "our debug line");
            tracing::info!(target: "ort::session", "ort info line");
            tracing::warn!(target: "ort::session", "ort warning");
            tracing::info!(target: "scd_service::server", "our info line");
        });
        let out = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        out
    }

    #[test]
    fn the_mcp_sdk_never_logs_below_warn() {
        for rust_log in ["debug", "trace", "rmcp=trace", "rmcp::service=debug", "info,rmcp=debug"] {
            let out = logged(Some(rust_log));
            assert!(!out.contains("sk_live_SECRET_4242"), "RUST_LOG={rust_log}: {out}");
            assert!(out.contains("rmcp warning"), "RUST_LOG={rust_log}: {out}");
        }
        // the rest of RUST_LOG still applies
        assert!(logged(Some("debug")).contains("our debug line"));
        assert!(!logged(None).contains("our debug line"));
    }

    #[test]
    fn onnx_runtime_logs_at_warn_unless_rust_log_asks() {
        let quiet = logged(None);
        assert!(!quiet.contains("ort info line") && quiet.contains("ort warning"), "{quiet}");
        assert!(quiet.contains("our info line"), "{quiet}");
        assert!(logged(Some("info")).contains("ort info line"), "RUST_LOG decides when set");
    }
}
