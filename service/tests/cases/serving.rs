//! The serving path of `scd serve`: queue depth, fail-stop batcher, token
//! budget batching, status codes of undecodable input, deadlines and
//! cancellation, the encoder-token bound, reflection v1alpha and rejection
//! logs. The listeners against idle and silent sockets are in
//! [`crate::connections`], per-caller shares in [`crate::shares`]; both use
//! the helpers here.
//!
//! Most run a server in-process (`serve_on`) over a test encoder (the
//! engine's hash encoder, optionally slowed or made to panic), so they need
//! no model; the ones through the real `scd serve` binary need the models.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, HashEncoder};
use scd_service::app::Limits;
use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use scd_service::http::HttpLimits;

use crate::inproc::{InProc, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::Code;

/// The hash encoder, slowed by `delay_ms` per encode call, panicking on
/// [`MAGIC`], counting its calls.
pub(crate) struct TestEncoder {
    inner: HashEncoder,
    pub(crate) delay_ms: AtomicU64,
    calls: AtomicUsize,
    /// Milliseconds per text in `encode_cancellable`, which checks the
    /// cancel before each text (as the ONNX encoder does before each batch).
    pub(crate) piece_ms: AtomicU64,
    /// Texts `encode_cancellable` has started.
    pieces: AtomicUsize,
    /// Milliseconds per `count_tokens`.
    pub(crate) count_ms: AtomicU64,
}

const MAGIC: &str = "please panic now";

impl TestEncoder {
    pub(crate) fn new(delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: HashEncoder::new(64, 512),
            delay_ms: AtomicU64::new(delay_ms),
            calls: AtomicUsize::new(0),
            piece_ms: AtomicU64::new(0),
            pieces: AtomicUsize::new(0),
            count_ms: AtomicU64::new(0),
        })
    }
}

impl Encoder for TestEncoder {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }
    fn count_tokens(&self, text: &str) -> scd_engine::Result<usize> {
        std::thread::sleep(Duration::from_millis(self.count_ms.load(Ordering::SeqCst)));
        self.inner.count_tokens(text)
    }
    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> scd_engine::Result<Encoded> {
        if texts.contains(&MAGIC) {
            panic!("test encoder told to panic");
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst)));
        self.inner.encode(texts, opts)
    }
    fn encode_cancellable(
        &self,
        texts: &[&str],
        opts: &EncodeOptions,
        cancel: &scd_engine::cancel::Cancel,
    ) -> scd_engine::Result<Encoded> {
        for _ in texts {
            cancel.check("embed")?;
            self.pieces.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(self.piece_ms.load(Ordering::SeqCst)));
        }
        self.encode(texts, opts)
    }
    fn provider(&self) -> &str {
        "test"
    }
}

pub(crate) fn limits() -> Limits {
    crate::inproc::limits()
}

pub(crate) async fn start(encoder: Arc<TestEncoder>, limits: Limits, http: HttpLimits) -> InProc {
    crate::inproc::start(Options { encoder, limits, http, ..Default::default() })
}

async fn health(addr: &str, service: &str) -> i32 {
    let ch = Channel::from_shared(addr.to_string()).unwrap().connect().await.unwrap();
    tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
        .await
        .unwrap()
        .into_inner()
        .status
}

pub(crate) const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

