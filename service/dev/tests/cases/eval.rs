//! `scd-dev eval` end to end with the real default model.

use crate::{ready, scd_dev, scratch};

/// `scd-dev eval` reports the agent fixture's recall as the demo sees it.
#[test]
fn eval_reports_the_agent_fixture_recall() {
    if !ready() {
        return;
    }
    let dir = scratch("eval-fixture");
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
