//! Layer 3's unit tests.

use std::path::Path;

use super::*;
use crate::{pb, Error};
use scd_proto::scd::v1 as scd;
use tonic::transport::Channel;

fn fixture() -> Vec<Field> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/agent_context.json");
    ContextFile::load(&path).unwrap().fields
}

fn chunk(field: &str, id: &str, tokens: u32) -> scd::Chunk {
    scd::Chunk {
        field: field.into(),
        id: id.into(),
        text: format!("text of {id}"),
        score: 1.5,
        tokens,
        ..Default::default()
    }
}

fn dropped(field: &str, id: &str, tokens: u32) -> scd::DroppedChunk {
    scd::DroppedChunk { field: field.into(), id: id.into(), stub: format!("stub of {id}"), tokens }
}

/// SCD's answer for the fixture: two chunks sent, three stubs, api_keys withheld.
fn response() -> scd::CompressResponse {
    scd::CompressResponse {
        chunks: vec![chunk("db_schema", "db_schema#1", 47), chunk("error_logs", "error_logs#0", 31)],
        dropped: vec![
            dropped("db_schema", "db_schema#0", 24),
            dropped("error_logs", "error_logs#1", 66),
            dropped("code", "code#0", 11),
        ],
        totals: Some(scd::Totals { context_tokens: 391, sent_tokens: 78, ..Default::default() }),
        task_embedding: vec![0.6, 0.8, 0.0],
        session_id: "s1".into(),
        session_token: "tok".into(),
        withheld_fields: vec!["api_keys".into()],
        ..Default::default()
    }
}

