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
    let mut log = String::new();
    for i in 0..40 {
        log.push_str(&format!("2024-05-01 10:{i:02}:00 INFO worker {i} handled request in {} ms\n", 10 + i));
    }
    log.push_str("2024-05-01 10:41:00 ERROR db: connection pool exhausted (32 of 32 in use)\n");
    log.push_str("2024-05-01 10:42:00 INFO health check ok\n");
    let rec = serde_json::json!({
        "id": "logs-pool", "kind": "logs", "task": "Why are requests failing?",
        "context": {"fields": [{"name": "app.log", "kind": "log", "content": log}]},
        "gold": [{"field": "app.log", "ranges": [[41, 41]]}],
    });
    let rec2 = serde_json::json!({
        "id": "logs-health", "kind": "logs", "task": "Is the health check passing?",
        "context": {"fields": [{"name": "app.log", "kind": "log", "content": log}]},
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
