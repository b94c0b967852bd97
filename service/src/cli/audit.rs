//! `scd audit`: query the audit trail, from a running server (`--server`,
//! the `Audit` RPC) or from its database file (`--db`, only while no server
//! holds it: redb locks the file). Prints one JSON record per line, oldest
//! first.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use scd_audit::{AuditFilter, AuditLevel, AuditLog, AuditRecord, Retention};
use tokio_stream::StreamExt;

use crate::grpc::{audit, pb};
use crate::tls;

/// Arguments of `scd audit`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["server", "db"])))]
pub struct AuditArgs {
    /// Query a running server (http:// or https://): with
    /// --audit-token-file every record, else a caller with a client
    /// certificate or a DID sees only its own records (an anonymous one none).
    #[arg(long, env = "SCD_AUDIT_SERVER")]
    server: Option<String>,
    /// Read the audit database file directly (fails while a server holds it).
    #[arg(long, env = "SCD_AUDIT_DB")]
    db: Option<PathBuf>,
    /// Only this session.
    #[arg(long)]
    session: Option<String>,
    /// Only this caller (DID or certificate identity).
    #[arg(long)]
    caller: Option<String>,
    /// Only records at or after this time: RFC 3339 (2025-01-31T12:00:00Z),
    /// unix milliseconds, or an age (10m, 2h, 7d ago).
    #[arg(long)]
    since: Option<String>,
    /// Only records at or before this time (same forms as --since).
    #[arg(long)]
    until: Option<String>,
    /// At most this many records (the oldest matching).
    #[arg(long)]
    limit: Option<u32>,
    /// CA certificate (PEM) of an https:// --server.
    #[arg(long, env = "SCD_CLIENT_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS; with --client-key.
    #[arg(long, env = "SCD_CLIENT_CERT")]
    client_cert: Option<PathBuf>,
    /// Client private key (PEM) for mTLS; with --client-cert.
    #[arg(long, env = "SCD_CLIENT_KEY")]
    client_key: Option<PathBuf>,
    /// A DID signing the query (`--auth did-wba` servers): it sees only its
    /// own records.
    #[command(flatten)]
    sign: super::client::IdentityArgs,
    /// The operator's token file (the server's --audit-token-file): sent as
    /// `x-scd-audit-token`, it reads every record (with --server).
    #[arg(long, env = "SCD_AUDIT_TOKEN_FILE")]
    audit_token_file: Option<PathBuf>,
}

fn now_ms() -> u64 {
    scd_did::time::now_ms()
}

/// Unix ms of an RFC 3339 time (`2025-01-31T12:00:00Z`,
/// `2025-01-31T12:00:00.250+02:00`; see [`scd_did::time`] for the grammar).
fn rfc3339_ms(s: &str) -> Option<u64> {
    let t = scd_did::time::parse_rfc3339(s).ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

/// `--since` / `--until`: RFC 3339, unix ms, or an age before `now_ms`.
fn parse_time(flag: &str, s: &str, now_ms: u64) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    if let Some(ms) = rfc3339_ms(s) {
        return Ok(ms);
    }
    let age: Duration = super::parse_duration(s.trim_end_matches(" ago")).map_err(|_| {
        anyhow::anyhow!(
            "{flag} {s:?}: expected RFC 3339 (2025-01-31T12:00:00Z), unix milliseconds, or an age (10m, 2h, 7d)"
        )
    })?;
    Ok(now_ms.saturating_sub(age.as_millis() as u64))
}

/// The filter from the arguments.
fn filter(args: &AuditArgs, now_ms: u64) -> anyhow::Result<AuditFilter> {
    let since_ms = args.since.as_deref().map(|s| parse_time("--since", s, now_ms)).transpose()?;
    let until_ms = args.until.as_deref().map(|s| parse_time("--until", s, now_ms)).transpose()?;
    if let (Some(since), Some(until)) = (since_ms, until_ms) {
        anyhow::ensure!(since <= until, "--since ({since} ms) is after --until ({until} ms)");
    }
    Ok(AuditFilter {
        session: args.session.clone(),
        caller: args.caller.clone(),
        since_ms,
        until_ms,
        after_seq: None,
        limit: args.limit.filter(|l| *l > 0).map(|l| l as usize),
    })
}

