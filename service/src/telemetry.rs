//! The process's one tracing subscriber.

use tracing_subscriber::{fmt, EnvFilter};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event.
    Json,
}

/// Installs the subscriber: `RUST_LOG` filters (default `warn` for CLI
/// commands, `info` for the server), logs go to stderr.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
