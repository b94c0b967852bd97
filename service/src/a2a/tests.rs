use super::*;
use axum::http::StatusCode;
use scd_engine::extract::ScdConfig;

fn msg(parts: Value) -> Message {
    serde_json::from_value(json!({"messageId": "m", "role": "ROLE_USER", "parts": parts})).unwrap()
}

/// An agent over the engine's hash encoder (no model), two compress
/// slots.
fn agent_with(scd: ScdConfig, store: StoreLimits) -> (Arc<Agent>, Arc<Core>) {
    let scd = Arc::new(scd_engine::extract::Scd::new(Arc::new(scd_engine::encoder::HashEncoder::new(64, 512)), scd));
    let limits = crate::app::Limits {
        max_texts: 256,
        max_text_bytes: 1 << 20,
        max_fields: 256,
        max_request_bytes: 16 << 20,
        queue_size: 256,
        batch_texts: 64,
        max_batch_tokens: 8192,
        max_concurrent_compress: 2,
    };
    let metrics = Arc::new(crate::app::metrics::Metrics::new(limits.max_batch_tokens));
    let svc = Arc::new(Core::new(scd, limits, metrics));
    let cfg = A2aConfig {
        store,
        state: None,
        max_request_bytes: 16 << 20,
        grpc_addr: "127.0.0.1:1".parse().unwrap(),
        grpc_scheme: "http",
        did_wba: false,
        public_url: None,
        http_addr: "127.0.0.1:2".parse().unwrap(),
        http_scheme: "http",
    };
    (Arc::new(Agent::new(svc.clone(), cfg)), svc)
}

/// A SendMessage request of `message` (keys of a `Message`).
fn send_req(message: Value) -> SendMessageRequest {
    let mut m = json!({"messageId": types::uuid_v4(), "role": "ROLE_USER"});
    m.as_object_mut().unwrap().extend(message.as_object().unwrap().clone());
    serde_json::from_value(json!({ "message": m })).unwrap()
}