#[test]
fn fixture_loads_strictly_and_debug_hides_content() {
    let fields = fixture();
    assert_eq!(fields.len(), 5);
    assert_eq!((fields[0].name.as_str(), fields[0].kind), ("db_schema", FieldKind::Table));
    let secret = fields.iter().find(|f| f.confidential).unwrap();
    assert_eq!(secret.name, "api_keys");
    let printed = format!("{fields:?}");
    assert!(!printed.contains("sk_live_SECRET_4242") && printed.contains("api_keys"), "{printed}");
    let err = ContextFile::from_json(r#"{"fields": [{"name": "a", "content": "x", "confidental": true}]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("context.fields[0].confidental: unknown field `confidental`"), "{err}");
    let f = &ContextFile::from_json(r#"{"fields": [{"name": "a", "content": "x"}]}"#).unwrap().fields[0];
    assert_eq!((f.kind, f.confidential), (FieldKind::Prose, false));
    let err = ContextFile::load(Path::new("/nonexistent/ctx.json")).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/ctx.json"), "{err}");
}

#[test]
fn task_text_is_built_as_scd_builds_it() {
    let t = Task {
        description: "  Fix the bug ".into(),
        constraints: vec![" no new deps".into(), "keep the API".into()],
        output_schema: Some(" {\"patch\": string} ".into()),
    };
    assert_eq!(t.text(), "Fix the bug\nConstraint: no new deps\nConstraint: keep the API\nOutput: {\"patch\": string}");
    // the wire has no "empty but present" schema
    let t = Task { output_schema: Some(String::new()), ..Task::new("x") };
    assert_eq!((t.text().as_str(), scd::Task::from(&t).output_schema.as_str()), ("x", ""));
    let printed = format!("{:?}", Task::new("secret plan"));
    assert!(!printed.contains("secret plan"), "{printed}");
    let err = serde_json::from_str::<Task>(r#"{"description": "x", "schema": "y"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `schema`"));
}

#[test]
fn offer_maps_to_scd_requirement() {
    let offer = pb::ContextRequirement {
        required_fields: vec!["db_schema".into()],
        optional_fields: vec!["code".into()],
        max_context_tokens: 300,
        relevance_threshold: None,
    };
    let r = requirement_from_offer(&offer).unwrap();
    assert_eq!((r.required_fields, r.optional_fields), (vec!["db_schema".to_string()], vec!["code".to_string()]));
    assert_eq!((r.max_context_tokens, r.relevance_threshold), (300, None));
    assert_eq!(r.min_relative_score, Some(DEFAULT_MIN_RELATIVE_SCORE));
    let r =
        requirement_from_offer(&pb::ContextRequirement { relevance_threshold: Some(0.25), ..offer.clone() }).unwrap();
    assert_eq!((r.relevance_threshold, r.min_relative_score), (Some(0.25), None));

    let err = requirement_from_offer(&pb::ContextRequirement { max_context_tokens: 0, ..offer.clone() })
        .unwrap_err()
        .to_string();
    assert_eq!(err, "requirement.max_context_tokens: must be at least 1 (the receiver's budget in tokens)");
    for bad in [1.5, -1.01, f64::NAN, f64::INFINITY] {
        let err = requirement_from_offer(&pb::ContextRequirement { relevance_threshold: Some(bad), ..offer.clone() })
            .unwrap_err()
            .to_string();
        assert_eq!(err, format!("requirement.relevance_threshold: must be a cosine in [-1, 1], got {bad}"));
    }
}

#[test]
fn transfer_indexes_chunks_and_stubs_in_reading_order() {
    let fields = fixture();
    let t = transfer_from_scd(&response(), &fields, 100, "tok").unwrap();
    // reading order: db_schema#0, db_schema#1, error_logs#0, error_logs#1, code#0
    let idx: Vec<(u32, &str)> = t.diff.chunks.iter().map(|c| (c.index, c.chunk_id.as_str())).collect();
    assert_eq!(idx, vec![(1, "db_schema#1"), (2, "error_logs#0")]);
    let stubs: Vec<(u32, &str)> = t.diff.dropped.iter().map(|d| (d.index, d.chunk_id.as_str())).collect();
    assert_eq!(stubs, vec![(0, "db_schema#0"), (3, "error_logs#1"), (4, "code#0")]);
    assert_eq!(t.diff.chunks[0].data, b"text of db_schema#1");
    assert_eq!((t.diff.chunks[0].field.as_str(), t.diff.chunks[0].tokens), ("db_schema", 47));
    assert!((t.diff.chunks[0].relevance_score - 1.5).abs() < 1e-9);
    assert_eq!(t.diff.dropped[1].stub, "stub of error_logs#1");
    assert_eq!((t.diff.original_size, t.diff.compressed_size), (391, 78));
    assert_eq!((t.full_tokens, t.sent_tokens), (391, 78));
    assert!((t.reduction_ratio().unwrap() - 391.0 / 78.0).abs() < 1e-9);
    assert_eq!(t.diff.withheld_fields, vec!["api_keys".to_string()]);
    assert_eq!(t.diff.base_hash, context_hash(&fields).to_vec());
    let e = t.diff.task_embedding.as_ref().unwrap();
    assert_eq!(e.dimensions, 3);
    assert!((e.values[1] - 0.8).abs() < 1e-6);
    assert_eq!((t.session.id.as_str(), t.session.token()), ("s1", "tok"));
    assert_eq!((t.session.chunk_id(3), t.session.index_of("code#0")), (Some("error_logs#1"), Some(4)));
    assert_eq!(t.session.remaining_tokens(), 22);
}

#[test]
fn a_chunk_or_stub_of_a_withheld_field_is_never_forwarded() {
    let fields = fixture();
    // SCD names the field withheld, yet sends a chunk of it
    let mut r = response();
    r.chunks.push(chunk("api_keys", "api_keys#0", 5));
    let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err();
    assert!(
        matches!(&err, Error::ConfidentialChunk { field, chunk_id } if field == "api_keys" && chunk_id == "api_keys#0")
    );
    assert_eq!(err.to_string(), "SCD returned chunk api_keys#0 of withheld field api_keys; it is not forwarded");
    // a stub of it
    let mut r = response();
    r.dropped.push(dropped("api_keys", "api_keys#0", 5));
    assert!(matches!(transfer_from_scd(&r, &fields, 1000, "tok"), Err(Error::ConfidentialChunk { .. })));
    // SCD forgot to list it as withheld: marked confidential here is enough
    let mut r = response();
    r.withheld_fields.clear();
    r.chunks.push(chunk("api_keys", "api_keys#0", 5));
    assert!(matches!(transfer_from_scd(&r, &fields, 1000, "tok"), Err(Error::ConfidentialChunk { .. })));
    // and in an adaptive answer
    let t = transfer_from_scd(&response(), &fields, 1000, "tok").unwrap();
    let more = scd::ContextResponse { chunks: vec![chunk("api_keys", "api_keys#0", 5)], ..Default::default() };
    assert!(matches!(response_from_scd(&more, &t.session), Err(Error::ConfidentialChunk { .. })));
}

#[test]
fn malformed_scd_replies_are_refused() {
    let fields = fixture();
    let err = transfer_from_scd(&response(), &fields, 77, "tok").unwrap_err().to_string();
    assert_eq!(err, "SCD's OpenSession reply: sent 78 tokens, over the receiver's budget of 77");
    let mut r = response();
    r.chunks.push(chunk("nope", "nope#0", 1));
    let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err().to_string();
    assert!(err.contains("chunk nope#0 names field \"nope\", which is not in the context"), "{err}");
    let mut r = response();
    r.dropped.push(dropped("db_schema", "db_schema#1", 47));
    let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err().to_string();
    assert!(err.ends_with("chunk db_schema#1 appears twice"), "{err}");
    let t = transfer_from_scd(&response(), &fields, 1000, "tok").unwrap();
    let more = scd::ContextResponse { chunks: vec![chunk("code", "code#9", 5)], ..Default::default() };
    let err = response_from_scd(&more, &t.session).unwrap_err().to_string();
    assert_eq!(err, "SCD's RequestContext reply: chunk code#9 is not in the transfer's manifest");
}

#[test]
fn adaptive_answer_keeps_stub_indices_and_tracks_the_budget() {
    let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
    let more = scd::ContextResponse {
        chunks: vec![chunk("error_logs", "error_logs#1", 15)],
        remaining_tokens: 7,
        reason: String::new(),
        ..Default::default()
    };
    let out = response_from_scd(&more, &t.session).unwrap();
    assert_eq!(out.chunks.len(), 1);
    assert_eq!((out.chunks[0].index, out.chunks[0].chunk_id.as_str()), (3, "error_logs#1"));
    assert_eq!((out.remaining_tokens, t.session.remaining_tokens()), (7, 7));
}

#[test]
fn session_debug_never_prints_the_token() {
    let t = transfer_from_scd(&response(), &fixture(), 100, "s3cr3t-t0ken").unwrap();
    let printed = format!("{t:?}");
    assert!(!printed.contains("s3cr3t-t0ken") && printed.contains("<secret>"), "{printed}");
    assert!(printed.contains("s1"));
}

#[test]
fn context_hash_covers_public_content_and_never_secrets() {
    let fields = fixture();
    let h = context_hash(&fields);
    let mut edited = fields.clone();
    edited[0].content.push('x');
    assert_ne!(context_hash(&edited), h);
    let mut renamed = fields.clone();
    renamed[1].name = "logs".into();
    assert_ne!(context_hash(&renamed), h);
    let mut secret = fields.clone();
    secret[4].content = "another secret".into();
    assert_eq!(context_hash(&secret), h, "confidential content is not hashed");
    // the length prefixes keep field boundaries apart
    let a = vec![Field { name: "ab".into(), kind: FieldKind::Prose, content: "c".into(), confidential: false }];
    let b = vec![Field { name: "a".into(), kind: FieldKind::Prose, content: "bc".into(), confidential: false }];
    assert_ne!(context_hash(&a), context_hash(&b));
}

#[test]
fn hop_ledger_sums_hops_and_requests() {
    let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
    let mut l = HopLedger::new();
    l.record_transfer("t1", "did:a", "did:b", &t);
    l.record_transfer("t1", "did:b", "did:c", &t);
    let more = pb::ContextResponse {
        chunks: vec![pb::ContextChunk { tokens: 11, ..Default::default() }],
        ..Default::default()
    };
    l.record_response("t1", "did:a", "did:b", &more).unwrap();
    let err = l.record_response("t2", "did:a", "did:b", &more).unwrap_err().to_string();
    assert_eq!(err, "hop: no transfer recorded for task \"t2\" from did:a to did:b");
    assert_eq!(l.hops()[0].sent_tokens, 78 + 11);
    assert_eq!(l.hops()[0].context_requests, 1);
    let tot = l.totals();
    assert_eq!((tot.hops, tot.full_tokens, tot.sent_tokens, tot.context_requests), (2, 782, 167, 1));
    assert!((tot.reduction_ratio.unwrap() - 782.0 / 167.0).abs() < 1e-9);
    let json = l.to_json();
    assert_eq!(json["totals"]["sent_tokens"], 167);
    assert_eq!(json["hops"][1]["to"], "did:c");
    let back: HopLedger = serde_json::from_value(serde_json::json!({ "hops": json["hops"] })).unwrap();
    assert_eq!(back, l);
    assert_eq!(HopLedger::new().totals().reduction_ratio, None);
}

/// A link whose channel never connects: what it answers, it answers
/// without asking SCD.
fn offline() -> ScdLink {
    ScdLink::from_channel(Channel::from_static("http://127.0.0.1:9").connect_lazy(), "http://127.0.0.1:9")
}

#[tokio::test]
async fn at_or_above_theta_nothing_is_sent_and_scd_is_not_asked() {
    let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
    for conf in [THETA, 0.95, 1.0] {
        let r = offline().request_more(&t.session, "anything", conf, &[]).await.unwrap();
        assert!(r.chunks.is_empty());
        assert_eq!(r.reason, format!("confidence {conf} is at or above θ = 0.7; no context sent"));
        assert_eq!(r.remaining_tokens, 22);
    }
    // a worker's ContextRequest: the answer names its task
    let req = pb::ContextRequest {
        task_id: "task-7".into(),
        current_confidence: 0.8,
        specific_question: "more?".into(),
        requested_chunk_indices: vec![0],
        ..Default::default()
    };
    let r = offline().answer(&t.session, &req).await.unwrap();
    assert_eq!((r.task_id.as_str(), r.chunks.len()), ("task-7", 0));
    assert!(r.reason.starts_with("confidence 0.8 is at or above"), "{}", r.reason);
}

#[tokio::test]
async fn bad_adaptive_requests_are_refused_before_scd() {
    let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
    let link = offline();
    for conf in [-0.1, 1.5, f64::NAN] {
        let err = link.request_more(&t.session, "q", conf, &[]).await.unwrap_err().to_string();
        assert_eq!(err, format!("current_confidence: must be in [0, 1], got {conf}"));
    }
    let err = link.request_more(&t.session, "q", 0.2, &[5.into()]).await.unwrap_err().to_string();
    assert_eq!(err, "requested_chunk_indices: index 5 is not in the transfer (it has 5 chunks)");
    let req = pb::ContextRequest { current_confidence: 0.1, requested_chunk_indices: vec![9], ..Default::default() };
    let err = link.answer(&t.session, &req).await.unwrap_err().to_string();
    assert_eq!(err, "requested_chunk_indices: index 9 is not in the transfer (it has 5 chunks)");
    let err = link.request_more(&t.session, "  ", 0.2, &[]).await.unwrap_err().to_string();
    assert_eq!(err, "specific_question: must not be empty (or name chunks by index or id)");
    // a valid request reaches for SCD, and the error names the URL and RPC
    let err = link.request_more(&t.session, "q", 0.2, &["code#0".into()]).await.unwrap_err().to_string();
    assert!(err.starts_with("SCD RequestContext at http://127.0.0.1:9 failed: Unavailable"), "{err}");
}

#[tokio::test]
async fn connect_names_the_url() {
    let err = ScdLink::connect("https://scd.example:443").await.unwrap_err().to_string();
    assert_eq!(err, "scd_url: \"https://scd.example:443\" must start with http:// (this client speaks plaintext gRPC)");
    let err = ScdLink::connect("http://127.0.0.1:9").await.unwrap_err().to_string();
    assert!(err.starts_with("cannot connect to SCD at http://127.0.0.1:9"), "{err}");
    let err = ScdLink::connect("http://bad host").await.unwrap_err().to_string();
    assert!(err.starts_with("scd_url: \"http://bad host\" is not a URI"), "{err}");
}
