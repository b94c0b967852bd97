//! CLI hardening: strict context JSON, per-line errors in `compress --batch`,
//! arguments checked before the model loads, adversarial input.

use crate::{ready, root, scd, scratch};

fn fixture() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap()
}

#[test]
fn a_misspelled_confidential_key_is_an_error_not_a_leak() {
    if !ready() {
        return;
    }
    let dir = scratch("typo");
    let mut ctx = fixture();
    // the secret field with "confidental" (typo): today's bug sent its text
    let secret = ctx["fields"].as_array_mut().unwrap().iter_mut().find(|f| f["name"] == "api_keys").unwrap();
    let obj = secret.as_object_mut().unwrap();
    obj.remove("confidential");
    obj.insert("confidental".into(), true.into());
    let path = dir.join("ctx.json");
    std::fs::write(&path, ctx.to_string()).unwrap();
    let p = path.to_str().unwrap();
    let (ok, stdout, stderr) =
        scd(&["compress", "--task", "what is the gateway key", "--context", p, "--budget", "500"], "");
    assert!(!ok && !stdout.contains("sk_live_SECRET_4242"), "{stdout}");
    assert!(stderr.contains("context.fields[4].confidental: unknown field `confidental`"), "{stderr}");
    // a string "true" is not a boolean
    let mut ctx = fixture();
    ctx["fields"][4]["confidential"] = "true".into();
    std::fs::write(&path, ctx.to_string()).unwrap();
    let (ok, stdout, stderr) = scd(&["compress", "--task", "key", "--context", p, "--budget", "500"], "");
    assert!(!ok && !stdout.contains("sk_live_SECRET_4242"));
    assert!(
        stderr.contains("context.fields[4].confidential: invalid type: string \"true\", expected a boolean"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn batch_answers_good_lines_and_names_bad_ones() {
    if !ready() {
        return;
    }
    let dir = scratch("batch");
    let ctx = fixture();
    let good = serde_json::json!({"task": "which table stores charges", "context": ctx});
    let mut dup = ctx.clone();
    let first = dup["fields"][0].clone();
    dup["fields"].as_array_mut().unwrap().push(first);
    let lines = [
        good.to_string(),
        "{not json".to_string(),
        serde_json::json!({"task": "x", "context": dup, "budget": 50}).to_string(),
        serde_json::json!({"task": "x", "context": ctx, "budget": 50, "bugdet": 3}).to_string(),
        serde_json::json!({"task": "x", "context": ctx, "budget": -5}).to_string(),
        serde_json::json!({"task": "why do charges fail", "context": ctx, "budget": 30, "required": ["error_logs"]})
            .to_string(),
        String::new(),
        good.to_string(),
    ];
    let path = dir.join("batch.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    // --budget is the default for lines without one
    let (ok, stdout, stderr) = scd(&["compress", "--batch", path.to_str().unwrap(), "--budget", "60"], "");
    assert!(!ok);
    let out: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(out.len(), 7, "one answer per non-blank line: {stdout}");
    assert!(out[0]["totals"]["sent_tokens"].as_u64().unwrap() <= 60);
    assert_eq!(out[1]["line"], 2);
    assert!(out[1]["error"].as_str().unwrap().starts_with("key must be a string at line 1 column 2"), "{}", out[1]);
    assert_eq!(out[2]["line"], 3);
    assert!(out[2]["error"].as_str().unwrap().contains("context.fields[5].name: duplicate field name \"db_schema\""));
    assert!(out[3]["error"].as_str().unwrap().starts_with("bugdet: unknown field `bugdet`"), "{}", out[3]);
    assert!(out[4]["error"].as_str().unwrap().starts_with("budget: invalid value: integer `-5`"), "{}", out[4]);
    // "required" on the line wins over the (absent) flag; a budget too small for it is that line's error
    assert!(out[5]["error"].as_str().unwrap().starts_with("required fields need"), "{}", out[5]);
    assert!(out[6]["chunks"].is_array());
    assert!(stderr.contains("5 of 7 lines failed (exit status 5)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_fail_before_the_model_loads() {
    // a missing ONNX Runtime would fail the run later: these must fail first
    let no_ort = ["--ort-lib", "/nonexistent/libonnxruntime.so"];
    let cases: [(&[&str], &str); 11] = [
        (
            &["serve", "--addr", "127.0.0.1:0", "--second-hop-weight", "11"],
            "--second-hop-weight 11: must be between 0 and 10",
        ),
        (
            &["serve", "--addr", "127.0.0.1:0", "--log-size-weight", "11"],
            "--log-size-weight 11: must be between 0 and 10",
        ),
        (&["serve", "--addr", "127.0.0.1:0", "--follow-weight", "1.5"], "--follow-weight 1.5: must be between 0 and 1"),
        (
            &["serve", "--addr", "127.0.0.1:0", "--near-duplicate-penalty", "11"],
            "--near-duplicate-penalty 11: must be between 0 and 10",
        ),
        (
            &["serve", "--addr", "127.0.0.1:0", "--function-whole-share", "5"],
            "--function-whole-share 5: must be between 0 and 4",
        ),
        (
            &["serve", "--addr", "127.0.0.1:0", "--group-closure-share", "1.5"],
            "--group-closure-share 1.5: must be between 0 and 1",
        ),
        (&["serve", "--addr", "127.0.0.1:0", "--code-context-lines", "9"], "--code-context-lines 9: must be at most 8"),
        (&["compress", "--task", "t", "--context", "fixtures/agent_context.json", "--budget", "0"], "--budget"),
        (&["compress", "--task", "t", "--context", "fixtures/agent_context.json", "--budget", "-3"], "'-3'"),
        (
            &[
                "compress",
                "--task",
                "t",
                "--context",
                "fixtures/agent_context.json",
                "--budget",
                "9",
                "--threshold",
                "2",
            ],
            "--threshold: must be a cosine in [-1, 1], got 2",
        ),
        (&["compress", "--task", "t", "--context", "nope.json", "--budget", "9"], "--context nope.json: no such file"),
    ];
    for (args, want) in cases {
        let all: Vec<&str> = no_ort.iter().chain(args.iter()).copied().collect();
        let (ok, _, stderr) = scd(&all, "");
        assert!(!ok && stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("ONNX Runtime"), "{args:?} reached the model: {stderr}");
    }
}

#[test]
fn adversarial_contexts_get_clear_errors() {
    if !ready() {
        return;
    }
    let dir = scratch("adversarial");
    let path = dir.join("ctx.json");
    let p = path.to_str().unwrap();
    let run = |ctx: String| {
        std::fs::write(&path, ctx).unwrap();
        // a 2 KiB piece of one line is about 470 e5 tokens, with its header line
        scd(&["compress", "--task", "why", "--context", p, "--budget", "500"], "")
    };
    // 10k-deep nesting where a string belongs: a clear type error, no stack overflow
    let deep = format!("{{\"fields\": [{{\"name\": {}{}}}]}}", "[".repeat(10_000), "]".repeat(10_000));
    let (ok, _, stderr) = run(deep);
    assert!(!ok && stderr.contains("context.fields[0].name: invalid type: sequence, expected a string"), "{stderr}");
    // 10k-deep nesting inside a JSON field's content is chunked by lines and answered
    let nested = serde_json::json!({"fields": [{"name": "doc", "kind": "json",
        "content": format!("{}{}", "[".repeat(2_000), "]".repeat(2_000))}]});
    let (ok, _, stderr) = run(nested.to_string());
    assert!(ok, "{stderr}");
    // a NUL byte
    let nul = serde_json::json!({"fields": [{"name": "a", "content": "ok\u{0}x"}]}).to_string();
    let (ok, _, stderr) = run(nul);
    assert!(!ok && stderr.contains("context.fields[0].content: contains a NUL byte at offset 2"), "{stderr}");
    // a field over the per-field byte limit
    let big = serde_json::json!({"fields": [{"name": "a", "content": "word ".repeat(1 << 20)}]}).to_string();
    let (ok, _, stderr) = run(big);
    assert!(!ok && stderr.contains("context.fields[0].content: 5242880 bytes, over the limit 4194304"), "{stderr}");
    // a long single-line field (no sentence end) is cut into pieces, so
    // some of it fits the budget (the megabyte case is a chunker unit test)
    let line = serde_json::json!({"fields": [{"name": "a", "content": "pool timeout ".repeat(5_000)}]}).to_string();
    let (ok, stdout, stderr) = run(line);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let sent = v["totals"]["sent_tokens"].as_u64().unwrap();
    assert!(sent > 0 && sent <= 500, "{sent}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_grpc_requests_are_invalid_argument_and_nothing_else_is_lost() {
    use scd_service::grpc::pb;
    use tonic::Code;
    if !ready() {
        return;
    }
    let server = crate::grpc::start(&[]);
    let mut c = crate::grpc::client(&server).await;
    let open = c
        .open_session(pb::OpenSessionRequest { compress: Some(crate::grpc::compress_req(200, "")) })
        .await
        .unwrap()
        .into_inner();
    let tiny = |i: usize| pb::Field {
        name: format!("f{i}"),
        kind: pb::FieldKind::Prose as i32,
        content: "x.".into(),
        confidential: false,
    };
    let with = |f: &dyn Fn(&mut pb::CompressRequest)| {
        let mut r = crate::grpc::compress_req(100, "");
        f(&mut r);
        r
    };
    let cases: Vec<(pb::CompressRequest, &str)> = vec![
        (with(&|r| r.fields = (0..100_000).map(tiny).collect()), "fields: 100000 fields, over the limit 256"),
        (with(&|r| r.fields[0].content.push('\0')), "context.fields[0].content: contains a NUL byte at offset"),
        (
            with(&|r| r.task.as_mut().unwrap().constraints = vec!["be brief".into(); 10_000]),
            "task.constraints: 10000 constraints, over the limit 256",
        ),
        (with(&|r| r.fields[0].kind = 0), "fields[0].kind: required"),
        (with(&|r| r.requirement.as_mut().unwrap().max_context_tokens = 0), "max_context_tokens: must be at least 1"),
        (with(&|r| r.session_id = "bad id\n".into()), "session_id: must be 1 to 256 printable ASCII characters"),
    ];
    for (req, want) in cases {
        let err = c.compress(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{want}: {err:?}");
        assert!(err.message().starts_with(want), "{:?} does not start with {want:?}", err.message());
    }
    let big = "word ".repeat(300_000);
    let err = c
        .count_tokens(pb::CountTokensRequest { texts: vec!["ok".into(), big], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "texts[1]: 1500000 bytes, over the limit 1048576 (--max-text-bytes)");
    // the session opened before is intact
    let more = c
        .request_context(pb::ContextRequest {
            session_id: open.session_id,
            session_token: open.session_token,
            specific_question: "which table stores charges".into(),
            current_confidence: 0.2,
            ..Default::default()
        })
        .await;
    assert!(more.is_ok(), "{more:?}");
}

#[test]
fn compress_explain_prints_a_table_and_json_carries_it_only_when_asked() {
    if !ready() {
        return;
    }
    let base = [
        "compress",
        "--task",
        "Why are customer charges failing at checkout?",
        "--context",
        "fixtures/agent_context.json",
        "--budget",
        "150",
    ];
    let with_stderr = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let (ok, stdout, stderr) = scd(&args, "");
        assert!(ok, "{extra:?}: {stderr}");
        assert!(!stdout.contains("sk_live_SECRET_4242"), "confidential content leaked");
        (stdout, stderr)
    };
    let with = |extra: &[&str]| with_stderr(extra).0;
    let explained: serde_json::Value = serde_json::from_str(with(&["--explain"]).trim()).unwrap();
    // text: stdout is exactly what the receiver pastes; the sizes and the
    // table (header, a row per sent chunk, the dropped ones) go to stderr
    let (pasted, text) = with_stderr(&["--explain", "--format", "text"]);
    assert_eq!(pasted.strip_suffix('\n').unwrap(), explained["text"].as_str().unwrap());
    let lines: Vec<&str> = text.lines().collect();
    let sent: Vec<&str> = explained["chunks"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert!(!sent.is_empty(), "{text}");
    let why =
        lines.iter().position(|l| l.starts_with("-- why: score = dense_z + ")).unwrap_or_else(|| panic!("{text}"));
    assert!(lines[why].contains("tokens in e5"), "{}", lines[why]);
    let header: Vec<&str> = lines[why + 1].split_whitespace().collect();
    // the second stage's column (after hop) only when it lifted a sent chunk
    let lifted = explained["explanation"]["selected"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["rerank_lift"].as_f64().unwrap_or(0.0) != 0.0);
    let mut want =
        vec!["id", "order", "score", "dense_z", "lex_z", "group", "link", "hop", "lead", "tokens", "chunker"];
    if lifted {
        want.insert(8, "rerank");
        assert!(lines[why].contains(" + rerank;"), "{}", lines[why]);
    }
    assert_eq!(header, want);
    let cols = want.len();
    let dropped_at =
        lines.iter().position(|l| l.starts_with("-- dropped: ")).unwrap_or_else(|| panic!("no dropped line: {text}"));
    let rows: Vec<&str> = lines[why + 2..dropped_at].iter().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(rows, sent, "one row per sent chunk, in reading order");
    for row in &lines[why + 2..dropped_at] {
        let cells: Vec<&str> = row.split_whitespace().collect();
        let want = if cells[0].starts_with("error_logs#") { "log" } else { cells[cols - 1] };
        assert!(cells.len() == cols && cells[cols - 1] == want && cells[cols - 1] != "-", "chunker column: {row}");
    }
    let mut orders: Vec<usize> =
        lines[why + 2..dropped_at].iter().map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap()).collect();
    orders.sort_unstable();
    assert_eq!(orders, (1..=sent.len()).collect::<Vec<_>>());
    assert!(lines[dropped_at].contains("best") && lines.len() > dropped_at + 1, "{text}");
    assert!(
        lines[dropped_at + 1..].iter().any(|l| l.contains("out of budget") || l.contains("near-duplicate of")),
        "{text}"
    );
    // without --explain: no table
    let (plain, sizes) = with_stderr(&["--format", "text"]);
    assert!(!sizes.contains("-- why:") && !sizes.contains("-- dropped:"), "{sizes}");
    assert!(!plain.contains("-- ") && !plain.contains("[error_logs#"), "only the context: {plain}");

    // json: "explanation" only with --explain
    let json = |extra: &[&str]| -> serde_json::Value { serde_json::from_str(with(extra).trim()).unwrap() };
    let v = json(&[]);
    assert!(v.get("explanation").is_none(), "{v}");
    assert_eq!(v["totals"]["tokenizer"], "e5");
    let v = json(&["--explain"]);
    let ex = &v["explanation"];
    let ids: Vec<&str> = ex["selected"].as_array().unwrap().iter().map(|w| w["id"].as_str().unwrap()).collect();
    let sent: Vec<&str> = v["chunks"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, sent);
    let w = ex["lexical_weight"].as_f64().unwrap();
    for s in ex["selected"].as_array().unwrap() {
        let f = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} in {s}"));
        let sum =
            f("dense_z") + w * f("lexical_z") + f("group_lift") + f("link_lift") + f("hop_lift") + f("rerank_lift");
        assert!((sum - f("score")).abs() < 1e-3, "{s}");
    }
    assert!(!ex["dropped"].as_array().unwrap().is_empty(), "{ex}");
}

#[test]
fn compress_explain_names_a_container_header_left_out_as_structure_only() {
    if !ready() {
        return;
    }
    let src = std::fs::read_to_string(crate::root().join("fixtures/code/ledger.rs")).unwrap();
    let ctx = serde_json::json!({"fields": [{"name": "src/ledger.rs", "kind": "code", "content": src, "confidential": false}]});
    let run = |format: &str| {
        let args = [
            "compress",
            "--task",
            "Freeze an account so that no posting can touch it",
            "--context",
            "-",
            "--budget",
            "120",
            "--explain",
            "--format",
            format,
        ];
        let (ok, stdout, stderr) = scd(&args, &ctx.to_string());
        assert!(ok, "{stderr}");
        (stdout, stderr)
    };
    let v: serde_json::Value = serde_json::from_str(run("json").0.trim()).unwrap();
    let ex = &v["explanation"];
    let structure: Vec<&str> = ex["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "structure_only")
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert!(!structure.is_empty(), "120 tokens leave some impl unsent: {ex}");
    // a sent header or closing line came with a method of its impl
    let chunks = v["chunks"].as_array().unwrap();
    let text_of =
        |c: &serde_json::Value| &src[c["span"][0].as_u64().unwrap() as usize..c["span"][1].as_u64().unwrap() as usize];
    let sent_fn = chunks.iter().any(|c| text_of(c).contains("pub fn freeze"));
    assert!(sent_fn, "the method asked for is sent: {v}");
    for (c, w) in chunks.iter().zip(ex["selected"].as_array().unwrap()) {
        let t = text_of(c);
        if t.starts_with("impl ") || t == "}" {
            assert_eq!(w["by_closure"], true, "structure sent alone: {t:?}");
        }
    }
    assert!(run("text").1.contains("structure only (sent with a member of its group)"));
}

#[test]
fn compress_counts_the_budget_in_the_named_tokenizer() {
    if !ready() {
        return;
    }
    let run = |tok: &str, format: &str| {
        scd(
            &[
                "compress",
                "--task",
                "Why are customer charges failing at checkout?",
                "--context",
                "fixtures/agent_context.json",
                "--budget",
                "120",
                "--budget-tokenizer",
                tok,
                "--format",
                format,
            ],
            "",
        )
    };
    let (ok, stdout, stderr) = run("o200k", "json");
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["totals"]["tokenizer"], "o200k");
    let text = v["text"].as_str().unwrap();
    let sent = tiktoken_rs::o200k_base_singleton().encode_ordinary(text).len();
    assert!(sent <= 120 && !text.is_empty(), "{sent} o200k tokens sent");
    assert_eq!(v["totals"]["sent_tokens"].as_u64().unwrap() as usize, sent);
    let asked = v["totals"]["context_tokens"].as_f64().unwrap() / 120.0;
    assert!((v["totals"]["requested_ratio"].as_f64().unwrap() - asked).abs() < 1e-3 * asked, "{}", v["totals"]);
    // text: the ratios asked and achieved, in the tokenizer that counted them
    let (ok, stdout, stderr) = run("o200k", "text");
    assert!(ok, "{stderr}");
    // stdout is the text alone, within the budget; the sizes go to stderr
    let sent = tiktoken_rs::o200k_base_singleton().encode_ordinary(stdout.strip_suffix('\n').unwrap()).len();
    assert!(sent <= 120, "{sent} o200k tokens printed");
    assert!(
        stderr.lines().any(|l| l.starts_with("-- ") && l.contains("o200k tokens sent") && l.contains("x asked")),
        "{stderr}"
    );
    // a tokenizer.json by path, reported under its path
    let path = root().join("models/out/e5-small/tokenizer.json").display().to_string();
    let (ok, stdout, stderr) = run(&path, "json");
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["totals"]["tokenizer"], path.as_str());
    // an unknown name fails, names the flag and the choices, and writes nothing
    let (ok, stdout, stderr) = run("nope", "json");
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("--budget-tokenizer: unknown tokenizer \"nope\""), "{stderr}");
    assert!(stderr.contains("e5, o200k, cl100k") && stderr.contains("tokenizer.json"), "{stderr}");
}

/// `scd demo`'s first answer (before any adaptive request) holds the log
/// line that explains the failing charges, and the whole demo never shows
/// the confidential field.
#[test]
fn demo_first_answer_has_the_pool_exhausted_log_line() {
    if !ready() {
        return;
    }
    let (ok, stdout, stderr) = scd(&["demo"], "");
    assert!(ok, "{stderr}");
    let first = stdout.split("receiver asks").next().unwrap();
    assert!(
        first.contains("ERROR payments::db: connection pool exhausted (max=32) in charge_card"),
        "first answer lacks the log line:\n{first}"
    );
    assert!(first.contains("fn charge_card"), "{first}");
    assert!(!stdout.contains("sk_live_SECRET_4242"));
}

/// `scd compress` in a new process finds the embeddings an earlier one
/// stored in the persistent cache: the same call computes none and prints
/// the same text; a context with one more field computes only its chunks.
#[test]
fn a_second_process_embeds_only_what_the_persistent_cache_lacks() {
    if !ready() {
        return;
    }
    let dir = crate::scratch("embedding-cache");
    let db = dir.join("embeddings.redb");
    let ctx = std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap();
    let run = |ctx: &str| {
        let args = ["--embedding-cache", db.to_str().unwrap(), "compress", "--task", "Why are charges failing?"];
        let args: Vec<&str> =
            args.iter().copied().chain(["--context", "-", "--budget", "150", "--format", "text"]).collect();
        let (ok, stdout, stderr) = scd(&args, ctx);
        assert!(ok, "{stderr}");
        let line = stderr.lines().find(|l| l.starts_with("-- embeddings: ")).unwrap_or_else(|| panic!("{stderr}"));
        let n: Vec<usize> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        (stdout, n[0], n[1])
    };
    let (first, computed, from_disk) = run(&ctx);
    assert!(computed > 5 && from_disk == 0, "{computed} {from_disk}");
    assert!(db.is_file());
    let (second, computed2, from_disk2) = run(&ctx);
    assert_eq!((computed2, from_disk2), (0, computed), "the task and every chunk from the file");
    assert_eq!(second, first);
    let mut v: serde_json::Value = serde_json::from_str(&ctx).unwrap();
    v["fields"].as_array_mut().unwrap().push(serde_json::json!({"name": "new_notes", "kind": "prose",
        "content": "The retry storm started after the deploy at noon. Nobody paged the on-call engineer."}));
    let (_, computed3, from_disk3) = run(&v.to_string());
    assert!((1..=3).contains(&computed3) && from_disk3 >= computed, "only the new field: {computed3} {from_disk3}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cache file corrupted by seeded 16-byte flips never fails `scd
/// compress`: each run exits 0 with the same text (redb's panics are
/// contained; a file it finds corrupt is moved aside, and the next run
/// starts a fresh one).
#[test]
fn compress_goes_on_over_a_corrupted_embedding_cache_file() {
    if !ready() {
        return;
    }
    let dir = crate::scratch("embedding-cache-corrupt");
    let db = dir.join("embeddings.redb");
    let ctx = std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap();
    let run = || {
        let args = ["--embedding-cache", db.to_str().unwrap(), "compress", "--task", "Why are charges failing?"];
        let args: Vec<&str> =
            args.iter().copied().chain(["--context", "-", "--budget", "150", "--format", "text"]).collect();
        let (ok, stdout, stderr) = scd(&args, &ctx);
        assert!(ok, "{stderr}");
        stdout
    };
    let first = run();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..4 {
        if let Ok(mut bytes) = std::fs::read(&db) {
            for _ in 0..4 {
                let at = (next() as usize) % (bytes.len() - 16);
                for b in &mut bytes[at..at + 16] {
                    *b ^= (next() as u8) | 1;
                }
            }
            std::fs::write(&db, bytes).unwrap();
        }
        assert_eq!(run(), first, "round {round}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scd context` builds the context from files (name: the path, kind: the
/// extension; hidden files, target/ and binaries left out; confidential by
/// pattern), and `scd compress --files` compresses them in one command.
#[test]
fn files_become_a_context_and_compress_in_one_command() {
    if !ready() {
        return;
    }
    let dir = crate::scratch("context-files");
    let w = |rel: &str, body: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    w("src/pool.rs", b"pub fn acquire(pool: &Pool) -> Conn {\n    pool.get().expect(\"pool exhausted\")\n}\n");
    w("notes.md", b"# Outage\n\nCharges failed because the database pool was exhausted.\n");
    w("logs/app.log", b"2026-11-30T00:12:07Z ERROR payments: connection pool exhausted\n");
    w("prod.env", b"STRIPE_KEY=sk_live_SECRET_4242\n");
    w(".hidden/x.rs", b"fn hidden() {}\n");
    w("target/debug/y.rs", b"fn built() {}\n");
    w("blob.bin", &[0u8, 159, 146, 150]);
    let d = dir.to_str().unwrap();
    let (ok, stdout, stderr) = scd(&["context", d, "--confidential", "*.env"], "");
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let fields: Vec<(String, String, bool)> = v["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap().trim_start_matches(d).trim_start_matches('/').to_string();
            (name, f["kind"].as_str().unwrap().to_string(), f["confidential"].as_bool().unwrap())
        })
        .collect();
    let want = [
        ("logs/app.log", "log", false),
        ("notes.md", "markdown", false),
        ("prod.env", "prose", true),
        ("src/pool.rs", "code", false),
    ];
    let want: Vec<(String, String, bool)> = want.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), *c)).collect();
    assert_eq!(fields, want);
    assert!(stderr.contains("blob.bin: not UTF-8 text, skipped"), "{stderr}");
    // a quoted pattern, and one command from files to the context to paste
    let pattern = format!("{d}/**/*.rs");
    let (ok, stdout, stderr) = scd(
        &[
            "compress",
            "--files",
            d,
            "--confidential",
            "*.env",
            "--task",
            "why did charges fail?",
            "--budget",
            "60",
            "--format",
            "text",
        ],
        "",
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("pool") && !stdout.contains("sk_live_SECRET_4242"), "{stdout}");
    let (ok, stdout, _) = scd(&["context", &pattern], "");
    assert!(ok && stdout.contains("pool.rs") && !stdout.contains("hidden"), "{stdout}");
    let (ok, _, stderr) = scd(&["context", &format!("{d}/nope/*.rs")], "");
    assert!(!ok && stderr.contains("the pattern matches no file"), "{stderr}");
    // the common mistake: a bare array of fields
    w("bare.json", br#"[{"name": "a", "content": "sk_live_SECRET_4242"}]"#);
    let bare = dir.join("bare.json");
    let (ok, _, stderr) = scd(&["compress", "--task", "t", "--context", bare.to_str().unwrap(), "--budget", "9"], "");
    assert!(!ok && stderr.contains("a bare array of 1 fields; wrap it as {\"fields\": [...]}"), "{stderr}");
    assert!(!stderr.contains("sk_live"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A folder walked as ripgrep walks one (issue 42, wall 3): `.gitignore`
/// obeyed, `--exclude` and `--hidden` work, a file over the per-field limit
/// is skipped with one line (the run goes on), and a big log keeps its tail
/// from a line start, its name saying from which line.
#[test]
fn a_repository_walks_as_ripgrep_does_and_oversized_files_do_not_stop_the_run() {
    let dir = crate::scratch("context-walk");
    let w = |rel: &str, body: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    w(".gitignore", b"build/\n*.tmp\n");
    w("src/lib.rs", b"pub fn pool() {}\n");
    w("build/out.rs", b"fn generated() {}\n");
    w("notes.tmp", b"scratch\n");
    w("Cargo.lock", b"# lock\n");
    w(".github/ci.yml", b"on: push\n");
    w(".git/config", b"[remote \"origin\"]\n\turl = https://token@example.com/r.git\n");
    // 5 MiB of JSON, over the 4 MiB per field
    let big = format!("[{}1]", "1,".repeat(5 << 19));
    w("models/tokenizer.json", big.as_bytes());
    // 5 MiB of log lines; the last one is the error
    let mut log = String::new();
    let mut n = 0;
    while log.len() < 5 << 20 {
        n += 1;
        log.push_str(&format!("2026-12-05T10:00:00Z INFO request {n} served in 3 ms\n"));
    }
    log.push_str("2026-12-05T10:00:01Z ERROR disk full: No space left on device\n");
    w("logs/app.log", log.as_bytes());
    let d = dir.to_str().unwrap();
    let names = |stdout: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(stdout).unwrap();
        v["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().trim_start_matches(d).trim_start_matches('/').to_string())
            .collect()
    };
    let (ok, stdout, stderr) = scd(&["context", d, "--exclude", "*.lock"], "");
    assert!(ok, "{stderr}");
    let fields = names(&stdout);
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert_eq!(fields[1], "src/lib.rs");
    // the log's tail: from a line start, within the limit, the error kept
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let tail = v["fields"][0]["content"].as_str().unwrap();
    let first = tail.lines().next().unwrap();
    assert!(first.starts_with("2026-12-05T10:00:00Z INFO request "), "{first}");
    assert!(tail.len() <= 4 << 20 && tail.ends_with("No space left on device\n"));
    let from: usize = first.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(fields[0], format!("logs/app.log (from line {from})"));
    assert!(stderr.contains("logs/app.log: 5.0 MiB, over the limit of 4.0 MiB per field; kept its last"), "{stderr}");
    let skipped: Vec<&str> = stderr.lines().filter(|l| l.contains("tokenizer.json")).collect();
    assert_eq!(
        skipped,
        [format!("-- {d}/models/tokenizer.json: 5.0 MiB, over the limit of 4.0 MiB per field; skipped")]
    );
    // --hidden brings .github; --no-ignore brings build/ and notes.tmp too
    let (ok, stdout, _) = scd(&["context", d, "--hidden", "--exclude", "*.lock", "--exclude", "logs/**"], "");
    assert!(ok);
    let fields = names(&stdout);
    assert!(fields.contains(&".github/ci.yml".to_string()) && fields.contains(&".gitignore".to_string()), "{fields:?}");
    assert!(!fields.iter().any(|f| f.starts_with(".git/")), "git's own files are never context: {fields:?}");
    let (ok, stdout, _) = scd(&["context", d, "--no-ignore", "--log-tail", "100"], "");
    assert!(ok);
    let fields = names(&stdout);
    for f in ["build/out.rs", "notes.tmp", "Cargo.lock"] {
        assert!(fields.contains(&f.to_string()), "{f} in {fields:?}");
    }
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let log = v["fields"].as_array().unwrap().iter().find(|f| f["name"].as_str().unwrap().contains("app.log")).unwrap();
    assert_eq!(log["content"].as_str().unwrap(), "2026-12-05T10:00:01Z ERROR disk full: No space left on device\n");
    let (ok, _, stderr) = scd(&["context", d, "--exclude", "a{b"], "");
    assert!(!ok && stderr.contains("--exclude a{b: not a valid glob"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
