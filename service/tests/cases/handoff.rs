//! `scd handoff parse|render` and `scd compress --render`: the three report
//! formats from stdin, round trips, strict render input, the batch parse
//! rate.

use scd_engine::handoff::{self, Format};
use serde_json::{json, Value};

use crate::{ready, root, scd, scratch};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(root().join("fixtures/handoff").join(name)).unwrap()
}

fn seeds() -> [(&'static str, String); 3] {
    [
        ("freeform", fixture("freeform.txt")),
        ("semi_structured", fixture("semi_structured.txt")),
        ("structured_soft", fixture("structured_soft.txt")),
    ]
}

/// Tokens of `text` in e5-small's own tokenizer (the default budget's).
fn scd_count(text: &str) -> u64 {
    let path = root().join("models/out/e5-small/tokenizer.json");
    let t = scd_engine::budget::TokenizerRegistry::new().resolve_or_load(path.to_str().unwrap()).unwrap().unwrap();
    t.count(text).unwrap() as u64
}

fn parse_json(args: &[&str], stdin: &str) -> Value {
    let (ok, stdout, stderr) = scd(args, stdin);
    assert!(ok, "{args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn parse_reads_each_format_from_stdin() {
    for (format, text) in seeds() {
        for asked in [format, "auto"] {
            let out = parse_json(&["handoff", "parse", "--format", asked], &text);
            assert_eq!(out["format"], format, "{asked}: {out}");
            assert_eq!(out["parsed"], true, "{asked}: {out}");
            assert_eq!(out["why_not"], Value::Null);
            assert_eq!(out["answer"], "Arthur's Magazine");
            let keys: Vec<&str> = out["report"].as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                ["answer_candidate", "confidence", "evidence", "next", "payload", "status", "summary"],
                "{out}"
            );
            if format == "freeform" {
                assert_eq!(out["report"]["status"], Value::Null);
                assert_eq!(out["current_confidence"], Value::Null);
                assert!(out["report"]["summary"].as_str().unwrap().starts_with("Arthur's Magazine was founded"));
            } else {
                assert_eq!(out["report"]["status"], "completed");
                assert_eq!(out["report"]["confidence"], "high");
                assert_eq!(out["report"]["answer_candidate"], "Arthur's Magazine");
                assert_eq!(out["current_confidence"], 0.9, "high maps to 0.9 by default");
            }
        }
    }
    let out = parse_json(&["handoff", "parse", "--confidence-high", "0.75"], &fixture("structured_soft.txt"));
    assert_eq!(out["current_confidence"], 0.75);
    let out = parse_json(&["handoff", "parse", "--format", "structured_soft"], &fixture("structured_soft.txt"));
    assert_eq!(out["report"]["payload"], json!({"entities": ["Arthur's Magazine", "First for Women"]}));
}

#[test]
fn a_malformed_report_degrades_to_freeform_and_says_why() {
    let cut = fixture("structured_soft.txt").replace("END_JSON_REPORT", "");
    let out = parse_json(&["handoff", "parse", "--format", "structured_soft"], &cut);
    assert_eq!(out["format"], "freeform");
    assert_eq!(out["parsed"], false);
    assert_eq!(out["why_not"], "missing END_JSON_REPORT");
    assert_eq!(out["answer"], "Arthur's Magazine", "the answer line is kept when the report does not parse");
    assert!(out["report"]["summary"].as_str().unwrap().starts_with("JSON_REPORT:"));
    let bad = fixture("semi_structured.txt").replace("completed", "finished");
    let out = parse_json(&["handoff", "parse", "--format", "semi_structured"], &bad);
    assert_eq!(out["parsed"], false);
    assert_eq!(
        out["why_not"],
        "bad status value \"finished\" (expected not_started, in_progress, completed or blocked)"
    );
}

#[test]
fn render_writes_back_what_parse_read() {
    for (_, text) in seeds() {
        for format in ["freeform", "semi_structured", "structured_soft"] {
            let parsed = parse_json(&["handoff", "parse"], &text);
            let (ok, rendered, stderr) = scd(&["handoff", "render", "--format", format], &parsed.to_string());
            assert!(ok, "{stderr}");
            let back = parse_json(&["handoff", "parse", "--format", format], &rendered);
            assert_eq!(back["parsed"], true, "{format}: {rendered}");
            assert_eq!(back["answer"], parsed["answer"], "{format}: {rendered}");
            if format != "freeform" && parsed["format"] != "freeform" {
                assert_eq!(back["report"], parsed["report"], "{format}: {rendered}");
            }
        }
    }
}

#[test]
fn bad_render_input_names_the_field() {
    let cases = [
        (json!({"report": {"statuz": "completed"}}), "report.statuz: unknown field `statuz`"),
        (json!({"report": {"status": "done"}}), "report.status: unknown variant `done`"),
        (json!({"report": {"confidence": 0.9}}), "report.confidence: "),
        (json!({"report": {"payload": [1]}}), "report.payload: invalid type: sequence, expected a map"),
        (json!({"report": {}, "answr": "x"}), "answr: unknown field `answr`"),
        (json!({"report": {}, "answer": "two\nlines"}), "answer: must be one line"),
        (json!({"answer": "x"}), "missing field `report`"),
    ];
    for (input, want) in cases {
        let (ok, stdout, stderr) = scd(&["handoff", "render", "--format", "structured_soft"], &input.to_string());
        assert!(!ok && stdout.is_empty(), "{input}: {stdout}");
        assert!(stderr.contains(want), "{input}: want {want:?} in {stderr}");
    }
    let (ok, _, stderr) = scd(&["handoff", "render", "--format", "freeform"], "{\"report\": {}} x");
    assert!(!ok && stderr.contains("after the JSON object"), "{stderr}");
    let (ok, _, stderr) = scd(&["handoff", "parse", "--confidence-high", "1.5"], "");
    assert!(!ok && stderr.contains("--confidence-high: must be in [0, 1], got 1.5"), "{stderr}");
}

/// The parse rate on the seed's three reports and the hand-made degraded
/// ones (`fixtures/handoff/reports.jsonl`): 7 of 19 parse as written, and
/// every re-rendered report parses.
#[test]
fn batch_prints_the_parse_rate_and_the_render_parse_rate() {
    let path = root().join("fixtures/handoff/reports.jsonl");
    let (ok, stdout, stderr) = scd(&["handoff", "parse", "--batch", path.to_str().unwrap()], "");
    assert!(ok, "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 20);
    assert_eq!(lines[0]["line"], 1);
    let summary = &lines[19];
    eprintln!("{summary}");
    assert_eq!(summary["reports"], 19);
    assert_eq!(summary["parsed"], 7);
    assert_eq!(summary["render_parse_rate"], 1.0);
    assert_eq!(summary["why_not"]["missing_end"], 1);
    assert_eq!(summary["why_not"]["bad_status"], 2);
    // a bad line names itself
    let dir = scratch("handoff-batch");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"a\"}\n{\"text\": \"b\", \"format\": \"xml\"}\n").unwrap();
    let (ok, _, stderr) = scd(&["handoff", "parse", "--batch", bad.to_str().unwrap()], "");
    assert!(!ok && stderr.contains("--batch line 2") && stderr.contains("\"xml\""), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compress_render_writes_a_report_that_parses_and_keeps_the_required_field() {
    if !ready() {
        return;
    }
    let ctx_path = root().join("fixtures/agent_context.json");
    let ctx: Value = serde_json::from_str(&std::fs::read_to_string(&ctx_path).unwrap()).unwrap();
    let schema = ctx["fields"][0]["content"].as_str().unwrap().to_string();
    assert_eq!(ctx["fields"][0]["name"], "db_schema");
    let p = ctx_path.to_str().unwrap();
    for format in ["semi_structured", "structured_soft", "freeform"] {
        let args = [
            "compress",
            "--task",
            "why do charges fail",
            "--context",
            p,
            "--budget",
            "300",
            "--required",
            "db_schema",
            "--render",
            format,
        ];
        let out = parse_json(&args, "");
        // with --render the report is the text handed over, its wrapping counted in the budget
        let report = out["text"].as_str().unwrap_or_else(|| panic!("no text key: {out}"));
        assert!(out["chunks"].as_array().is_some_and(|c| !c.is_empty()), "the chunks are still there");
        assert_eq!(out["totals"]["sent_tokens"].as_u64().unwrap(), scd_count(report), "{format}");
        assert!(out["totals"]["sent_tokens"].as_u64().unwrap() <= 300, "{format}: {}", out["totals"]);
        let f: Format = format.parse().unwrap();
        let parsed = handoff::parse(report, f);
        assert!(parsed.parsed, "{format}: {:?}\n{report}", parsed.why_not);
        assert!(!report.contains("sk_live_SECRET_4242"), "a confidential field never goes into a report");
        if format == "freeform" {
            assert!(report.contains(&schema), "{report}");
        } else {
            assert_eq!(parsed.report.payload["db_schema"], schema.trim(), "{format}:\n{report}");
            assert_eq!(parsed.report.summary.as_deref(), Some("Context selected for the task: why do charges fail"));
        }
        // --format text prints the report itself
        let (ok, text, stderr) = scd(&[&args[..], &["--format", "text"]].concat(), "");
        assert!(ok, "{stderr}");
        assert_eq!(text.strip_suffix('\n'), Some(report), "{format}");
    }
}

/// The `Handoff` RPC and reports on Compress/RequestContext, against a real
/// server (real model).
mod rpc {
    use scd_engine::handoff::{self, Format};
    use scd_service::grpc::pb;
    use tonic::Code;

    use std::path::Path;

    use super::{fixture, seeds};
    use crate::grpc::{client, compress_req, start};
    use crate::ready;

    type Client = pb::scd_client::ScdClient<tonic::transport::Channel>;

    fn parse_req(text: &str, format: pb::ReportFormat) -> pb::HandoffRequest {
        pb::HandoffRequest {
            op: Some(pb::handoff_request::Op::Parse(pb::ParseReport { text: text.into(), format: format as i32 })),
        }
    }

    fn render_req(report: pb::HandoffReport, format: i32, answer: Option<&str>) -> pb::HandoffRequest {
        pb::HandoffRequest {
            op: Some(pb::handoff_request::Op::Render(pb::RenderReport {
                report: Some(report),
                format,
                answer: answer.map(str::to_string),
            })),
        }
    }

    fn forward_req(text: &str, compress: pb::CompressRequest, render: pb::ReportFormat) -> pb::HandoffRequest {
        pb::HandoffRequest {
            op: Some(pb::handoff_request::Op::Forward(pb::ForwardReport {
                text: text.into(),
                format: 0,
                compress: Some(compress),
                render: render as i32,
            })),
        }
    }

    fn semi(confidence: &str, next: &str) -> String {
        format!(
            "[STATUS]\nin_progress\n[SUMMARY]\nThe checkout fails on card charges.\n[EVIDENCE_OR_TESTS]\nnone yet\n\
             [CONFIDENCE]\n{confidence}\n[NEXT]\n{next}\n[ANSWER_CANDIDATE]\nunknown\n"
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handoff_rpc_parses_renders_and_forwards_reports() {
        if !ready() {
            return;
        }
        let server = start(&["--confidence-medium", "0.55"]);
        let mut c = client(&server).await;
        let map = c.info(pb::InfoRequest {}).await.unwrap().into_inner().confidence_map.unwrap();
        assert_eq!((map.low, map.medium, map.high), (0.3, 0.55, 0.9), "serve's --confidence-* reach Info");

        the_seeds_parse_and_render_back_in_every_format(&mut c).await;

        // a broken structured report degrades to freeform and says why
        let broken = fixture("structured_soft.txt").replace("END_JSON_REPORT", "");
        let p = c.handoff(parse_req(&broken, pb::ReportFormat::StructuredSoft)).await.unwrap().into_inner();
        let p = p.parsed.unwrap();
        assert_eq!((p.format, p.parsed, p.why_not.as_str()), (1, false, "missing END_JSON_REPORT"));
        assert_eq!(p.answer.as_deref(), Some("Arthur's Magazine"), "the answer line survives degradation");

        // rejections name the field
        let rejects: [(pb::HandoffRequest, &str); 6] = [
            (pb::HandoffRequest { op: None }, "op: required"),
            (render_req(Default::default(), 0, None), "render.format: required"),
            (render_req(Default::default(), 9, None), "render.format: unknown value 9"),
            (
                render_req(pb::HandoffReport { payload_json: "\"x\"".into(), ..Default::default() }, 2, None),
                "render.report.payload_json: must be a JSON object, found a string",
            ),
            (render_req(Default::default(), 2, Some("a\nb")), "render.answer: must be one line"),
            (parse_req("x", pb::ReportFormat::Freeform).tap_format(5), "parse.format: unknown value 5"),
        ];
        for (req, want) in rejects {
            let e = c.handoff(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{want}");
            assert!(e.message().starts_with(want), "{} vs {want}", e.message());
        }

        forward_sends_a_report_of_the_selection(&mut c).await;

        // Compress with render: the gRPC form of `scd compress --render`
        let mut plain = compress_req(200, "");
        plain.render = pb::ReportFormat::SemiStructured as i32;
        let out = c.compress(plain).await.unwrap().into_inner();
        assert!(handoff::parse(&out.report, Format::SemiStructured).parsed, "{}", out.report);
        assert!(!out.report.contains("sk_live_SECRET_4242"));
        let mut none = compress_req(200, "");
        none.render = 0;
        assert!(c.compress(none).await.unwrap().into_inner().report.is_empty());
    }

    /// Parse: the seed examples, as named and detected; each rendered back
    /// in every format parses to the same report.
    async fn the_seeds_parse_and_render_back_in_every_format(c: &mut Client) {
        let formats = [pb::ReportFormat::Freeform, pb::ReportFormat::SemiStructured, pb::ReportFormat::StructuredSoft];
        for ((name, text), format) in seeds().into_iter().zip(formats) {
            for asked in [format, pb::ReportFormat::Unspecified] {
                let p = c.handoff(parse_req(&text, asked)).await.unwrap().into_inner().parsed.unwrap();
                assert_eq!((p.format, p.parsed, p.why_not.as_str()), (format as i32, true, ""), "{name}");
                assert_eq!(p.answer.as_deref(), Some("Arthur's Magazine"), "{name}");
                let r = p.report.unwrap();
                if format == pb::ReportFormat::Freeform {
                    assert_eq!((r.status, r.confidence, p.current_confidence), (0, 0, None));
                } else {
                    assert_eq!(r.status, pb::ReportStatus::Completed as i32, "{name}");
                    assert_eq!(r.confidence, pb::ReportConfidence::High as i32, "{name}");
                    assert_eq!(p.current_confidence, Some(0.9), "{name}");
                    assert_eq!(r.answer_candidate.as_deref(), Some("Arthur's Magazine"));
                }
                // render it back in every format: each parses to the same report
                for back in formats {
                    let text = c
                        .handoff(render_req(r.clone(), back as i32, p.answer.as_deref()))
                        .await
                        .unwrap()
                        .into_inner()
                        .text;
                    let f = match back {
                        pb::ReportFormat::SemiStructured => Format::SemiStructured,
                        pb::ReportFormat::StructuredSoft => Format::StructuredSoft,
                        _ => Format::Freeform,
                    };
                    let again = handoff::parse(&text, f);
                    assert!(again.parsed, "{name} → {f}: {text}");
                    assert_eq!(again.answer.as_deref(), Some("Arthur's Magazine"));
                    if format != pb::ReportFormat::Freeform && f != Format::Freeform {
                        // structured in, structured out: the same report
                        let sent = scd_service::grpc::handoff::report("r", r.clone()).unwrap();
                        assert_eq!(again.report, sent, "{name} → {f}");
                    }
                }
            }
        }
    }

    /// Forward: the sender's report joins its context, the receiver gets a
    /// structured report of the selection that keeps its required field and
    /// the sender's answer line, and no confidential content; and the
    /// forward rejections.
    async fn forward_sends_a_report_of_the_selection(c: &mut Client) {
        let sender = semi("low", "Check why charge_card times out against the payments database.");
        let mut compress = compress_req(120, "");
        compress.requirement.as_mut().unwrap().required_fields = vec!["report.next".into()];
        let r = c
            .handoff(forward_req(
                &format!("{sender}\nAnswer: not yet"),
                compress.clone(),
                pb::ReportFormat::StructuredSoft,
            ))
            .await
            .unwrap()
            .into_inner();
        let p = r.parsed.unwrap();
        assert_eq!((p.format, p.parsed, p.current_confidence), (2, true, Some(0.3)));
        let compressed = r.compressed.unwrap();
        assert_eq!(compressed.report, r.text);
        assert!(compressed.chunks.iter().any(|c| c.field == "report.next"), "required section sent");
        assert!(compressed.withheld_fields.contains(&"api_keys".to_string()));
        assert!(!r.text.contains("sk_live_SECRET_4242"), "confidential content never rendered");
        let got = handoff::parse(&r.text, Format::StructuredSoft);
        assert!(got.parsed, "{}", r.text);
        assert_eq!(got.report.next.as_deref(), Some("Check why charge_card times out against the payments database."));
        assert_eq!(got.answer.as_deref(), Some("not yet"));
        let sent = compressed.totals.unwrap().sent_tokens;
        assert!(sent <= 120, "the receiver's budget holds: {sent}");

        // forward rejections
        let mut spoof = compress.clone();
        spoof.fields[0].name = "report.summary".into();
        let e = c.handoff(forward_req(&sender, spoof, pb::ReportFormat::Freeform)).await.unwrap_err();
        assert!(e.message().starts_with("compress.fields[0].name: \"report.summary\" is reserved"), "{}", e.message());
        let mut twice = compress.clone();
        twice.render = pb::ReportFormat::Freeform as i32;
        let e = c.handoff(forward_req(&sender, twice, pb::ReportFormat::Freeform)).await.unwrap_err();
        assert!(e.message().starts_with("forward.compress.render: must be unset"), "{}", e.message());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn request_context_takes_the_receivers_report_for_its_confidence() {
        if !ready() {
            return;
        }
        let server = start(&["--confidence-low", "0.2"]);
        let mut c = client(&server).await;
        let open = |c: &mut pb::scd_client::ScdClient<tonic::transport::Channel>| {
            let mut c = c.clone();
            async move {
                // a strict threshold sends little up front, leaving budget
                let mut first = compress_req(300, "");
                first.requirement.as_mut().unwrap().relevance_threshold = Some(0.99);
                let o = c.open_session(pb::OpenSessionRequest { compress: Some(first) }).await.unwrap().into_inner();
                (o.session_id, o.session_token)
            }
        };
        let more = |id: &str, token: &str, report: &str, confidence: f32| pb::ContextRequest {
            session_id: id.into(),
            session_token: token.into(),
            current_confidence: confidence,
            report: report.into(),
            ..Default::default()
        };
        // low confidence (0.2 here) under the threshold: the report's next
        // step is the question, and new chunks come
        let (id, token) = open(&mut c).await;
        let r = c
            .request_context(more(&id, &token, &semi("low", "Which error do the payment logs show?"), 0.0))
            .await
            .unwrap()
            .into_inner();
        assert!(!r.chunks.is_empty(), "low confidence gets more context: {}", r.reason);
        // high confidence (0.9 ≥ θ 0.7): nothing, and the reason says so
        let r = c.request_context(more(&id, &token, &semi("high", "none"), 0.0)).await.unwrap().into_inner();
        assert!(r.chunks.is_empty());
        assert!(r.reason.contains("0.9"), "{}", r.reason);
        // a freeform report states no confidence; a number with a report is ambiguous
        let e = c.request_context(more(&id, &token, "I am unsure.", 0.0)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("report: states no confidence (read as freeform)"), "{}", e.message());
        let e = c.request_context(more(&id, &token, &semi("low", "x"), 0.4)).await.unwrap_err();
        assert!(e.message().starts_with("current_confidence: 0.4 given with a report"), "{}", e.message());

        // the same through `scd client`: compress --render, more --report
        let addr = server.addr.clone();
        let report = crate::scratch("handoff-client").join("receiver.txt");
        std::fs::write(&report, semi("low", "Which error do the payment logs show?")).unwrap();
        let (out, more_out) = tokio::task::block_in_place(|| client_compress_render_then_more_report(&addr, &report));
        let text = out["text"].as_str().unwrap();
        assert!(handoff::parse(text, Format::SemiStructured).parsed, "{text}");
        assert!(!text.contains("sk_live_SECRET_4242"));
        let more_out: serde_json::Value = serde_json::from_str(&more_out).unwrap();
        assert!(more_out.get("remaining_tokens").is_some(), "{more_out}");
        // --confidence and --report together are refused by the CLI
        let (ok, _, err) = tokio::task::block_in_place(|| client_more_with_confidence_and_report(&addr, &report));
        assert!(!ok && err.contains("--confidence"), "{err}");
    }

    /// `scd client compress --render` opening a session, then `scd client
    /// more --report` on it: the compress output and the more output.
    fn client_compress_render_then_more_report(addr: &str, report: &Path) -> (serde_json::Value, String) {
        let (ok, out, err) = crate::scd(
            &[
                "client",
                "--addr",
                addr,
                "compress",
                "--task",
                "Why do charges fail?",
                "--context",
                "fixtures/agent_context.json",
                "--budget",
                "300",
                "--session",
                "cli-handoff",
                "--render",
                "semi_structured",
            ],
            "",
        );
        assert!(ok, "{err}");
        let out: serde_json::Value = serde_json::from_str(&out).unwrap();
        let token = out["session_token"].as_str().unwrap().to_string();
        let (ok, more_out, err) = crate::scd(
            &[
                "client",
                "--addr",
                addr,
                "more",
                "--session",
                "cli-handoff",
                "--token",
                &token,
                "--report",
                report.to_str().unwrap(),
            ],
            "",
        );
        assert!(ok, "{err}");
        (out, more_out)
    }

    /// `scd client more` given both `--confidence` and `--report`.
    fn client_more_with_confidence_and_report(addr: &str, report: &Path) -> (bool, String, String) {
        crate::scd(
            &[
                "client",
                "--addr",
                addr,
                "more",
                "--session",
                "x",
                "--token",
                "t",
                "--report",
                report.to_str().unwrap(),
                "--confidence",
                "0.2",
            ],
            "",
        )
    }

    trait TapFormat {
        fn tap_format(self, f: i32) -> Self;
    }

    impl TapFormat for pb::HandoffRequest {
        fn tap_format(mut self, f: i32) -> Self {
            if let Some(pb::handoff_request::Op::Parse(p)) = &mut self.op {
                p.format = f;
            }
            self
        }
    }
}
