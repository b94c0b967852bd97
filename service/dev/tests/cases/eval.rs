//! `scd-dev eval` end to end with the real default model.

use crate::{ready, scd_dev, scratch};

/// `scd-dev eval` reports the agent fixture's recall as the demo sees it.
#[test]
fn eval_reports_the_agent_fixture_recall() {
    if !ready() {
        return;
    }
    let tmp = scratch("eval-fixture");
    let dir = tmp.path();
    let data = dir.join("code.jsonl");
    let content = "use std::fmt;\n\n/// Adds.\npub fn add(a: u8, b: u8) -> u8 {\n    a + b\n}\n\npub fn sub(a: u8, b: u8) -> u8 {\n    a - b\n}\n";
    let rec = serde_json::json!({
        "id": "c-1/src/lib.rs::sub", "crate": "c-1", "task": "Subtracts two bytes",
        "context": {"fields": [{"name": "c-1/src/lib.rs", "kind": "code", "content": content, "confidential": false}]},
        "gold": "pub fn sub(a: u8, b: u8) -> u8 {\n    a - b\n}",
    });
    std::fs::write(&data, format!("{rec}\n")).unwrap();
    let report = dir.join("r.json");
    let (ok, stdout, stderr) = scd_dev(
        &[
            "eval",
            "--dataset",
            "code",
            "--path",
            data.to_str().unwrap(),
            "--budgets",
            "0.5",
            "--report",
            report.to_str().unwrap(),
            "--plot",
            dir.join("p.svg").to_str().unwrap(),
        ],
        "",
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("agent fixture"), "{stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let f = &r["agent_fixture"];
    assert_eq!(f["gold"], 4);
    assert_eq!(f["found"], 4, "{f}");
    assert_eq!(f["confidential_leaked"], false);
    let methods: Vec<&str> = r["results"].as_array().unwrap().iter().map(|x| x["method"].as_str().unwrap()).collect();
    assert_eq!(methods, vec!["scd", "dense", "bm25", "lead", "random"]);
}

/// The `logs-pool` case: "Why are requests failing?" over 40 INFO lines,
/// then the pool-exhausted ERROR (line 41, the gold), then `tail`.
fn pool_case(tail: &str) -> serde_json::Value {
    let mut log = String::new();
    for i in 0..40 {
        log.push_str(&format!("2024-05-01 10:{i:02}:00 INFO worker {i} handled request in {} ms\n", 10 + i));
    }
    log.push_str("2024-05-01 10:41:00 ERROR db: connection pool exhausted (32 of 32 in use)\n");
    log.push_str(tail);
    serde_json::json!({
        "id": "logs-pool", "kind": "logs", "task": "Why are requests failing?",
        "context": {"fields": [{"name": "app.log", "kind": "log", "content": log}]},
        "gold": [{"field": "app.log", "ranges": [[41, 41]]}],
    })
}

/// `--embedding-store`: a second run over the same cases reads every
/// embedding from the store, computes none, and reports the same figures.
#[test]
fn a_second_agent_eval_with_a_store_embeds_nothing_and_reports_the_same() {
    if !ready() {
        return;
    }
    let tmp = scratch("eval-store");
    let dir = tmp.path();
    let data = dir.join("logs.jsonl");
    let rec = pool_case("2024-05-01 10:42:00 INFO health check ok\n");
    let rec2 = serde_json::json!({
        "id": "logs-health", "kind": "logs", "task": "Is the health check passing?",
        "context": rec["context"],
        "gold": [{"field": "app.log", "ranges": [[42, 42]]}],
    });
    std::fs::write(&data, format!("{rec}\n{rec2}\n")).unwrap();
    let store = dir.join("emb.redb");
    let run = |name: &str| -> serde_json::Value {
        let report = dir.join(format!("{name}.json"));
        let (ok, stdout, stderr) = scd_dev(
            &[
                "eval",
                "--dataset",
                "agent",
                "--path",
                data.to_str().unwrap(),
                "--budgets",
                "0.3,0.1",
                "--sweep",
                "severity_weight=0",
                "--folds",
                "2",
                "--embedding-store",
                store.to_str().unwrap(),
                "--report",
                report.to_str().unwrap(),
                "--plot",
                dir.join(format!("{name}.svg")).to_str().unwrap(),
            ],
            "",
        );
        assert!(ok, "{stderr}");
        assert!(stdout.contains("texts embedded:"), "{stdout}");
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
    };
    let first = run("first");
    assert!(store.exists(), "the store file is written");
    assert!(first["texts_embedded"].as_u64().unwrap() > 0, "{}", first["texts_embedded"]);
    let second = run("second");
    assert_eq!(second["texts_embedded"], 0, "every embedding read from the store");
    assert_eq!(first["results"], second["results"]);
    assert_eq!(first["cross_validation"], second["cross_validation"]);
}

/// `--dataset agent --adaptive`: per case, setting and budget, the task
/// asked again as a follow-up and another case's task asked in a second
/// session; the floor (e5-small's 0.80) withholds the other case's filler
/// that no floor (`more_min_relevance=-1`) sends.
#[test]
fn agent_follow_up_probes_report_what_an_off_topic_question_gets() {
    if !ready() {
        return;
    }
    let tmp = scratch("eval-agent-follow-ups");
    let dir = tmp.path();
    let data = dir.join("cases.jsonl");
    let garden = "Tomatoes need six hours of sun a day. Water them at the base in the morning.\n\n\
                  Roses are pruned in late winter, just above an outward bud.\n\n\
                  Compost is ready when it is dark and crumbly and smells of earth.";
    let logs = pool_case("");
    let docs = serde_json::json!({
        "id": "docs-roses", "kind": "docs", "task": "When should roses be pruned?",
        "context": {"fields": [{"name": "garden.md", "kind": "prose", "content": garden}]},
        "gold": [{"field": "garden.md", "ranges": [[3, 3]]}],
    });
    // a second question about the same notes
    let compost = serde_json::json!({
        "id": "docs-compost", "kind": "docs", "task": "How can I tell that my compost is ready to use?",
        "context": {"fields": [{"name": "garden.md", "kind": "prose", "content": garden}]},
        "gold": [{"field": "garden.md", "ranges": [[5, 5]]}],
    });
    std::fs::write(&data, format!("{logs}\n{docs}\n{compost}\n")).unwrap();
    let (report, each) = (dir.join("r.json"), dir.join("each.jsonl"));
    let (ok, stdout, stderr) = scd_dev(
        &[
            "eval",
            "--dataset",
            "agent",
            "--adaptive",
            "--path",
            data.to_str().unwrap(),
            "--budgets",
            "0.5",
            "--sweep",
            "more_min_relevance=-1",
            "--report",
            report.to_str().unwrap(),
            "--plot",
            dir.join("p.svg").to_str().unwrap(),
            "--per-example",
            each.to_str().unwrap(),
        ],
        "",
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("off_empty"), "{stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["mode"], "follow-ups");
    let rows = r["results"].as_array().unwrap();
    let keys: Vec<(&str, &str)> =
        rows.iter().map(|x| (x["kind"].as_str().unwrap(), x["method"].as_str().unwrap())).collect();
    let (on, off) = ("scd", "scd[more_min_relevance=-1]");
    assert_eq!(keys, [("logs", on), ("logs", off), ("docs", on), ("docs", off), ("all", on), ("all", off)]);
    for x in rows {
        assert!(x["with_follow_up_kept"].as_f64().unwrap() >= x["first_kept"].as_f64().unwrap(), "{x}");
    }
    let probes: Vec<serde_json::Value> =
        std::fs::read_to_string(&each).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let probe = |id: &str, method: &str| probes.iter().find(|p| p["id"] == id && p["method"] == method).unwrap();
    // the garden notes asked why requests fail: filler without a floor, nothing with it
    assert!(probe("docs-roses", off)["off_topic_tokens"].as_u64() > Some(0), "{probes:?}");
    let floored = probe("docs-roses", on);
    assert_eq!(floored["off_topic_tokens"], 0, "{floored}");
    assert!(floored["off_topic_reason"].as_str().unwrap().contains("below its floor 0.8"), "{floored}");
    // the compost question after the roses answer brings the compost line; the log has no second question
    assert_eq!(floored["second_id"], "docs-compost", "{floored}");
    assert_eq!((floored["second_first_kept"].as_f64(), floored["second_kept"].as_f64()), (Some(0.0), Some(1.0)));
    assert!(probe("logs-pool", on).get("second_id").is_none(), "{probes:?}");
    let docs_row = rows.iter().find(|x| x["kind"] == "docs" && x["method"] == on).unwrap();
    assert_eq!((docs_row["second_n"].as_u64(), docs_row["second_kept"].as_f64()), (Some(2), Some(1.0)), "{docs_row}");
    let logs_row = rows.iter().find(|x| x["kind"] == "logs" && x["method"] == on).unwrap();
    assert!(logs_row["second_n"] == 0 && logs_row["second_kept"].is_null(), "no mean of nothing: {logs_row}");
}

/// The adaptive loop runs one configuration: `--sweep` may name one
/// setting (in place of the defaults), and more are refused before any
/// model or data is read.
#[test]
fn the_adaptive_loop_refuses_a_sweep_of_two_settings() {
    let (ok, _, stderr) = scd_dev(
        &[
            "eval",
            "--dataset",
            "musique",
            "--path",
            "no-such-file.jsonl",
            "--adaptive",
            "--sweep",
            "group_closure_share=0.4,1",
        ],
        "",
    );
    assert!(!ok);
    assert!(stderr.contains("--sweep: --adaptive runs one setting at a time, got 2"), "{stderr}");
}

/// The adaptive report names the configuration it ran: `defaults`, or the
/// one swept setting that replaced them, as the `settings:` line names it.
#[test]
fn the_adaptive_report_names_its_settings() {
    if !ready() {
        return;
    }
    let tmp = scratch("eval-adaptive-settings");
    let dir = tmp.path();
    let data = dir.join("musique.jsonl");
    let para = |idx: usize, title: &str, text: &str, sup: bool| serde_json::json!({"idx": idx, "title": title, "paragraph_text": text, "is_supporting": sup});
    let rec = serde_json::json!({
        "id": "2hop__1_2", "answer": "Stanley", "answer_aliases": [], "answerable": true,
        "question": "What is the seat of the county where Van Hook Township is located?",
        "paragraphs": [
            para(0, "Van Hook Township", "Van Hook Township is a township in Mountrail County, North Dakota.", true),
            para(1, "Mountrail County", "Mountrail County is a county in North Dakota. Its county seat is Stanley.", true),
            para(2, "Port Blair", "Port Blair is the capital of the Andaman and Nicobar Islands.", false),
            para(3, "Lake Sakakawea", "Lake Sakakawea is a reservoir on the Missouri River.", false),
        ],
        "question_decomposition": [
            {"id": 1, "question": "Van Hook Township >> located in", "answer": "Mountrail County", "paragraph_support_idx": 0},
            {"id": 2, "question": "#1 >> capital", "answer": "Stanley", "paragraph_support_idx": 1},
        ],
    });
    std::fs::write(&data, format!("{rec}\n")).unwrap();
    let run = |sweep: &[&str]| -> serde_json::Value {
        let report = dir.join("r.json");
        let mut args = vec!["eval", "--dataset", "musique", "--path", data.to_str().unwrap(), "--adaptive"];
        args.extend(["--budgets", "0.6", "--folds", "2", "--report", report.to_str().unwrap()]);
        let plot = dir.join("p.svg");
        args.extend(["--plot", plot.to_str().unwrap()]);
        args.extend(sweep);
        let (ok, _, stderr) = scd_dev(&args, "");
        assert!(ok, "{stderr}");
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
    };
    let lines = dir.join("each.jsonl");
    let report = run(&["--per-example", lines.to_str().unwrap()]);
    assert_eq!(report["settings"], "defaults");
    // budgets as the flags wrote them, not as f32s widened
    assert_eq!(
        (report["results"][0]["first_budget"].as_f64(), report["results"][0]["hop_budget"].as_f64()),
        (Some(0.6), Some(0.1))
    );
    // one line per (example, first budget): each step's chunks, and per
    // supporting paragraph whether each method kept it
    let each: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&lines).unwrap().trim()).unwrap();
    assert_eq!((each["id"].as_str(), each["first_budget"].as_f64()), (Some("2hop__1_2"), Some(0.6)));
    let steps = each["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "the first answer and one follow-up: {each}");
    assert_eq!(steps[1]["question"], "Mountrail County >> capital");
    // each chunk as [id, tokens, score]
    let chunks = steps[0]["chunks"].as_array().unwrap();
    assert!(!chunks.is_empty(), "{each}");
    for c in chunks {
        assert!(c[0].is_string() && c[1].as_u64().is_some_and(|t| t > 0) && c[2].is_number(), "{each}");
    }
    let gold = each["gold"].as_array().unwrap();
    let fields: Vec<&str> = gold.iter().map(|g| g["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["Van Hook Township", "Mountrail County"]);
    let all = gold.iter().all(|g| g["adaptive"] == true);
    assert_eq!(each["adaptive_all_kept"], all, "{each}");
    // after the loop, the probe with the next example's question (here its
    // own: the file holds one), counted apart
    assert_eq!(each["off_topic"]["question"], rec["question"], "{each}");
    let probe = each["off_topic"]["sent_tokens"].as_u64().unwrap();
    let share = report["results"][0]["overall"]["off_topic_share"].as_f64().unwrap();
    let hop = each["hop_tokens"].as_u64().unwrap();
    assert!((share - probe as f64 / hop as f64).abs() < 1e-6, "{share} {probe} {hop}");
    let empty = report["results"][0]["overall"]["off_topic_empty"].as_f64().unwrap();
    assert_eq!(empty, f64::from(u8::from(probe == 0)), "{report}");
    let swept = run(&["--sweep", "group_closure_share=1"]);
    assert_eq!(swept["settings"], "scd[group_closure_share=1]");
    assert_eq!(swept["examples"], 1);
}

/// `--dump-features` writes every key `models/fit_scorer.py` reads, the
/// header a piece opens included (`[Title]`: more than nothing), and
/// labels the supporting sentence.
#[test]
fn a_feature_dump_carries_what_the_fit_reads() {
    if !ready() {
        return;
    }
    let tmp = scratch("eval-dump");
    let dir = tmp.path();
    let data = dir.join("hotpot.json");
    let rec = serde_json::json!([{
        "_id": "h1", "question": "Which river runs through the capital of France?", "answer": "Seine",
        "type": "bridge", "level": "easy",
        "supporting_facts": [["Paris", 1]],
        "context": [
            ["Paris", ["Paris is the capital of France.", "The Seine runs through Paris."]],
            ["Lyon", ["Lyon is a city in France.", "The Rhone runs through Lyon."]],
        ],
    }]);
    std::fs::write(&data, rec.to_string()).unwrap();
    let dump = dir.join("dump.jsonl");
    let args = ["eval", "--dataset", "hotpotqa", "--path", data.to_str().unwrap(), "--dump-features"];
    let (ok, _, stderr) = scd_dev(&[&args[..], &[dump.to_str().unwrap()]].concat(), "");
    assert!(ok, "{stderr}");
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&dump).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        for key in ["set", "id", "label", "tokens", "x", "group", "lead", "prose", "field", "header", "hand"] {
            assert!(r.get(key).is_some(), "no {key} in {r}");
        }
        assert!(r["header"].as_u64().unwrap() > 0, "{r}");
    }
    let labelled: Vec<(u64, u64)> = rows
        .iter()
        .filter(|r| r["label"] == 1)
        .map(|r| (r["field"].as_u64().unwrap(), r["group"][0].as_u64().unwrap()))
        .collect();
    assert_eq!(labelled.len(), 1, "{rows:?}");
}