fn compress_part(task: Option<&str>) -> Value {
    let mut d = json!({"context": {"fields": [
        {"name": "logs", "kind": "log", "content": "ERROR payments::db: connection pool exhausted\nWARN retry 3"},
        {"name": "api_keys", "content": "sk_live_SECRET_4242", "confidential": true}]}, "budget": 100});
    if let Some(t) = task {
        d["task"] = json!(t);
    }
    json!({ "data": d })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_does_not_strand_its_task() {
    let (a, _) = agent_with(ScdConfig::default(), StoreLimits::default());
    // polled once (the task is accepted, its run started), then dropped
    // as the HTTP handler is when its client disconnects
    let mut part = compress_part(Some("why?"));
    // enough content that the run cannot end within one poll
    part["data"]["context"]["fields"][0]["content"] =
        json!((0..2000).map(|i| format!("ERROR pool {i} exhausted\n")).collect::<String>());
    let send = a.send(send_req(json!({ "parts": [part] })), Caller::default());
    assert!(tokio::time::timeout(std::time::Duration::ZERO, send).await.is_err(), "answered at once");
    let page = store::Page { offset: 0, size: 1, history: 0, artifacts: false };
    let id = a.store().list(&store::ListFilter::default(), "local", page).unwrap().1[0].id.clone();
    let mut state = TaskState::Working;
    for _ in 0..500 {
        state = a.store().get(&id, "local").unwrap().status.state;
        if state.is_terminal() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(state, TaskState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_on_a_gone_session_asks_for_the_context_again() {
    let (a, svc) = agent_with(ScdConfig::default(), StoreLimits::default());
    let first = a
        .send(send_req(json!({"parts": [compress_part(Some("why do charges fail?"))]})), Caller::default())
        .await
        .unwrap();
    assert_eq!(first.status.state, TaskState::Completed);
    let ctx = first.context_id.clone();
    // the engine loses the session (expiry and eviction answer the same)
    let session = a.store().session("local", &ctx).unwrap().unwrap();
    assert!(svc.scd.close_session(&session.id, &session.token, None, None).unwrap());
    let q = a
        .send(send_req(json!({"contextId": ctx, "parts": [{"text": "which pool is exhausted?"}]})), Caller::default())
        .await
        .unwrap();
    assert_eq!(q.status.state, TaskState::InputRequired, "{:?}", q.status);
    let note = q.status.message.as_ref().unwrap().parts[0].text.clone().unwrap();
    assert!(note.starts_with("the context's session expired; send the context again"), "{note}");
    assert!(a.store().session("local", &ctx).unwrap().is_none());
    // the context again, in that task: compressed, the task completes
    let again =
        a.send(send_req(json!({"taskId": q.id, "parts": [compress_part(None)]})), Caller::default()).await.unwrap();
    assert_eq!(again.status.state, TaskState::Completed, "{:?}", again.status);
    assert_eq!(again.id, q.id);
    assert_eq!(again.artifacts[0].name, "minimal-sufficient-context");
    assert!(a.store().session("local", &ctx).unwrap().is_some_and(|s| s != session));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_takes_the_message_back_and_answers_a_retry_hint() {
    let (a, svc) = agent_with(ScdConfig::default(), StoreLimits::default());
    let held = svc.compress_slots.clone().try_acquire_many_owned(2).unwrap();
    let e = a.send(send_req(json!({"parts": [compress_part(Some("why?"))]})), Caller::default()).await.unwrap_err();
    assert_eq!(e.code(), -32000);
    assert_eq!(e.to_string(), "resource exhausted: compress queue is full; retry after 100 ms");
    assert_eq!(e.to_json()["data"]["retryAfterMs"], 100);
    assert!(a.store().is_empty(), "no failed task is kept");
    // a continued task (a question waiting for its context) returns to
    // where it was, without the message
    let waiting =
        a.send(send_req(json!({"parts": [{"text": "why do charges fail?"}]})), Caller::default()).await.unwrap();
    assert_eq!(waiting.status.state, TaskState::Working);
    let more = send_req(json!({"taskId": waiting.id, "parts": [compress_part(None)]}));
    assert_eq!(a.send(more.clone(), Caller::default()).await.unwrap_err().code(), -32000);
    assert_eq!(a.store().get(&waiting.id, "local").unwrap(), waiting);
    drop(held);
    let done = a.send(more, Caller::default()).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed, "{:?}", done.status);
    assert_eq!(done.history.len(), 4, "question, its note, the data part, the result");
}

#[test]
fn data_parts_are_parsed_strictly_and_errors_name_the_path() {
    let ok = classify(&msg(json!([{"data": {"task": "t", "context": {"fields": []}, "budget": 10}}])));
    assert!(matches!(ok, Ok(Input::Compress(_))));
    let Err(e) = classify(&msg(
        json!([{"data": {"task": "t", "context": {"fields": [{"name": "a", "content": "x", "secret": true}]}, "budget": 10}}]),
    )) else {
        panic!()
    };
    assert_eq!(e.code(), -32602);
    assert!(
        e.to_string()
            .starts_with("invalid params: message.parts[0].data.context.fields[0].secret: unknown field `secret`"),
        "{e}"
    );
    let Err(e) = classify(&msg(json!([{"data": {"task": "t", "context": {"fields": []}, "budget": 0}}]))) else {
        panic!()
    };
    assert_eq!(e.to_string(), "invalid params: message.parts[0].data.budget: must be at least 1");
    // protobuf Struct clients send 150 as 150.0; 150.5 and -1 are refused
    assert!(classify(&msg(json!([{"data": {"context": {"fields": []}, "budget": 150.0}}]))).is_ok());
    for bad in [json!(150.5), json!(-1), json!(1e12)] {
        let Err(e) = classify(&msg(json!([{"data": {"context": {"fields": []}, "budget": bad}}]))) else {
            panic!("budget {bad} accepted")
        };
        assert!(e.to_string().contains("data.budget: expected a whole number of tokens"), "{e}");
    }
    let Err(e) = classify(&msg(json!([{"url": "https://x/y.txt"}]))) else { panic!() };
    assert_eq!(e.code(), -32005);
    let Err(e) = classify(&msg(json!([{"text": "a", "data": {}}]))) else { panic!() };
    assert!(e.to_string().contains("exactly one of text, raw, url or data, got 2"));
}

#[test]
fn a_context_sent_as_a_string_or_content_in_kind_is_never_quoted_back() {
    let secret = "The production payment gateway key is sk_live_SECRET_4242";
    let as_string = json!({"fields": [{"name": "k", "content": secret, "confidential": true}]}).to_string();
    for data in [
        json!({"task": "t", "context": as_string, "budget": 10}),
        json!({"task": "t", "context": {"fields": [{"name": "k", "kind": secret, "content": "x"}]}, "budget": 10}),
    ] {
        let Err(e) = classify(&msg(json!([{ "data": data }]))) else { panic!("accepted") };
        assert_eq!(e.code(), -32602);
        let text = e.to_string();
        assert!(!text.contains("sk_live") && !text.contains("gateway"), "{text}");
        assert!(text.starts_with("invalid params: message.parts[0].data.context"), "{text}");
    }
}

/// A value a client puts in ListTasks' filters or the tenant is named
/// by its key, never quoted: a careless client may paste anything.
#[test]
fn list_filters_and_the_tenant_are_refused_without_quoting_them() {
    let (agent, _) = agent_with(ScdConfig::default(), StoreLimits::default());
    let secret = "The production payment gateway key is sk_live_SECRET_4242";
    let who = Caller::default();
    for (key, want) in [
        ("status", "invalid params: status: not a TaskState"),
        ("pageToken", "invalid params: pageToken: not a token"),
        ("statusTimestampAfter", "invalid params: statusTimestampAfter: not an RFC 3339"),
        ("tenant", "invalid params: tenant: this agent has no tenants"),
    ] {
        let r: types::ListTasksRequest = serde_json::from_value(json!({ key: secret })).unwrap();
        let e = agent.list(r, &who).unwrap_err().to_string();
        assert!(e.starts_with(want) && !e.contains("sk_live"), "{e}");
    }
    let huge: types::GetTaskRequest = serde_json::from_value(json!({"id": "t".repeat(10_000)})).unwrap();
    let e = agent.get(huge, &who).unwrap_err().to_string();
    assert_eq!(e, "invalid params: id: 10000 bytes, the limit is 256");
    let mut req = send_req(json!({"parts": [{"text": "more"}]}));
    req.tenant = secret.into();
    let Err(e) = agent.accept(&req, &who).map(|_| ()) else { panic!("a tenant was accepted") };
    let e = e.to_string();
    assert!(e.starts_with("invalid params: tenant:") && !e.contains("sk_live"), "{e}");
}

#[test]
fn history_keeps_a_summary_of_the_context_not_its_content() {
    let m = msg(json!([{"text": "first"}, {"data": {"task": "t", "budget": 9, "context": {"fields": [
        {"name": "k", "content": "sk_live_SECRET_4242", "confidential": true},
        {"name": "p", "kind": "log", "content": "public"}]}}}]));
    let s = summarized(&m);
    assert_eq!(s.parts[0], m.parts[0]);
    assert_eq!(
        s.parts[1].data,
        Some(json!({"task": "t", "budget": 9, "context": {"fields": [
            {"name": "k", "confidential": true, "contentBytes": 19},
            {"name": "p", "kind": "log", "contentBytes": 6}]}}))
    );
    assert!(!serde_json::to_string(&s).unwrap().contains("sk_live_SECRET_4242"));
}

#[test]
fn client_chosen_ids_are_capped() {
    let long = "x".repeat(MAX_ID_BYTES + 1);
    for key in ["messageId", "contextId", "taskId"] {
        let mut m = json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "q"}]});
        m[key] = json!(long);
        let e = classify(&serde_json::from_value(m).unwrap()).err().unwrap();
        assert_eq!(e.code(), -32602);
        assert_eq!(e.to_string(), format!("invalid params: message.{key}: 257 bytes, the limit is 256"));
    }
    let mut m = msg(json!([{"text": "q"}]));
    m.context_id = Some("x".repeat(MAX_ID_BYTES));
    assert!(classify(&m).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_answers_resource_exhausted_and_tasks_hold_no_context() {
    let (a, _) = agent_with(ScdConfig::default(), StoreLimits { max_bytes: 6000, ..StoreLimits::default() });
    let mut part = compress_part(Some("why?"));
    let big = (0..200).map(|i| format!("ERROR pool {i} exhausted\n")).collect::<String>();
    part["data"]["context"]["fields"][0]["content"] = json!(big);
    let t = a.send(send_req(json!({ "parts": [part] })), Caller::default()).await.unwrap();
    assert_eq!(t.status.state, TaskState::Completed);
    let history = serde_json::to_string(&t.history).unwrap();
    assert!(!history.contains("pool 7 exhausted") && history.contains(&format!("\"contentBytes\":{}", big.len())));
    // completed tasks give way; questions waiting for their context
    // stay working and fill the store
    let mut full = None;
    for _ in 0..100 {
        if let Err(e) = a.send(send_req(json!({"parts": [{"text": "which pool?"}]})), Caller::default()).await {
            full = Some(e);
            break;
        }
    }
    let e = full.expect("the byte budget was never reached");
    assert_eq!(e.code(), -32000);
    assert!(e.to_string().contains("holds 6000 bytes (the limit, --a2a-max-bytes)"), "{e}");
    // the first task expires in an hour, less the test's time
    let ms = e.to_json()["data"]["retryAfterMs"].as_u64().unwrap();
    assert!((3_590_000..=3_600_000).contains(&ms), "{ms}");
}

#[test]
fn a_text_part_is_a_question_with_its_confidence() {
    let mut m = msg(json!([{"text": "where is the pool?"}]));
    m.metadata = Some(serde_json::from_value(json!({"currentConfidence": 0.4})).unwrap());
    let Ok(Input::Question { text, confidence }) = classify(&m) else { panic!() };
    assert_eq!((text.as_str(), confidence), ("where is the pool?", Some(0.4)));
    m.metadata = Some(serde_json::from_value(json!({"currentConfidence": 7})).unwrap());
    assert!(classify(&m).err().unwrap().to_string().contains("currentConfidence: must be a number in [0, 1], got 7"));
}

#[test]
fn versions_absent_or_1_0_are_served() {
    let mut h = HeaderMap::new();
    assert!(Agent::check_version(&h, None).is_ok());
    assert!(Agent::check_version(&h, Some("A2A-Version=1.0")).is_ok());
    assert_eq!(Agent::check_version(&h, Some("A2A-Version=0.3")).unwrap_err().code(), -32009);
    h.insert("A2A-Version", "1.0".parse().unwrap());
    assert!(Agent::check_version(&h, None).is_ok());
    h.insert("A2A-Version", "2.0".parse().unwrap());
    assert_eq!(
        Agent::check_version(&h, None).unwrap_err().to_string(),
        "A2A-Version 2.0: not supported; this agent speaks 1.0"
    );
}

#[test]
fn error_codes_follow_the_spec() {
    assert_eq!(Error::TaskNotFound("x".into()).code(), -32001);
    assert_eq!(Error::PushNotSupported.code(), -32003);
    assert_eq!(Error::NoExtendedCard.code(), -32007);
    assert_eq!(Error::TaskNotFound("x".into()).http_status(), StatusCode::NOT_FOUND);
    let e = Error::Exhausted { what: "task store", limit: 1, unit: "tasks", flag: "--a2a-max-tasks", retry_after_s: 1 };
    assert_eq!(e.to_json()["data"]["retryAfterMs"], 1000);
}
