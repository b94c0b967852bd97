//! `scd-dev atp flood` and `scd-dev atp demo` run end to end, with the
//! `scd` binary they start ([`crate::scd_bin`]).

/// `scd-dev atp flood` drives a real worker with maximal tasks (the most chunks,
/// steps and needs) from several peers, each with its own DID: every task it
/// accepted completes, and the report samples the worker's memory and draws
/// it. The figures themselves are BENCHMARKS.md's, from a full-size run.
#[test]
fn the_flood_tool_measures_a_worker_under_maximal_tasks() {
    let tmp = crate::scratch("atp-flood");
    let dir = tmp.path();
    let (json, svg) = (dir.join("flood.json"), dir.join("flood.svg"));
    let (net, json_s, svg_s) = (dir.join("net"), json.to_str().unwrap(), svg.to_str().unwrap());
    let (ok, stdout, stderr) = crate::scd_dev(
        &[
            "atp",
            "flood",
            "--tasks",
            "6",
            "--requesters",
            "3",
            "--context-bytes",
            "2000000",
            "--task-ms",
            "100",
            "--workdir",
            net.to_str().unwrap(),
            "--json",
            json_s,
            "--plot",
            svg_s,
        ],
        "",
    );
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("maximal tasks") && stdout.contains("worker RSS: idle"), "{stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(n("accepted") >= 6, "{r}");
    assert_eq!(n("completed"), n("accepted"), "{r}");
    assert_eq!((n("chunks"), n("steps")), (1024, 100));
    assert_eq!(r["refused"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(n("in_flight_max"), 8 + 2 + 3);
    assert!(n("rss_peak_kib") >= n("rss_idle_kib") && n("rss_idle_kib") > 0, "{r}");
    assert!(n("sent_bytes") >= 6 * 2_000_000, "{r}");
    assert!(r["samples"].as_array().is_some_and(|s| !s.is_empty()));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("worker RSS"));
    // bad input names the flag and the limit
    let (ok, _, stderr) = crate::scd_dev(&["atp", "flood", "--context-bytes", "99999999"], "");
    assert!(!ok && stderr.contains("--context-bytes 99999999: must be 1 to"), "{stderr}");
}

#[test]
fn the_demo_kills_a_worker_and_loses_no_task() {
    if !crate::ready() {
        return;
    }
    let tmp = crate::scratch("atp-demo");
    let dir = tmp.path();
    let json = dir.join("demo.json");
    let (ok, stdout, stderr) = crate::scd_dev(
        &["atp", "demo", "--json", json.to_str().unwrap(), "--workdir", dir.join("net").to_str().unwrap()],
        "",
    );
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(n("tasks_lost"), 0, "{r}\n{stdout}");
    assert_eq!(n("tasks_submitted"), 6, "{r}");
    assert_eq!(n("tasks_completed") + n("tasks_poison"), 6, "{r}\n{stdout}");
    assert_eq!(n("tasks_poison"), 1, "{r}\n{stdout}");
    assert!(n("failovers") >= 1, "{r}\n{stdout}");
    // Property 5: each signalled worker's task is at the next agent, with
    // its checkpoint, within the paper's 5 s: after a SIGKILL (the stream
    // breaks) and after a SIGSTOP (only T_fail, 3 of the demo's 300 ms
    // heartbeats, tells)
    let times = r["failover_times"].as_array().unwrap_or_else(|| panic!("{r}"));
    let signals: Vec<&str> = times.iter().map(|f| f["signal"].as_str().unwrap()).collect();
    assert_eq!(signals, ["SIGKILL", "SIGSTOP"], "{r}\n{stdout}");
    for f in times {
        let (detected, at_next) = (f["detected_ms"].as_u64(), f["at_next_agent_ms"].as_u64());
        let (Some(detected), Some(at_next)) = (detected, at_next) else { panic!("{f}\n{stdout}") };
        assert!(detected <= at_next && at_next < 5_000, "{f}\n{stdout}");
    }
    // a frozen worker is found by its silence
    assert!(stdout.contains("no heartbeat for 3 × its interval"), "{stdout}");
    assert!(stdout.contains("(Property 5 bound: 5,000 ms)"), "{stdout}");
    assert!(n("circuit_opened") >= 1, "{r}\n{stdout}");
    assert_eq!(r["rejected"], serde_json::json!({"forged": 1, "replayed": 1, "stale": 1}), "{stdout}");
    let (full, sent) = (r["context"]["full_tokens"].as_u64().unwrap(), r["context"]["sent_tokens"].as_u64().unwrap());
    assert!(sent > 0 && sent < full, "{r}");
    assert!(r["context"]["context_requests"].as_u64().unwrap() >= 1, "{r}\n{stdout}");
    assert!(n("proofs") >= 4, "{r}");
    for want in [
        "SIGKILL",
        "SIGSTOP",
        "FAILOVER",
        "resuming after checkpoint",
        "circuit of",
        "POISON",
        "withheld: [gateway_credentials]",
        "  repricing ", // the killed worker triggers repricing (§7.3)
    ] {
        assert!(stdout.contains(want), "{want:?} not in:\n{stdout}");
    }
    // the confidential field never crossed an agent boundary (nor reached the story)
    assert!(!stdout.contains("sk_live_DEMO_NEVER_LEAVES"), "{stdout}");
}