pub(crate) async fn client(s: &InProc) -> ScdClient<Channel> {
    for _ in 0..200 {
        if health(&s.grpc, "scd.v1.Scd").await == SERVING {
            let ch = Channel::from_shared(s.grpc.clone()).unwrap().connect().await.unwrap();
            return ScdClient::new(ch);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("in-process server never became SERVING");
}

pub(crate) fn embed(texts: &[&str], kind: pb::InputKind) -> pb::EmbedRequest {
    pb::EmbedRequest { texts: texts.iter().map(|t| t.to_string()).collect(), kind: kind as i32, windows: true }
}

/// One HTTP/1.1 GET; the whole response.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await.expect("answered").unwrap();
    out
}

pub(crate) async fn scrape(s: &InProc) -> String {
    let r = http_get(s.http, "/metrics").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    r
}

/// Sum of the samples of `name` whose labels include every `labels` pair.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (n, rest) = key.split_once('{').unwrap_or((key, ""));
            (n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_depth_gauge_stays_within_the_queue_and_returns_to_zero() {
    let enc = TestEncoder::new(5);
    let s = start(enc, Limits { queue_size: 4, batch_texts: 1, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut c = c.clone();
        // alternating kinds: a job of the other kind is put back for the next batch
        let kind = if i % 2 == 0 { pb::InputKind::Query } else { pb::InputKind::Passage };
        tasks.push(tokio::spawn(async move { c.embed(embed(&[&format!("text {i}")], kind)).await }));
    }
    let mut max_depth = 0f64;
    let mut scrapes = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        let m = scrape(&s).await;
        let d = metric(&m, "scd_queue_depth", &[]);
        max_depth = max_depth.max(d);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (mut ok, mut full) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.code() == Code::ResourceExhausted => full += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok > 0 && scrapes > 3, "ok {ok}, full {full}, scrapes {scrapes}");
    assert!(max_depth <= 4.0, "scd_queue_depth reached {max_depth}, over --queue-size 4");
    eprintln!("scd_queue_depth peaked at {max_depth} over {scrapes} scrapes; {ok} ok, {full} refused");
    let m = scrape(&s).await;
    assert_eq!(metric(&m, "scd_queue_depth", &[]), 0.0, "{m}");
    assert_eq!(metric(&m, "scd_rejected_total", &[("kind", "embed_queue_full")]), full as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoder_panic_stops_serving_and_later_requests_are_unavailable() {
    let s = start(TestEncoder::new(0), limits(), HttpLimits::default()).await;
    let mut c = client(&s).await;
    assert!(c.embed(embed(&["fine"], pb::InputKind::Query)).await.is_ok());
    assert_eq!(health(&s.grpc, "").await, SERVING);

    let err = c.embed(embed(&[MAGIC], pb::InputKind::Query)).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert_eq!(err.message(), "the encoder failed; the server's log has the cause", "no panic text: {err:?}");
    let mut states = (0, 0);
    for _ in 0..100 {
        states = (health(&s.grpc, "scd.v1.Scd").await, health(&s.grpc, "").await);
        if states == (NOT_SERVING, NOT_SERVING) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(states, (NOT_SERVING, NOT_SERVING), "health after the encoder thread died");
    let err = c.embed(embed(&["after"], pb::InputKind::Query)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(err.message(), "encoder thread stopped; the server's log has the cause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_stay_within_the_token_budget() {
    let budget = 64;
    let s = start(TestEncoder::new(20), Limits { max_batch_tokens: budget, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    // 10 words + 2 specials = 12 tokens a request: at most 5 fit the budget
    let ten = |i: usize| format!("w{i} a b c d e f g h i");
    let mut tasks = Vec::new();
    for i in 0..40 {
        let mut c = c.clone();
        let t = if i == 20 { "long ".repeat(100) } else { ten(i) };
        tasks.push(tokio::spawn(async move { c.embed(embed(&[&t], pb::InputKind::Passage)).await.unwrap() }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = scrape(&s).await;
    let batches = metric(&m, "scd_batch_tokens_count", &[]);
    let within = metric(&m, "scd_batch_tokens_bucket", &[("le", "64")]);
    // the 102-token request runs alone; every other batch is within the budget
    assert!(batches - within <= 1.0, "{} batches over {budget} tokens:\n{m}", batches - within);
    let texts = metric(&m, "scd_batch_texts_sum", &[]) - 1.0; // less the warm-up
    assert!(texts / (batches - 1.0) > 1.5, "requests were batched: {texts} texts in {batches} batches");
}

/// gRPC over raw bytes: lets a test send what no generated client would.
mod raw {
    use bytes::{Buf, BufMut, Bytes};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    #[derive(Default)]
    pub struct BytesCodec;
    pub struct Enc;
    pub struct Dec;

    impl Codec for BytesCodec {
        type Encode = Bytes;
        type Decode = Bytes;
        type Encoder = Enc;
        type Decoder = Dec;
        fn encoder(&mut self) -> Enc {
            Enc
        }
        fn decoder(&mut self) -> Dec {
            Dec
        }
    }
    impl Encoder for Enc {
        type Item = Bytes;
        type Error = Status;
        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put(item);
            Ok(())
        }
    }
    impl Decoder for Dec {
        type Item = Bytes;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            Ok(Some(src.copy_to_bytes(src.remaining())))
        }
    }

    pub async fn call(addr: &str, method: &'static str, body: Vec<u8>) -> Result<Bytes, Status> {
        let ch = tonic::transport::Channel::from_shared(addr.to_string()).unwrap().connect().await.unwrap();
        let mut g = tonic::client::Grpc::new(ch);
        g.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(method);
        g.unary(tonic::Request::new(Bytes::from(body)), path, BytesCodec).await.map(|r| r.into_inner())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_oversized_and_sessionless_requests_are_invalid_argument() {
    use prost::Message;
    let s = start(TestEncoder::new(0), Limits { max_request_bytes: 1024, ..limits() }, HttpLimits::default()).await;
    let mut c = client(&s).await;
    let embed_path = "/scd.v1.Scd/Embed";
    // texts[0] = bytes C3 28: not UTF-8
    let err = raw::call(&s.grpc, embed_path, vec![0x0a, 0x02, 0xc3, 0x28, 0x10, 0x01]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("message is not valid protobuf: "), "{err:?}");
    assert!(err.message().contains("UTF-8"), "{err:?}");
    // not protobuf at all
    let err = raw::call(&s.grpc, embed_path, vec![0xff; 7]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("message is not valid protobuf: "), "{err:?}");
    // over --max-request-bytes
    let big = embed(&[&"x".repeat(2000)], pb::InputKind::Query).encode_to_vec();
    let n = big.len();
    let err = raw::call(&s.grpc, embed_path, big).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(err.message(), format!("request is {n} bytes, over the limit 1024 (--max-request-bytes)"));
    // also through the generated client
    let err = c.embed(embed(&[&"x".repeat(2000)], pb::InputKind::Query)).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, format!("request is {n} bytes, over the limit 1024 (--max-request-bytes)").as_str())
    );
    // empty session ids
    let err = c
        .request_context(pb::ContextRequest {
            specific_question: "x".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "session_id: must not be empty"));
    let err = c.close_session(pb::CloseSessionRequest::default()).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "session_id: must not be empty"));

    let m = scrape(&s).await;
    let count = |method, code| metric(&m, "scd_requests_total", &[("method", method), ("code", code)]);
    assert_eq!(count("Embed", "InvalidArgument"), 4.0, "{m}");
    assert_eq!(count("RequestContext", "InvalidArgument"), 1.0, "{m}");
    assert_eq!(count("CloseSession", "InvalidArgument"), 1.0, "{m}");
    assert_eq!(count("Embed", "Internal") + count("Embed", "OutOfRange"), 0.0, "{m}");
    assert!(count("grpc.health.v1.Health/Check", "Ok") >= 1.0, "health checks are counted too: {m}");
}

/// A deadline's outcome as a caller sees it: the server answers
/// DEADLINE_EXCEEDED just before the caller's own timer fires; tonic's
/// client reports its own expiry as CANCELLED "Timeout expired".
pub(crate) fn is_deadline(e: &tonic::Status) -> bool {
    e.code() == Code::DeadlineExceeded || (e.code() == Code::Cancelled && e.message().contains("Timeout expired"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_and_cancelled_embeds_never_reach_the_encoder() {
    let enc = TestEncoder::new(0);
    let s = start(enc.clone(), Limits { batch_texts: 1, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    let before = metric(&scrape(&s).await, "scd_encoder_texts_total", &[]);
    enc.delay_ms.store(600, Ordering::SeqCst);
    // occupies the encoder for 600 ms
    let mut busy = c.clone();
    let busy = tokio::spawn(async move { busy.embed(embed(&["busy"], pb::InputKind::Query)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // four requests with 150 ms deadlines and two that the client abandons
    let mut timed = Vec::new();
    for i in 0..4 {
        let mut c = c.clone();
        timed.push(tokio::spawn(async move {
            let mut r = tonic::Request::new(embed(&[&format!("late {i}")], pb::InputKind::Query));
            r.set_timeout(Duration::from_millis(150));
            c.embed(r).await
        }));
    }
    for i in 0..2 {
        let mut c = c.clone();
        let h = tokio::spawn(async move { c.embed(embed(&[&format!("gone {i}")], pb::InputKind::Query)).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        h.abort();
    }
    let mut server_side = 0;
    for t in timed {
        let e = t.await.unwrap().unwrap_err();
        assert!(is_deadline(&e), "{e:?}");
        server_side += usize::from(e.code() == Code::DeadlineExceeded);
    }
    busy.await.unwrap().unwrap();
    enc.delay_ms.store(0, Ordering::SeqCst);
    let mut c2 = c.clone();
    c2.embed(embed(&["after"], pb::InputKind::Query)).await.unwrap();
    let m = scrape(&s).await;
    assert_eq!(metric(&m, "scd_encoder_texts_total", &[]) - before, 2.0, "only 'busy' and 'after' were encoded: {m}");
    assert_eq!(metric(&m, "scd_jobs_dropped_total", &[("reason", "deadline")]), 4.0, "{m}");
    assert_eq!(metric(&m, "scd_jobs_dropped_total", &[("reason", "cancelled")]), 2.0, "{m}");
    let count = |code| metric(&m, "scd_requests_total", &[("method", "Embed"), ("code", code)]);
    assert_eq!(count("DeadlineExceeded"), 4.0, "{m}");
    assert_eq!(count("Cancelled"), 2.0, "{m}");
    eprintln!("{server_side} of 4 callers saw the server's DEADLINE_EXCEEDED before their own timer");
}

pub(crate) fn big_compress(tag: &str) -> pb::CompressRequest {
    // many short paragraphs: more chunks than one encoder call takes
    let field = |f: usize| pb::Field {
        name: format!("notes_{f}"),
        kind: pb::FieldKind::Prose as i32,
        content: (0..400)
            .map(|i| format!("Paragraph {tag} {f} {i}: the checkout service logged charge failure number {i}.\n\n"))
            .collect(),
        confidential: false,
    };
    pb::CompressRequest {
        task: Some(pb::Task { description: "Why are charges failing?".into(), ..Default::default() }),
        fields: (0..4).map(field).collect(),
        requirement: Some(pb::ContextRequirement { max_context_tokens: 200, ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compress_past_its_deadline_frees_its_slot() {
    let enc = TestEncoder::new(0);
    let s = start(enc.clone(), Limits { max_concurrent_compress: 2, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    let calls = enc.calls.load(Ordering::SeqCst);
    c.clone().compress(big_compress("probe")).await.unwrap();
    let per_compress = enc.calls.load(Ordering::SeqCst) - calls;
    assert!(per_compress >= 4, "the test needs a compress of several encoder calls, got {per_compress}");
    enc.delay_ms.store(400, Ordering::SeqCst);
    // two calls of >= 4 x 400 ms with 300 ms deadlines take both slots
    let mut timed = Vec::new();
    for i in 0..2 {
        let mut c = c.clone();
        timed.push(tokio::spawn(async move {
            let mut r = tonic::Request::new(big_compress(&format!("t{i}")));
            r.set_timeout(Duration::from_millis(300));
            c.compress(r).await
        }));
    }
    for t in timed {
        let e = t.await.unwrap().unwrap_err();
        assert!(is_deadline(&e), "{e:?}");
    }
    enc.delay_ms.store(0, Ordering::SeqCst);
    // the workers stop at their next stage boundary (<= one 400 ms call)
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t = Instant::now();
    let r = c.clone().compress(big_compress("after")).await;
    assert!(r.is_ok(), "slots still held 900 ms after the deadlines: {r:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    let m = scrape(&s).await;
    assert_eq!(metric(&m, "scd_requests_total", &[("method", "Compress"), ("code", "DeadlineExceeded")]), 2.0, "{m}");
}

// ---------------------------------------------------------------------------
// through the real `scd serve` binary (needs the models)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_logs_a_few_lines_and_counts_every_rejection() {
    if !crate::ready() {
        return;
    }
    let log = std::env::temp_dir().join(format!("scd-serving-overload-{}.log", std::process::id()));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_scd"))
        .current_dir(crate::root())
        .env("SCD_ORT_LIB", crate::root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", crate::root().join("models/out"))
        // the persistent embedding cache is tested on its own
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2")
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--queue-size",
            "1",
            "--batch-texts",
            "4",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut grpc, mut http) = (None, None);
    while grpc.is_none() || http.is_none() {
        let line = lines.next().expect("server printed its addresses").unwrap();
        if let Some(a) = line.strip_prefix("listening on ") {
            grpc = Some(format!("http://{a}"));
        }
        if let Some(a) = line.strip_prefix("metrics on http://") {
            http = Some(a.trim_end_matches("/metrics").parse::<SocketAddr>().unwrap());
        }
    }
    let s = InProc { grpc: grpc.unwrap(), http: http.unwrap(), _stop: tokio::sync::oneshot::channel().0 };
    let c = client(&s).await;
    let long: Vec<String> = (0..4).map(|i| format!("{i} ") + &"context budget tokens agents ".repeat(80)).collect();
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let mut c = c.clone();
        let texts = long.clone();
        tasks.push(tokio::spawn(async move {
            c.embed(pb::EmbedRequest { texts, kind: pb::InputKind::Passage as i32, windows: true }).await
        }));
    }
    let mut exhausted = 0;
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            exhausted += 1;
        }
    }
    let m = scrape(&s).await;
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(exhausted >= 50, "only {exhausted} of 300 were refused");
    let lines = stderr.lines().filter(|l| l.contains("embed queue full")).count();
    assert!((1..=3).contains(&lines), "{lines} rejection lines for {exhausted} rejections:\n{stderr}");
    eprintln!("{exhausted} of 300 requests refused; {lines} WARN line(s) about it");
    assert_eq!(metric(&m, "scd_rejected_total", &[("kind", "embed_queue_full")]), exhausted as f64, "{m}");
    assert_eq!(
        metric(&m, "scd_requests_total", &[("method", "Embed"), ("code", "ResourceExhausted")]),
        exhausted as f64,
        "{m}"
    );
}

#[test]
fn python_grpcio_reflection_v1alpha_resolves_the_service() {
    if !crate::ready() {
        return;
    }
    let python = crate::root().join(".tools/venv/bin/python");
    let has_grpcio = std::process::Command::new(&python)
        .args(["-c", "import grpc, grpc_reflection"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_grpcio {
        return crate::skip(&format!("{} lacks grpcio/grpcio-reflection; run models/setup.sh", python.display()));
    }
    let server = crate::grpc::start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // SERVING first, so the check below is about reflection alone
    rt.block_on(async { drop(crate::grpc::client(&server).await) });
    let out = std::process::Command::new(&python)
        .arg(crate::root().join("service/tests/py/reflection_check.py"))
        .arg(server.addr.trim_start_matches("http://"))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("scd.v1.Scd") && stdout.contains("Compress"), "{stdout}");
}

/// A raw socket to `addr` from the loopback address `from` (any 127.x.y.z
/// is local on Linux): another peer, as far as per-peer caps go.
pub(crate) async fn socket_from(from: &str, addr: &str) -> tokio::net::TcpStream {
    let to: SocketAddr = addr.trim_start_matches("http://").parse().unwrap();
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// An Scd client whose connections come from `from`.
pub(crate) async fn client_from(from: &str, addr: &str) -> ScdClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(addr.to_string())
        .unwrap()
        .local_address(Some(from.parse().unwrap()))
        .connect()
        .await
        .unwrap();
    ScdClient::new(ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_long_embed_stops_between_pieces_and_frees_the_encoder() {
    let enc = TestEncoder::new(0);
    // a 40-text request is over the batch budget: it runs alone
    let s = start(enc.clone(), Limits { max_batch_tokens: 64, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    enc.piece_ms.store(100, Ordering::SeqCst);
    let texts: Vec<String> = (0..40).map(|i| format!("long windowed text number {i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let long = embed(&refs, pb::InputKind::Passage);
    // one caller gives up after 300 ms (its deadline), one walks away
    let mut timed = c.clone();
    let mut r = tonic::Request::new(long.clone());
    r.set_timeout(Duration::from_millis(300));
    let e = timed.embed(r).await.unwrap_err();
    assert!(is_deadline(&e), "{e:?}");
    let t = Instant::now();
    let mut short = c.clone();
    short.embed(embed(&["short"], pb::InputKind::Query)).await.unwrap();
    let waited = t.elapsed();
    let mut gone = c.clone();
    let h = tokio::spawn(async move { gone.embed(long).await });
    tokio::time::sleep(Duration::from_millis(250)).await;
    h.abort();
    let t2 = Instant::now();
    short.embed(embed(&["short again"], pb::InputKind::Query)).await.unwrap();
    let waited2 = t2.elapsed();
    let pieces = enc.pieces.load(Ordering::SeqCst);
    // 80 texts were asked for; each caller stopped within a piece or two
    assert!(pieces < 20, "{pieces} of 80 pieces ran for callers that had gone");
    eprintln!(
        "after the deadline a short embed waited {waited:?}; after the walk-away {waited2:?}; {pieces} pieces ran"
    );
}

/// The finding: one request within the byte limits could cost a minute of
/// CPU. A request may spend at most `max_encoder_tokens` encoder tokens
/// (`--max-request-encoder-tokens`): an Embed over it and a Compress whose
/// context would cost more to embed are INVALID_ARGUMENT naming the field
/// and the limit, unrun; smaller ones are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_its_encoder_tokens_is_refused_unrun_naming_the_limit() {
    let enc = TestEncoder::new(0);
    let scd = scd_engine::extract::ScdConfig {
        limits: scd_engine::extract::RequestLimits { max_encoder_tokens: 2000, ..Default::default() },
        ..Default::default()
    };
    let s = crate::inproc::start(Options {
        encoder: enc.clone(),
        limits: limits(),
        http: HttpLimits::default(),
        scd,
        ..Default::default()
    });
    let mut c = client(&s).await;
    let before = enc.calls.load(Ordering::SeqCst);
    // 1,200 tokens each, in 3 windows of 510 with two specials each: 1,206
    let long = "word ".repeat(1200);
    let e = c.embed(embed(&[long.as_str(), long.as_str()], pb::InputKind::Passage)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().starts_with(
            "texts: 2412 encoder tokens, over the limit of 2000 per request (--max-request-encoder-tokens)"
        ),
        "{}",
        e.message()
    );
    let e = c.compress(big_compress("spend")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("context: embedding its ") && e.message().contains("over the limit of 2000 per request"),
        "{}",
        e.message()
    );
    assert_eq!(enc.calls.load(Ordering::SeqCst), before, "the encoder ran for a refused request");
    let ok = c.embed(embed(&[long.as_str()], pb::InputKind::Passage)).await.unwrap().into_inner();
    assert_eq!(ok.embeddings.len(), 1);
}