fn print(out: &mut impl std::io::Write, r: &AuditRecord) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, r)?;
    writeln!(out)?;
    Ok(())
}

/// Runs `scd audit`.
pub fn run(args: AuditArgs) -> anyhow::Result<()> {
    let f = filter(&args, now_ms())?;
    let mut out = std::io::stdout().lock();
    if let Some(path) = &args.db {
        anyhow::ensure!(path.is_file(), "--db {}: no such file", path.display());
        let log =
            AuditLog::open(path, AuditLevel::Summary, Retention::default()).map_err(|e| anyhow::anyhow!("--db {e}"))?;
        for r in log.query(&f).map_err(|e| anyhow::anyhow!("--db {}: {e}", path.display()))? {
            print(&mut out, &r)?;
        }
        return Ok(());
    }
    let addr = args.server.clone().expect("clap: --server or --db");
    let signer = args.sign.signer()?;
    let token = args
        .audit_token_file
        .as_deref()
        .map(|path| -> anyhow::Result<tonic::metadata::AsciiMetadataValue> {
            let token = super::read_audit_token(path)?;
            let mut v: tonic::metadata::AsciiMetadataValue = token.parse().expect("checked: printable ASCII");
            v.set_sensitive(true);
            Ok(v)
        })
        .transpose()?;
    let tls = tls::client_config(
        &addr,
        &tls::ClientTlsFiles {
            ca_cert: args.ca_cert.clone(),
            client_cert: args.client_cert.clone(),
            client_key: args.client_key.clone(),
            domain: None,
        },
    )
    .map_err(|e| anyhow::anyhow!("{}", format!("{e:#}").replacen("--addr", "--server", 1)))?;
    let req = pb::AuditRequest {
        session_id: f.session.unwrap_or_default(),
        caller: f.caller.unwrap_or_default(),
        since_ms: f.since_ms.unwrap_or_default(),
        until_ms: f.until_ms.unwrap_or_default(),
        limit: f.limit.unwrap_or_default() as u32,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut endpoint = tonic::transport::Endpoint::from_shared(addr.clone())
            .with_context(|| format!("--server {addr}: not a URI"))?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint =
                endpoint.tls_config(tls).map_err(|e| anyhow::anyhow!("--server {addr}: {}", tls::error_chain(&e)))?;
        }
        let channel =
            endpoint.connect().await.map_err(|e| anyhow::anyhow!("--server {addr}: {}", tls::error_chain(&e)))?;
        let mut client = pb::scd_client::ScdClient::with_interceptor(channel, signer);
        let status = |s: tonic::Status| anyhow::anyhow!("Audit: {:?}: {}", s.code(), s.message());
        let mut req = tonic::Request::new(req);
        if let Some(token) = token {
            req.metadata_mut().insert(audit::AUDIT_TOKEN_HEADER, token);
        }
        let mut stream = client.audit(req).await.map_err(status)?.into_inner();
        while let Some(msg) = stream.next().await {
            print(&mut out, &audit::from_pb(msg.map_err(status)?))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_three_forms() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_time("--since", "1699999999000", now).unwrap(), 1_699_999_999_000);
        assert_eq!(parse_time("--since", "10m", now).unwrap(), now - 600_000);
        assert_eq!(parse_time("--since", "2d ago", now).unwrap(), now - 2 * 86_400_000);
        // `date -u -d 2023-11-14T22:13:20Z +%s` = 1700000000
        assert_eq!(parse_time("--since", "2023-11-14T22:13:20Z", now).unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("--since", "2023-11-15T00:13:20.250+02:00", now).unwrap(), 1_700_000_000_250);
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        let err = parse_time("--until", "yesterday", now).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--until \"yesterday\": expected RFC 3339 (2025-01-31T12:00:00Z), unix milliseconds, or an age (10m, 2h, 7d)"
        );
        assert!(rfc3339_ms("2023-13-14T22:13:20Z").is_none());
        assert!(rfc3339_ms("2023-02-31T22:13:20Z").is_none(), "the calendar is checked");
    }

    #[test]
    fn durations_name_their_unit() {
        assert_eq!(crate::cli::parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(crate::cli::parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(crate::cli::parse_duration("3w").unwrap_err(), "\"3w\": unknown unit \"w\" (s, m, h or d), e.g. 7d");
        assert!(crate::cli::parse_duration("h").is_err());
    }
}
