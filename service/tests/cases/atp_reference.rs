//! Wire compatibility with the ATP reference (github.com/rajamohan1950/
//! AgentTransportProtocol proto/atp/v1 at 3dec720, vendored unchanged in
//! `service/tests/atp-reference/`), checked by another protobuf
//! implementation: Python protobuf + grpcio from `.tools/venv`.
//! (a) descriptor level: every reference message, field, enum value and rpc is
//! unchanged in our `proto/atp/v1`; (b) on the wire: a client generated from
//! the reference protos handshakes with a real `scd atp agent` and is refused
//! where it must be.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The venv's Python when it imports `modules`; otherwise a skip (a failure under CI).
pub(crate) fn python_with(modules: &str) -> Option<PathBuf> {
    let python = crate::root().join(".tools/venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::skip(&format!("{} cannot import {modules}; run models/setup.sh", python.display()));
        return None;
    }
    Some(python)
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn compat(python: &Path, ours: Option<&Path>) -> (bool, String, String) {
    let mut cmd = Command::new(python);
    cmd.arg(crate::root().join("service/tests/py/atp_proto_compat.py"));
    if let Some(dir) = ours {
        cmd.arg("--ours").arg(dir);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = text(&out);
    (out.status.success(), stdout, stderr)
}

#[test]
fn our_protos_keep_every_reference_message_field_and_rpc() {
    let Some(python) = python_with("grpc_tools") else { return };
    let (ok, stdout, stderr) = compat(&python, None);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("compatible: every reference message"), "{stdout}");
    // SCD's additions are listed, e.g. the heartbeat signature the reference lacks
    assert!(stdout.contains("ours adds: field .atp.v1.Heartbeat.signature = 10 (bytes)"), "{stdout}");
    assert!(stdout.contains("ours adds: message .atp.v1.AtpMessage"), "{stdout}");

    // the check can fail: a copy of our protos with one reference field retyped,
    // one enum value renumbered, and AtpMessage's nonce moved inside its oneof's
    // tag range (prost would then sign in another order than other libraries)
    let dir = crate::scratch("atp-compat");
    let v1 = dir.join("atp/v1");
    std::fs::create_dir_all(&v1).unwrap();
    for entry in std::fs::read_dir(crate::root().join("proto/atp/v1")).unwrap() {
        let path = entry.unwrap().path();
        let mut src = std::fs::read_to_string(&path).unwrap();
        for (from, to) in [
            ("uint64 sequence = 2;", "uint32 sequence = 2;"),
            ("TASK_TYPE_ANALYSIS = 2;", "TASK_TYPE_ANALYSIS = 7;"),
            // AtpMessage: a plain field numbered inside the oneof's tag range
            ("uint64 nonce = 8;\n  oneof payload {", "uint64 nonce = 12;\n  oneof payload {"),
            ("ContractAccept contract = 12;", "ContractAccept contract = 9;"),
        ] {
            src = src.replace(from, to);
        }
        std::fs::write(v1.join(path.file_name().unwrap()), src).unwrap();
    }
    let (ok, stdout, stderr) = compat(&python, Some(&dir));
    assert!(!ok, "the altered copy passed:\n{stdout}\n{stderr}");
    for want in [
        "DIFFERENCE: field .atp.v1.Heartbeat.sequence = 2: type 'TYPE_UINT64' in the reference, 'TYPE_UINT32' in ours",
        "DIFFERENCE: enum value .atp.v1.TaskType.TASK_TYPE_ANALYSIS: number 2 in the reference, 7 in ours",
        "SIGNING ORDER: oneof .atp.v1.AtpMessage.payload: fields ['nonce'] numbered between its tags 9..20",
        "INCOMPATIBLE: 2 difference(s) from the reference, 1 signing-order problem(s)",
    ] {
        assert!(stdout.contains(want), "{want:?} not in:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check names `atp_reference_client.py` prints, all of which must pass.
const CHECKS: [&str; 9] = [
    "client_identity",
    "good_probe_gets_signed_offer",
    "unsigned_probe_refused",
    "tampered_probe_refused",
    "probe_signed_by_another_key_refused",
    "stale_probe_refused",
    "replayed_probe_refused",
    "reference_heartbeat_unsigned_refused",
    "reference_route_query_unsigned_refused",
];

#[test]
fn reference_client_gets_a_verifiable_offer_and_the_right_refusals() {
    let Some(python) = python_with("grpc, grpc_tools, nacl") else { return };
    let dir = crate::scratch("atp-reference-agent");
    // `spawn_agent` reads its ready line {"event":"ready","did":…,"addr":…}
    let agent = crate::atp::spawn_agent(&dir, &["--capability", "code_generation:0.9:800:0.02"]);
    let agent_stderr = || std::fs::read_to_string(dir.join("agent.stderr")).unwrap_or_default();
    let (did, addr) = (agent.did.clone(), agent.addr.clone());
    assert!(did.starts_with("did:key:z6Mk"), "ready.did is not an Ed25519 did:key: {did}");
    assert!(addr.starts_with("127.0.0.1:"), "ready.addr: {addr}");

    let out = Command::new(&python)
        .arg(crate::root().join("service/tests/py/atp_reference_client.py"))
        .args([&addr, &did])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    drop(agent);
    let report = format!("client stdout:\n{stdout}\nclient stderr:\n{stderr}\nagent stderr:\n{}", agent_stderr());
    assert!(out.status.success(), "{report}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON ({e})\n{report}")))
        .collect();
    for name in CHECKS {
        let line = lines.iter().find(|l| l["check"] == name);
        assert!(line.is_some_and(|l| l["ok"] == true), "check {name} missing or failed\n{report}");
    }
    let offer = &lines.iter().find(|l| l["check"] == "good_probe_gets_signed_offer").unwrap()["detail"];
    assert_eq!(offer["signature_verified"], true, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
