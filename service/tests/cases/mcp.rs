//! `scd mcp` end to end with a real MCP client from a registry: the Python
//! `mcp` package (`.tools/venv`, pinned in models/requirements.txt) drives
//! `service/tests/py/mcp_client.py` over stdio, over streamable HTTP, and
//! over stdio again with the tools forwarded to a running `scd serve`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use scd_service::grpc::pb;

use crate::{grpc, ready, root};

const SECRET: &str = "sk_live_SECRET_4242";

/// Kills the child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn model_env(cmd: &mut Command) -> &mut Command {
    cmd.current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        // the persistent embedding cache is tested on its own
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2")
}

/// Runs the client script with `args`; its summary (last stdout line) on success.
fn client(python: &Path, args: &[&str]) -> serde_json::Value {
    client_with_stderr(python, args).0
}

/// [`client`], and the stderr of the client and of a server it started.
fn client_with_stderr(python: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let mut cmd = Command::new(python);
    cmd.arg(root().join("service/tests/py/mcp_client.py")).args(args);
    let out: Output = model_env(&mut cmd).output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "mcp_client.py {args:?} failed:\n{stdout}\n{stderr}");
    // the secret appears nowhere, not even in the server's logs on stderr
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "{stdout}\n{stderr}");
    let last = stdout.lines().last().expect("a summary line");
    (serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}")), stderr)
}

/// What every transport must have shown.
fn check_summary(s: &serde_json::Value, transport: &str) {
    assert_eq!(s["transport"], transport);
    assert_eq!(s["tools"], serde_json::json!(["compress_context", "count_tokens", "embed", "request_more_context"]));
    assert!(s["compress"]["sent_tokens"].as_u64().unwrap() <= 400, "{s}");
    assert!(s["more"]["chunks"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["embed"]["dim"], 384);
    let errors = &s["errors"];
    assert_eq!(errors["zero_budget"], "budget: must be at least 1");
    // rate: LLMLingua's share of the context instead of a budget (checked in mcp_client.py), named when wrong
    let range = format!("rate: {}", scd_engine::budget::RATE_RANGE);
    assert_eq!(
        (&errors["rate_zero"], &errors["rate_over_one"]),
        (&serde_json::json!(range), &serde_json::json!(range))
    );
    assert_eq!(errors["rate_and_budget"], "rate: give budget or rate, not both");
    assert_eq!(errors["no_budget"], "budget: required (tokens), or give rate");
    let quarter = &s["rate"]["0.25"];
    assert!((quarter["requested_ratio"].as_f64().unwrap() - 4.0).abs() < 0.1, "{s}");
    assert_eq!(errors["confidential"], "required: field \"api_keys\" is confidential and is never sent");
    assert!(
        errors["unknown_key"].as_str().unwrap().starts_with("context.fields[0].confidental: unknown field"),
        "{errors}"
    );
    assert!(s["responses_checked"].as_u64().unwrap() >= 17, "{s}");
    // budget_tokenizer and explain reach the engine (in process or on a running server)
    let b = &s["budget_tokenizer"];
    assert_eq!(b["tokenizer"], "o200k", "{s}");
    assert!(b["sent_tokens"].as_u64().unwrap() <= 200 && b["explained"].as_u64().unwrap() >= 1, "{s}");
    assert!(!b["dropped_reasons"].as_array().unwrap().is_empty(), "{s}");
    let e = errors["budget_tokenizer"].as_str().unwrap();
    assert!(e.contains("choose one of: e5, o200k, cl100k") && !e.contains("root:"), "{e}");
}

fn context() -> String {
    root().join("fixtures/agent_context.json").display().to_string()
}

#[test]
fn mcp_over_stdio_with_the_python_client() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let bin = env!("CARGO_BIN_EXE_scd");
    let s = client(&python, &["stdio", &context(), "--", bin, "mcp"]);
    check_summary(&s, "stdio");
}

