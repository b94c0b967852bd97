//! One module per subcommand.

#[cfg(feature = "atp")]
pub mod atp;
pub mod audit;
pub mod client;
pub mod compress;
pub mod config_file;
pub mod context;
pub mod demo;
pub mod embed;
pub mod embed_batch;
pub mod embed_queue;
mod embed_remote;
pub mod embed_timing;
pub mod embed_workers;
pub mod handoff;
pub mod identity;
pub mod mcp;
pub mod models;
pub mod progress;
pub mod serve;

use std::path::Path;

use anyhow::Context as _;

/// The exit of a binary (`scd`, `scd-dev`) that ran `result`: an error is
/// one line on stderr (`Error: what: why`, its causes joined), whatever
/// `RUST_BACKTRACE` says, and exit status 1.
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", format!("{e:#}").replace('\n', " "));
            std::process::ExitCode::FAILURE
        }
    }
}

pub(crate) use crate::input::{json_path_error, jsonl_text};

/// `--audit-max-bytes` when it is not given: 1 GiB of records (their summed
/// JSON size), so that a client sending many calls cannot fill the disk.
pub const DEFAULT_AUDIT_MAX_BYTES: u64 = 1 << 30;

/// `--audit-max-bytes`: a size in bytes, or `none` to keep every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditMaxBytes {
    /// Remove the oldest records past this many bytes.
    Bytes(u64),
    /// Keep every record (explicitly asked for).
    Unbounded,
}

/// The value parser of `--audit-max-bytes`.
pub(crate) fn parse_audit_max_bytes(s: &str) -> Result<AuditMaxBytes, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(AuditMaxBytes::Unbounded);
    }
    s.parse().map(AuditMaxBytes::Bytes).map_err(|_| format!("{s:?}: expected a number of bytes, or none"))
}

/// The retention of `--audit-max-age` / `--audit-max-bytes`: an unset
/// `--audit-max-bytes` is [`DEFAULT_AUDIT_MAX_BYTES`]; 0 is refused.
pub(crate) fn audit_retention(
    max_age: Option<std::time::Duration>,
    max_bytes: Option<AuditMaxBytes>,
) -> anyhow::Result<scd_audit::Retention> {
    let max_bytes = match max_bytes {
        None => Some(DEFAULT_AUDIT_MAX_BYTES),
        Some(AuditMaxBytes::Unbounded) => None,
        Some(AuditMaxBytes::Bytes(0)) => {
            anyhow::bail!("--audit-max-bytes 0: must be at least 1 (none keeps every record)")
        }
        Some(AuditMaxBytes::Bytes(n)) => Some(n),
    };
    Ok(scd_audit::Retention { max_age, max_bytes })
}

/// The operator's audit token from `--audit-token-file` (read by `scd
/// serve` and `scd audit`): the file's contents, whitespace trimmed, at
/// least [`MIN_AUDIT_TOKEN_BYTES`] printable ASCII bytes (it travels as the
/// `x-scd-audit-token` metadata value); on unix the file must not be
/// readable by group or others. Errors name the flag, never the token.
///
/// [`MIN_AUDIT_TOKEN_BYTES`]: crate::grpc::audit::MIN_AUDIT_TOKEN_BYTES
pub(crate) fn read_audit_token(path: &Path) -> anyhow::Result<String> {
    use crate::grpc::audit::MIN_AUDIT_TOKEN_BYTES;
    let flag = format!("--audit-token-file {}", path.display());
    let raw = std::fs::read(path).with_context(|| flag.clone())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path).with_context(|| flag.clone())?.permissions().mode();
        anyhow::ensure!(
            mode & 0o077 == 0,
            "{flag}: mode {:04o} lets others read the token (limit 0600: chmod 600 it)",
            mode & 0o7777
        );
    }
    let token = raw.trim_ascii();
    anyhow::ensure!(!token.is_empty(), "{flag}: empty (write the operator's secret token into it)");
    anyhow::ensure!(
        token.len() >= MIN_AUDIT_TOKEN_BYTES,
        "{flag}: the token is {} bytes, shorter than {MIN_AUDIT_TOKEN_BYTES} (e.g. `openssl rand -hex 32`)",
        token.len()
    );
    anyhow::ensure!(
        token.iter().all(|b| b.is_ascii_graphic()),
        "{flag}: the token must be printable ASCII without spaces (it is sent as gRPC metadata)"
    );
    Ok(String::from_utf8(token.to_vec()).expect("ASCII"))
}

/// A duration such as `90s`, `30m`, `12h` or `7d` (a whole number and a
/// unit): the value parser of `--audit-max-age` and relative `--since`.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: expected a whole number and a unit (s, m, h or d), e.g. 7d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h or d), e.g. 7d")),
    };
    n.checked_mul(secs).map(std::time::Duration::from_secs).ok_or_else(|| format!("{s:?}: too long"))
}