/// What an MCP client pays before its first call: the `tools/list` result
/// as the official Python client receives it (fields the server left out
/// stay out), serialized compactly, counted in cl100k here. At most 1,000
/// tokens (docs/protocols.md keeps the figure).
#[test]
fn listing_the_tools_costs_a_model_at_most_1000_cl100k_tokens() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let bin = env!("CARGO_BIN_EXE_scd");
    let s = client(&python, &["tools", &context(), "--", bin, "mcp"]);
    assert_eq!(s["tools"], serde_json::json!(["compress_context", "count_tokens", "embed", "request_more_context"]));
    let listed = s["tools_json"].as_str().expect("the listing as JSON text");
    let parsed: serde_json::Value = serde_json::from_str(listed).unwrap();
    for tool in parsed["tools"].as_array().unwrap() {
        assert!(tool["description"].as_str().is_some_and(|d| !d.is_empty()), "{tool}");
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
    }
    let tokens = scd_engine::budget::builtin("cl100k").unwrap().count(listed).unwrap();
    eprintln!("tools/list as the Python MCP client receives it: {tokens} cl100k tokens, {} bytes", listed.len());
    assert!(tokens <= 1000, "tools/list costs {tokens} cl100k tokens (at most 1,000): {listed}");
}

/// A dev-set file under `../shared/evaldata` (or `SCD_SHARED_DIR`), or a
/// skip (a failure under CI).
fn evaldata(rel: &str) -> Option<String> {
    let shared = std::env::var_os("SCD_SHARED_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"));
    let p = shared.join("evaldata").join(rel);
    if p.is_file() {
        return Some(p.display().to_string());
    }
    crate::skip(&format!("{} absent (../shared/evaldata is not part of the repository)", p.display()));
    None
}

/// OpenAI's cl100k_base file as the tiktoken-rs crate ships it (cargo has
/// it in its registry: it is a dependency of the engine).
fn cl100k_file() -> Option<String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let src = home.join("registry/src");
    let found = std::fs::read_dir(&src).ok()?.flatten().find_map(|index| {
        let p = index.path().join("tiktoken-rs-0.12.1/assets/cl100k_base.tiktoken");
        p.is_file().then_some(p)
    });
    if found.is_none() {
        crate::skip(&format!("no tiktoken-rs-0.12.1/assets/cl100k_base.tiktoken under {}", src.display()));
    }
    found.map(|p| p.display().to_string())
}

/// What a model actually receives: every text block of `compress_context`
/// (plain, with explain, rendered semi_structured and structured_soft with
/// explain) and of a follow-up with its own budget, on three HotpotQA and
/// three Rust-source contexts, counted by tiktoken's cl100k in Python: at
/// most 1.1x the budget plus a 64-token header.
#[test]
fn what_a_model_sees_of_mcp_results_fits_the_budget_in_tiktoken_cl100k() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp, tiktoken") else { return };
    let (Some(hotpot), Some(code), Some(cl100k)) =
        (evaldata("hotpotqa/hotpot_hf_schema.jsonl"), evaldata("code/code_search_dev.jsonl"), cl100k_file())
    else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_scd");
    let s = client(&python, &["window", &context(), &cl100k, &hotpot, &code, "--", bin, "mcp"]);
    eprintln!("receiver's window: {s}");
    assert_eq!(s["calls"], 6 * 5, "{s}");
    assert!(s["header_max_tokens"].as_u64().unwrap() <= 64, "{s}");
    assert!(s["worst_body_ratio"].as_f64().unwrap() <= 1.0, "the text itself within the budget: {s}");
    assert!(s["overall_ratio"].as_f64().unwrap() <= 1.1, "{s}");
}

#[test]
fn debug_logs_never_show_confidential_content() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let bin = env!("CARGO_BIN_EXE_scd");
    // the MCP SDK dumps whole tool calls at debug level: RUST_LOG=debug must
    // not bring them (and the secret in them) to stderr; `client` checks
    // that the secret is nowhere in the server's stderr
    let (s, stderr) = client_with_stderr(&python, &["stdio", &context(), "--", "env", "RUST_LOG=debug", bin, "mcp"]);
    check_summary(&s, "stdio");
    assert!(stderr.contains("DEBUG"), "RUST_LOG=debug was in effect:\n{stderr}");
}

#[test]
fn mcp_over_streamable_http_with_the_python_client() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scd"));
    let mut child = model_env(&mut cmd)
        .args(["mcp", "--http-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines.next().expect("scd mcp printed its address").unwrap();
        if let Some(u) = line.strip_prefix("mcp on ") {
            break u.to_string();
        }
    };
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"), "{url}");
    let s = client(&python, &["http", &context(), &url]);
    check_summary(&s, "http");
}

#[test]
fn another_http_client_cannot_use_a_session_it_did_not_open() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let (_guard, url) = mcp_http(&[]);
    let s = client(&python, &["two_clients", &context(), &url]);
    for what in ["more", "continue"] {
        let e = s[what].as_str().unwrap();
        assert_eq!(e, "session: not a session of this MCP client; open one with compress_context", "{what}");
    }
    assert_eq!(s["owner_continues"], true, "{s}");
    assert_eq!(s["owner_reopens"], true, "{s}");
}

#[test]
fn mcp_forwards_to_a_running_server() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let server = grpc::start(&[]);
    // wait until the server's model is loaded
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut grpc_client = rt.block_on(grpc::client(&server));
    // the server types an invalid argument's parameter on the wire (`scd-param`)
    let field = pb::Field {
        name: "notes".into(),
        kind: pb::FieldKind::Prose as i32,
        content: "x".into(),
        ..Default::default()
    };
    let bad = pb::CompressRequest {
        task: Some(pb::Task { description: "t".into(), ..Default::default() }),
        fields: vec![field],
        requirement: Some(pb::ContextRequirement {
            max_context_tokens: 50,
            required_fields: vec!["nope".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = rt.block_on(grpc_client.compress(bad)).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("required_fields: unknown field"), "{e:?}");
    assert_eq!(e.metadata().get("scd-param").map(|v| v.to_str().unwrap()), Some("required_fields"), "{e:?}");
    let bin = env!("CARGO_BIN_EXE_scd");
    // a models dir that does not exist: --server must not load a model
    let s = client(
        &python,
        &["stdio", &context(), "--", bin, "--models-dir", "/nonexistent", "mcp", "--server", &server.addr],
    );
    // the summary's `confidential` error came back `required_fields: …` with
    // `scd-param: required_fields`, and reads `required: …`, by that typed field
    check_summary(&s, "stdio");
}

/// `scd mcp --audit-db`: the tools' calls in process are recorded as the
/// core names them, by surface and method, refused ones with their kind,
/// and no record holds the confidential field's content.
#[test]
fn mcp_records_its_tool_calls_with_audit_db() {
    if !ready() {
        return;
    }
    let Some(python) = crate::atp_reference::python_with("mcp") else { return };
    let dir = crate::scratch("mcp-audit");
    let db = dir.join("mcp.redb");
    let db = db.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_scd");
    let s = client(&python, &["stdio", &context(), "--", bin, "mcp", "--audit-db", db, "--audit-level", "chunks"]);
    check_summary(&s, "stdio");
    // the client has closed scd mcp's stdin and it has exited: the file is free
    let (ok, out, err) = crate::scd(&["audit", "--db", db], "");
    assert!(ok, "{err}");
    let records: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let named: std::collections::BTreeSet<(&str, &str)> =
        records.iter().map(|r| (r["method"].as_str().unwrap(), r["outcome"].as_str().unwrap())).collect();
    for want in [
        ("MCP OpenSession", "ok"),
        ("MCP Compress", "ok"),
        ("MCP RequestContext", "ok"),
        // an unknown budget tokenizer, a confidential field required: refused by the core
        ("MCP OpenSession", "InvalidArgument"),
    ] {
        assert!(named.contains(&want), "{want:?} is not in {named:?}");
    }
    assert!(named.iter().all(|(m, _)| m.starts_with("MCP ")), "{named:?}");
    // count_tokens and embed are not audited, on any surface
    assert!(named.iter().all(|(m, _)| !m.ends_with("CountTokens") && !m.ends_with("Embed")), "{named:?}");
    let opened = records.iter().find(|r| r["method"] == "MCP OpenSession" && r["outcome"] == "ok").unwrap();
    assert_eq!(opened["withheld"], serde_json::json!(["api_keys"]), "{opened}");
    assert!(!opened["chunks"].as_array().unwrap().is_empty(), "level chunks lists the chunks sent: {opened}");
    // the confidential field is named, never quoted
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(context()).unwrap()).unwrap();
    let secret = fixture["fields"].as_array().unwrap().iter().find(|f| f["confidential"] == true).unwrap();
    let content = secret["content"].as_str().unwrap();
    assert!(content.contains(SECRET));
    assert!(!out.contains(SECRET) && !out.contains(content), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `scd mcp --http-addr 127.0.0.1:0 EXTRA`; the guard and its URL.
fn mcp_http(extra: &[&str]) -> (Guard, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scd"));
    let mut child = model_env(&mut cmd)
        .arg("mcp")
        .args(["--http-addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Guard(child);
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines.next().expect("scd mcp printed its address").unwrap();
        if let Some(u) = line.strip_prefix("mcp on ") {
            break u.to_string();
        }
    };
    (guard, url)
}

/// The `host:port` of an `http://host:port/mcp` URL.
fn host(url: &str) -> &str {
    url.trim_start_matches("http://").trim_end_matches("/mcp")
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// One HTTP/1.1 request on its own connection; the whole response text.
fn raw_http(addr: &str, method: &str, session: Option<&str>, body: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(addr)?;
    let session = session.map_or(String::new(), |s| format!("mcp-session-id: {s}\r\n"));
    write!(
        sock,
        "{method} /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\naccept: application/json, \
         text/event-stream\r\n{session}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    sock.read_to_string(&mut out)?;
    Ok(out)
}

fn session_id(response: &str) -> &str {
    let at = response.find("mcp-session-id: ").expect("a session id") + "mcp-session-id: ".len();
    response[at..].lines().next().unwrap().trim()
}

#[test]
fn http_sessions_are_capped_and_an_ended_one_frees_its_place() {
    // --server: no model is loaded; initialize never reaches the backend
    let (_guard, url) =
        mcp_http(&["--server", "http://127.0.0.1:9", "--models-dir", "/nonexistent", "--max-http-sessions", "2"]);
    let addr = host(&url);
    let first = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let second = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    let refused = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 5"), "{refused}");
    assert!(
        refused.contains(
            r#"{"error":{"code":-32000,"message":"too many MCP sessions: 2 open (--max-http-sessions); retry after 5 s, or end an idle session (DELETE /mcp with its Mcp-Session-Id)"},"id":7,"jsonrpc":"2.0"}"#
        ),
        "{refused}"
    );
    // the open sessions still work (a request with its session id passes)
    let ping = raw_http(addr, "POST", Some(session_id(&first)), r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#).unwrap();
    assert!(ping.starts_with("HTTP/1.1 200") && ping.contains(r#""id":8"#), "{ping}");
    // ending one frees its place
    let deleted = raw_http(addr, "DELETE", Some(session_id(&first)), "").unwrap();
    assert!(deleted.starts_with("HTTP/1.1 2"), "{deleted}");
    let third = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(third.starts_with("HTTP/1.1 200"), "{third}");
}

#[test]
fn http_connections_are_capped() {
    use std::io::Read;
    let (_guard, url) = mcp_http(&[
        "--server",
        "http://127.0.0.1:9",
        "--models-dir",
        "/nonexistent",
        "--http-max-connections",
        "1",
        // no probe reserve here (the reserve has its own test)
        "--http-reserve",
        "0",
        "--http-header-timeout-ms",
        "600000",
    ]);
    let addr = host(&url);
    // an idle connection holds the only place
    let idle = std::net::TcpStream::connect(addr).unwrap();
    let mut second = std::net::TcpStream::connect(addr).unwrap();
    let mut buf = [0u8; 16];
    // closed at once, without an answer
    let n = second.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the connection past the limit was served");
    drop(idle);
    // once the idle one is gone, a request is answered again
    let mut answered = None;
    for _ in 0..100 {
        match raw_http(addr, "POST", None, INITIALIZE) {
            Ok(r) if r.starts_with("HTTP/1.1 200") => {
                answered = Some(r);
                break;
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    assert!(answered.is_some(), "no answer after the idle connection closed");
}

#[test]
fn mcp_flags_are_checked_before_any_work() {
    let (ok, _, err) = crate::scd(&["mcp", "--max-sessions", "0"], "");
    assert!(!ok);
    assert!(err.contains("--max-sessions 0: must be at least 1"), "{err}");
    let (ok, _, err) = crate::scd(&["mcp", "--http-addr", "127.0.0.1:0", "--max-http-sessions", "0"], "");
    assert!(!ok);
    assert!(err.contains("--max-http-sessions 0: must be at least 1"), "{err}");
    let (ok, _, err) = crate::scd(&["mcp", "--max-http-sessions", "3"], "");
    assert!(!ok);
    assert!(err.contains("--http-addr"), "{err}");
    let (ok, _, err) = crate::scd(&["mcp", "--ca-cert", "x.pem"], "");
    assert!(!ok);
    assert!(err.contains("--server"), "{err}");
    let (ok, _, err) = crate::scd(&["mcp", "--audit-max-age", "7d"], "");
    assert!(!ok);
    assert!(err.contains("--audit-max-age: needs --audit-db"), "{err}");
    let (ok, _, err) = crate::scd(&["mcp", "--server", "http://127.0.0.1:1", "--audit-db", "mcp.redb"], "");
    assert!(!ok);
    assert!(err.contains("--audit-db: with --server the tools run on that server"), "{err}");
}

/// `scd mcp` with `RUST_LOG=info`, `env` and `args`, its stdin closed at
/// once (so a started one ends at initialization): (success, stderr).
fn mcp_env(env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let mut cmd = crate::support::command(Path::new(env!("CARGO_BIN_EXE_scd")));
    cmd.env("RUST_LOG", "info").envs(env.iter().copied()).arg("mcp").args(args);
    let (ok, _, err) = crate::support::output(&mut cmd, "");
    (ok, err)
}

/// `scd mcp --server` is not stopped by audit variables (its tools run on
/// the server, which keeps the trail): `scd serve`'s `SCD_AUDIT_DB` is not
/// read, its own `SCD_MCP_AUDIT_*` are ignored in one line naming them;
/// the `--audit-db` flag is still refused, with the variable or without.
#[test]
fn mcp_with_server_ignores_audit_variables_and_refuses_the_flag() {
    let dir = crate::scratch("mcp-audit-env-server");
    let db = dir.join("audit.redb");
    let db = db.to_str().unwrap();
    let server = ["--server", "http://127.0.0.1:1"];
    let started = "MCP over stdio";
    let (_, err) = mcp_env(&[("SCD_AUDIT_DB", db), ("SCD_AUDIT_MAX_AGE", "7d")], &server);
    assert!(err.contains(started) && !err.contains("--audit"), "{err}");
    let (_, err) = mcp_env(&[("SCD_MCP_AUDIT_DB", db), ("SCD_MCP_AUDIT_MAX_AGE", "7d")], &server);
    assert!(err.contains(started), "{err}");
    let ignored =
        "SCD_MCP_AUDIT_DB, SCD_MCP_AUDIT_MAX_AGE ignored: with --server the tools run on that server, which keeps \
         the audit trail";
    assert_eq!(err.matches(ignored).count(), 1, "{err}");
    let refused = "--audit-db: with --server the tools run on that server";
    for env in [&[][..], &[("SCD_MCP_AUDIT_DB", db)]] {
        let (ok, err) = mcp_env(env, &[&server[..], &["--audit-db", db]].concat());
        assert!(!ok && err.contains(refused) && !err.contains(started), "{env:?}: {err}");
    }
    // a flag the variable needed is refused as without it
    let (ok, err) = mcp_env(&[("SCD_MCP_AUDIT_DB", db)], &[&server[..], &["--audit-max-age", "7d"]].concat());
    assert!(!ok && err.contains("--audit-max-age: needs --audit-db"), "{err}");
    assert!(!Path::new(db).exists(), "nothing opened the file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// In process, `scd mcp` keeps its trail where `SCD_MCP_AUDIT_DB` says and
/// leaves `scd serve`'s `SCD_AUDIT_DB` alone (saying so in one line).
#[test]
fn mcp_in_process_reads_its_own_audit_variable_not_the_servers() {
    if !ready() {
        return;
    }
    let dir = crate::scratch("mcp-audit-env");
    let (mine, servers) = (dir.join("mcp.redb"), dir.join("serve.redb"));
    let env = [("SCD_MCP_AUDIT_DB", mine.to_str().unwrap()), ("SCD_AUDIT_DB", servers.to_str().unwrap())];
    let (_, err) = mcp_env(&env, &[]);
    assert!(err.contains("MCP over stdio"), "{err}");
    assert!(
        err.contains("SCD_AUDIT_DB is scd serve's audit trail; scd mcp records with --audit-db or SCD_MCP_AUDIT_DB")
    );
    assert!(mine.exists() && !servers.exists(), "{err}");
    // without its own variable, none is opened
    std::fs::remove_file(&mine).unwrap();
    let (_, err) = mcp_env(&env[1..], &[]);
    assert!(err.contains("MCP over stdio") && !mine.exists() && !servers.exists(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `compress_context` with `api_keys` marked confidential, then public, in
/// one object: JSON-RPC request `id` 9.
const DUPLICATE_CALL: &str = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"compress_context","arguments":{"task":"Which key does checkout use?","budget":200,"context":{"fields":[{"name":"notes","content":"Checkout calls the payment API."},{"name":"api_keys","content":"sk_live_SECRET_4242","confidential":true,"confidential":false}]}}}}"#;

const DUPLICATE_WHY: &str =
    "params.arguments.context.fields[1].confidential: duplicate key; each key may appear once in an object";

/// A key twice in one object never reaches the tools, over HTTP: the
/// request is answered 400 with a JSON-RPC error naming the key's path (no
/// backend is reachable: nothing else could answer so).
#[test]
fn mcp_over_http_refuses_a_repeated_key_before_any_tool_runs() {
    let (_guard, url) = mcp_http(&["--server", "http://127.0.0.1:9", "--models-dir", "/nonexistent"]);
    let addr = host(&url);
    let init = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(init.starts_with("HTTP/1.1 200"), "{init}");
    let session = session_id(&init).to_string();
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(raw_http(addr, "POST", Some(&session), note).unwrap().starts_with("HTTP/1.1 2"));
    let refused = raw_http(addr, "POST", Some(&session), DUPLICATE_CALL).unwrap();
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let body: serde_json::Value = serde_json::from_str(refused.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["id"], 9, "{body}");
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert_eq!(body["error"]["message"], DUPLICATE_WHY);
    assert!(!refused.contains("SECRET"), "{refused}");
}

/// The same over stdio: the line never reaches rmcp, and the client gets
/// the error for its request id on stdout.
#[test]
fn mcp_over_stdio_refuses_a_repeated_key_before_any_tool_runs() {
    use std::io::Write;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scd"));
    let mut child = model_env(&mut cmd)
        .args(["mcp", "--server", "http://127.0.0.1:9", "--models-dir", "/nonexistent"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let _guard = Guard(child);
    writeln!(stdin, "{INITIALIZE}").unwrap();
    let init = lines.next().unwrap().unwrap();
    assert!(init.contains(r#""id":7"#) && init.contains("serverInfo"), "{init}");
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    writeln!(stdin, "{DUPLICATE_CALL}").unwrap();
    let reply: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(reply["id"], 9, "{reply}");
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!(reply["error"]["message"], DUPLICATE_WHY);
    // the server goes on: a ping is answered
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":10,"method":"ping"}}"#).unwrap();
    let pong = lines.next().unwrap().unwrap();
    assert!(pong.contains(r#""id":10"#) && pong.contains("result"), "{pong}");
}

/// One HTTP/1.1 request to `scd mcp` from the loopback address `from`
/// with `headers`: the whole response text.
fn raw_http_from(
    from: &str,
    addr: &str,
    method: &str,
    session: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let session = session.map(|s| ("mcp-session-id", s));
    let mut all = vec![("Host", addr), ("Accept", "application/json, text/event-stream")];
    all.extend(session);
    all.extend_from_slice(headers);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let raw = rt.block_on(crate::a2a::request_from(from, addr.parse().unwrap(), &all, method, "/mcp", body));
    String::from_utf8_lossy(&raw).into_owned()
}

/// The body of a raw response.
fn body_of(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

const PING: &str = r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#;

/// Issue 43: an `Mcp-Session-Id` works only from the address that opened
/// it (from another one it is unknown: the same 404), and a request whose
/// `Origin` is neither loopback nor named by `--allowed-origins` is
/// refused 403 without quoting it (MCP 2025-06-18).
#[test]
fn an_mcp_session_is_its_openers_and_foreign_origins_are_refused() {
    let (_guard, url) = mcp_http(&[
        "--server",
        "http://127.0.0.1:9",
        "--models-dir",
        "/nonexistent",
        "--allowed-origins",
        "https://app.example.com",
    ]);
    let addr = host(&url);
    let init = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    assert!(init.starts_with("HTTP/1.1 200"), "{init}");
    let session = session_id(&init).to_string();
    let stolen = raw_http_from("127.0.0.2", addr, "POST", Some(&session), &[], PING);
    let unknown = raw_http_from("127.0.0.2", addr, "POST", Some("not-a-session"), &[], PING);
    assert!(stolen.starts_with("HTTP/1.1 404"), "{stolen}");
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    assert_eq!(body_of(&stolen), body_of(&unknown), "a session of another address reads as unknown");
    let deleted = raw_http_from("127.0.0.2", addr, "DELETE", Some(&session), &[], "");
    assert!(deleted.starts_with("HTTP/1.1 404"), "another address cannot end it: {deleted}");
    let mine = raw_http(addr, "POST", Some(&session), PING).unwrap();
    assert!(mine.starts_with("HTTP/1.1 200") && mine.contains(r#""id":8"#), "{mine}");
    for (origin, allowed) in [
        ("http://evil.example", false),
        ("null", false),
        ("http://127.0.0.1.evil.example:80", false),
        ("http://localhost:5173", true),
        ("http://127.0.0.1:8080", true),
        ("https://app.example.com", true),
    ] {
        let r = raw_http_from("127.0.0.1", addr, "POST", None, &[("Origin", origin)], INITIALIZE);
        let want = if allowed { "HTTP/1.1 200" } else { "HTTP/1.1 403" };
        assert!(r.starts_with(want), "{origin}: {r}");
        assert!(allowed || !body_of(&r).contains("evil"), "{r}");
    }
}

/// Issue 43: `scd mcp` bound beyond loopback says once on stderr that it
/// has neither TLS nor authentication; on loopback it says nothing.
#[test]
fn mcp_warns_once_when_bound_beyond_loopback() {
    for (bind, warnings) in [("0.0.0.0:0", 1), ("127.0.0.1:0", 0)] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_scd"));
        let mut child = model_env(&mut cmd)
            .args(["--models-dir", "/nonexistent", "mcp", "--server", "http://127.0.0.1:9", "--http-addr", bind])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while !lines.next().expect("scd mcp printed its address").unwrap().starts_with("mcp on ") {}
        let mut stderr = child.stderr.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
        let n = err.lines().filter(|l| l.starts_with("warning: scd mcp serves HTTP on")).count();
        assert_eq!(n, warnings, "{bind}: {err}");
        assert!(warnings == 0 || err.contains("without TLS or authentication"), "{err}");
    }
}

/// Issue 43, error text over MCP: an unknown argument key is quoted only
/// when a plain word of at most 40 bytes, else named by its size.
#[test]
fn mcp_errors_quote_no_long_key_of_the_request() {
    let (_guard, url) = mcp_http(&["--server", "http://127.0.0.1:9", "--models-dir", "/nonexistent"]);
    let addr = host(&url);
    let init = raw_http(addr, "POST", None, INITIALIZE).unwrap();
    let session = session_id(&init).to_string();
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(raw_http(addr, "POST", Some(&session), note).unwrap().starts_with("HTTP/1.1 2"));
    let long = "k".repeat(5000);
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "compress_context",
        "arguments": {"task": "t", "budget": 200, "context": {"fields": [{"name": "notes", "content": "x"}]}, long.as_str(): 1}
    }});
    let r = raw_http(addr, "POST", Some(&session), &call.to_string()).unwrap();
    assert!(r.contains("unknown field `<5000-byte key>`"), "{}", &r[..r.len().min(600)]);
    assert!(!r.contains(&long[..41]), "the key was quoted");
}
