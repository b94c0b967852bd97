//! Starting, serving and draining: `scd.v1.Scd` with health and reflection
//! on one listener (plaintext, TLS or mTLS), metrics on the HTTP one.
//!
//! Drain: on SIGTERM or Ctrl-C health turns NOT_SERVING (for `""` and
//! `scd.v1.Scd`) at once, new calls are refused with UNAVAILABLE while the
//! listener stays open (so probes read NOT_SERVING), calls in flight finish,
//! then the server stops; after `drain_timeout` it stops anyway and logs how
//! many calls it cut.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use scd_engine::encoder::{EncodeOptions, InputKind};
use scd_engine::extract::Scd;
use tonic::transport::ServerTlsConfig;
use tonic_health::ServingStatus;
use tracing::{error, info, warn};

use crate::app::metrics::Metrics;
use crate::app::{Core, Limits, Ready};
use crate::auth::{Auth, AuthConfig, AuthLayer};
use crate::grpc::layer::ObserveLayer;
use crate::grpc::{pb, ScdHandler, DESCRIPTOR};
use crate::http::{serve_metrics, HttpLimits};

/// How often the server pings a connection's peer over HTTP/2.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything `serve` needs. The listeners are bound by the caller, so a
/// port in use is reported (naming its flag) before the model loads.
pub struct ServeConfig {
    /// gRPC listener.
    pub listener: std::net::TcpListener,
    /// Its connection caps and idle timeouts (`--grpc-max-connections`, …).
    pub connections: scd_net::ConnLimits,
    /// Metrics listener.
    pub http_listener: Option<std::net::TcpListener>,
    /// Limits.
    pub limits: Limits,
    /// Metrics listener limits.
    pub http: HttpLimits,
    /// TLS (and mTLS when it names a client CA); `None` serves plaintext.
    pub tls: Option<ServerTlsConfig>,
    /// TLS of the HTTP listener (the same files as `tls`).
    pub http_tls: Option<Arc<rustls::ServerConfig>>,
    /// Longest wait for calls in flight after SIGTERM before exiting anyway.
    pub drain_timeout: Duration,
    /// `--auth did-wba`: DID-authenticated callers on both listeners; `None`
    /// admits everyone (`--auth none`).
    pub auth: Option<AuthConfig>,
    /// The audit trail (`--audit-db`); `None` records nothing.
    pub audit: Option<Arc<scd_audit::AuditLog>>,
    /// Who may read the audit trail (`--audit-token-file`: the operator's
    /// token reads every record).
    pub audit_access: crate::grpc::audit::AuditAccess,
    /// A2A task store bounds (the A2A routes are on the HTTP listener).
    pub a2a: crate::a2a::store::StoreLimits,
    /// The A2A tasks' shared store (`--state`); `None` keeps them in this
    /// process.
    pub a2a_state: Option<Arc<crate::redis::tasks::RedisTasks>>,
    /// The HTTP listener's public URL for the agent card (`None`: the
    /// listener's own address); the gRPC interface is listed on its host.
    pub a2a_public_url: Option<String>,
    /// The budget tokenizers requests may name (`--budget-tokenizer NAME=PATH`
    /// plus the built-ins).
    pub tokenizers: scd_engine::budget::TokenizerRegistry,
    /// What a hand-off report's confidence level stands for (`--confidence-map`).
    pub confidence_map: scd_engine::handoff::ConfidenceMap,
    /// Serve the page at `/ui` on the HTTP listener (`--no-ui` turns it off).
    pub ui: bool,
}

/// Runs the server until Ctrl-C / SIGTERM, then drains in-flight requests
/// (see the module docs).
pub async fn serve(scd: Arc<Scd>, cfg: ServeConfig) -> anyhow::Result<()> {
    serve_on(scd, cfg, shutdown_signal()).await
}

/// The HTTP listener's lines of the start-up banner: the A2A agent card, the REST API and the page.
fn print_http_banner(scheme: &str, addr: std::net::SocketAddr, ui: bool) {
    println!("A2A agent card on {scheme}://{addr}/.well-known/agent-card.json");
    println!("REST API on {scheme}://{addr}/v1 (OpenAPI document at /openapi.json)");
    if ui {
        println!("page on {scheme}://{addr}/ui");
    }
}

/// [`serve`] until `shutdown` completes instead of a signal; tests run a
/// server in-process with this.
pub async fn serve_on(scd: Arc<Scd>, mut cfg: ServeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(cfg.limits.max_batch_tokens));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_not_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
    health.set_service_status("", ServingStatus::NotServing).await;
    let auth = cfg.auth.take().map(|a| Arc::new(Auth::new(a, metrics.clone())));
    let service = Arc::new(
        Core::new(scd.clone(), cfg.limits.clone(), metrics.clone())
            .with_audit(cfg.audit.take())
            .with_audit_access(std::mem::take(&mut cfg.audit_access))
            .with_tokenizers(std::mem::take(&mut cfg.tokenizers))
            .with_confidence_map(cfg.confidence_map),
    );
    // v1 and v1alpha: Python's grpcio-reflection client speaks only v1alpha
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(DESCRIPTOR)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let local = cfg.listener.local_addr()?;
    let drain = Drain::default();
    if let Some(http) = cfg.http_listener.take() {
        spawn_http(http, &cfg, local, &service, &auth, &drain)?;
    }
    let listener = tokio_listener(cfg.listener)?;
    println!("listening on {local}");
    info!(addr = %local, tls = cfg.tls.is_some(), auth = auth.is_some(), "gRPC listener");
    spawn_readiness(&scd, &service, &health, &drain);
    if let Some(store) = scd.shared_state().cloned() {
        tokio::spawn(watch_store(store, service.readiness().clone(), health.clone()));
    }
    let ready = service.readiness().clone();
    let svc = pb::scd_server::ScdServer::new(ScdHandler(service))
        .max_decoding_message_size(cfg.limits.max_request_bytes)
        .max_encoding_message_size(64 << 20);
    // caps per listener and per peer, a reserve for health checks, idle
    // and silent connections closed (scd_net); each closing or refusal is
    // counted in scd_rejected_total{kind}
    let counted = metrics.clone();
    let guard = scd_net::ConnGuard::with_events(
        cfg.connections,
        Some(Arc::new(move |e: scd_net::Event| counted.rejected(e.as_str()))),
    );
    let incoming = guard.incoming(listener);
    // server pings find peers that vanished without closing (a call in
    // flight keeps a connection open, so the idle timeout cannot)
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT));
    if let Some(tls) = cfg.tls {
        builder = builder.tls_config(tls)?;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = builder
        // outermost: a call refused on a reserve connection is not counted
        // as a call, and every other call keeps its connection open
        .layer(guard.layer())
        .layer(DrainLayer(drain.clone()))
        .layer(ObserveLayer::new(metrics))
        // inside the counting layer: a refusal is counted once
        .layer(AuthLayer(auth))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r.map_err(Into::into),
        () = shutdown => {}
    }
    drain_then_stop(server, stop_tx, &drain, &ready, &health, cfg.drain_timeout).await
}

/// The drain: refuses new calls, reports NOT_SERVING, lets the calls in
/// flight finish within `timeout`, then stops `server`.
async fn drain_then_stop<F>(
    mut server: std::pin::Pin<&mut F>,
    stop_tx: tokio::sync::oneshot::Sender<()>,
    drain: &Drain,
    ready: &crate::app::Readiness,
    health: &tonic_health::server::HealthReporter,
    timeout: Duration,
) -> anyhow::Result<()>
where
    F: Future<Output = Result<(), tonic::transport::Error>>,
{
    // drain: refuse new calls, report NOT_SERVING, let calls in flight finish
    drain.start();
    ready.set(Ready::Draining);
    health.set_not_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
    health.set_service_status("", ServingStatus::NotServing).await;
    info!(
        in_flight = drain.in_flight(),
        timeout_s = timeout.as_secs_f64(),
        "draining: NOT_SERVING, refusing new calls"
    );
    let drained = tokio::time::timeout(timeout, async {
        tokio::select! {
            r = server.as_mut() => return r,
            () = drain.idle() => {}
        }
        let _ = stop_tx.send(());
        server.as_mut().await
    })
    .await;
    match drained {
        Ok(r) => {
            r?;
            info!("drained; bye");
        }
        Err(_) => warn!(
            cut = drain.in_flight(),
            timeout_s = timeout.as_secs_f64(),
            "drain timeout: exiting with {} call(s) still in flight",
            drain.in_flight()
        ),
    }
    Ok(())
}

/// Serves the HTTP listener `http`: metrics, health, and the A2A and REST
/// routes (and the page) over `service`, with `cfg`'s limits and TLS.
fn spawn_http(
    http: std::net::TcpListener,
    cfg: &ServeConfig,
    local: std::net::SocketAddr,
    service: &Arc<Core>,
    auth: &Option<Arc<Auth>>,
    drain: &Drain,
) -> anyhow::Result<()> {
    let l = tokio_listener(http)?;
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let http_scheme = if cfg.http_tls.is_some() { "https" } else { "http" };
    println!("metrics on {http_scheme}://{}/metrics", l.local_addr()?);
    let agent = crate::a2a::Agent::new(
        service.clone(),
        crate::a2a::A2aConfig {
            store: cfg.a2a,
            state: cfg.a2a_state.clone(),
            max_request_bytes: cfg.limits.max_request_bytes,
            grpc_addr: local,
            grpc_scheme: scheme,
            did_wba: auth.is_some(),
            public_url: cfg.a2a_public_url.clone(),
            http_addr: l.local_addr()?,
            http_scheme,
        },
    );
    print_http_banner(http_scheme, l.local_addr()?, cfg.ui);
    let mut routes = crate::a2a::router(Arc::new(agent)).merge(crate::rest::router(service.clone()));
    if cfg.ui {
        routes = routes.merge(crate::rest::ui::router(&service.tokenizers.names()));
    }
    tokio::spawn(serve_metrics(
        l,
        service.clone(),
        cfg.http,
        auth.clone(),
        Some(routes.layer(axum::middleware::from_fn_with_state(drain.clone(), http_drain))),
        cfg.http_tls.clone(),
    ));
    Ok(())
}

/// Reports SERVING once the model is warm, and NOT_SERVING for good when
/// the encoder thread stops (fail-stop) or the warm-up fails.
fn spawn_readiness(scd: &Arc<Scd>, service: &Arc<Core>, health: &tonic_health::server::HealthReporter, drain: &Drain) {
    // fail-stop: a dead encoder thread makes the whole server NOT_SERVING
    let mut stopped = service.batcher().stopped_signal();
    let stop_health = health.clone();
    let stop_ready = service.readiness().clone();
    tokio::spawn(async move {
        let cause = stopped.wait_for(|c| c.is_some()).await.ok().and_then(|c| c.clone());
        if let Some(cause) = cause {
            error!(cause = %cause, "encoder thread stopped; health NOT_SERVING");
            stop_ready.set(Ready::Stopped);
            stop_health.set_not_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
            stop_health.set_service_status("", ServingStatus::NotServing).await;
        }
    });
    // warm the model before reporting SERVING
    let warm = scd.clone();
    let batcher_alive = service.clone();
    let health_setter = health.clone();
    let warm_drain = drain.clone();
    let warm_ready = service.readiness().clone();
    tokio::spawn(async move {
        let ok = tokio::task::spawn_blocking(move || {
            warm.encoder().encode(&["warm up"], &EncodeOptions::new(InputKind::Query))
        })
        .await
        .map(|r| r.is_ok())
        .unwrap_or(false);
        if !ok || batcher_alive.batcher().stopped().is_some() {
            warn!("warm-up failed; staying NOT_SERVING");
            warm_ready.set(Ready::Stopped);
        } else if warm_drain.is_draining() {
            info!("model warm, but draining; staying NOT_SERVING");
        } else {
            health_setter.set_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
            health_setter.set_service_status("", ServingStatus::Serving).await;
            warm_ready.set_if(Ready::Starting, Ready::Serving);
            info!("model warm; SERVING");
        }
    });
}

/// A bound std listener as a tokio one.
fn tokio_listener(l: std::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutting down: draining in-flight requests");
}

// ---------------------------------------------------------------------------
// Drain: count calls in flight, refuse new ones once draining
// ---------------------------------------------------------------------------

/// Calls in flight and whether the server is draining. Health and
/// reflection are neither counted nor refused (a health Watch stream lives
/// as long as its client, and probes must read NOT_SERVING while draining).
#[derive(Clone, Default)]
struct Drain(Arc<DrainState>);

#[derive(Default)]
struct DrainState {
    draining: AtomicBool,
    in_flight: AtomicUsize,
}

/// Held while one call runs (until its response body ends).
struct InFlight(Arc<DrainState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drain {
    fn start(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }

    fn is_draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Counts a new call, or `None` when draining.
    fn enter(&self) -> Option<InFlight> {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self.0.clone());
        (!self.is_draining()).then_some(guard)
    }

    /// Resolves when no call is in flight.
    async fn idle(&self) {
        while self.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// REST and A2A calls take part in the drain as gRPC calls do: each is in
/// flight until its response body ends (an SSE stream included), and once
/// draining a new one is 503 with `Retry-After` (liveness, readiness and
/// metrics are outside this layer and keep answering).
async fn http_drain(
    axum::extract::State(drain): axum::extract::State<Drain>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Some(guard) = drain.enter() else {
        let body = serde_json::json!({"error": {
            "message": "the server is draining (shutting down); retry on another replica",
            "type": "service_unavailable", "param": null, "code": "UNAVAILABLE"}});
        let headers = [(http::header::RETRY_AFTER, "1"), (http::header::CONTENT_TYPE, "application/json")];
        return (http::StatusCode::SERVICE_UNAVAILABLE, headers, body.to_string()).into_response();
    };
    next.run(req)
        .await
        .map(|body| axum::body::Body::new(scd_net::HeldUntilEnd::new(tonic::body::Body::new(body), guard)))
}

fn exempt(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.") || path.starts_with("/grpc.reflection.")
}

#[derive(Clone)]
struct DrainLayer(Drain);

impl<S> tower_layer::Layer<S> for DrainLayer {
    type Service = DrainService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DrainService { inner, drain: self.0.clone() }
    }
}

#[derive(Clone)]
struct DrainService<S> {
    inner: S,
    drain: Drain,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for DrainService<S>
where
    S: tonic::codegen::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<tonic::body::Body>,
    >,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        if exempt(req.uri().path()) {
            return Box::pin(self.inner.call(req));
        }
        let Some(guard) = self.drain.enter() else {
            let refused = tonic::Status::unavailable("server is draining (shutting down); retry on another replica");
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| tonic::body::Body::new(scd_net::HeldUntilEnd::new(body, guard))))
        })
    }
}

/// How often the shared session store is pinged.
const STORE_PING: Duration = Duration::from_secs(1);

/// Pings the shared session store: while it does not answer the server is
/// NOT_SERVING (gRPC health, `/ready`), and SERVING again once it does. A
/// drain or a stopped encoder is left as it is.
async fn watch_store(
    store: Arc<dyn scd_engine::shared::SharedState>,
    ready: Arc<crate::app::Readiness>,
    health: tonic_health::server::HealthReporter,
) {
    let mut tick = tokio::time::interval(STORE_PING);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = store.clone();
        let answer = tokio::task::spawn_blocking(move || s.ping()).await;
        let up = matches!(answer, Ok(Ok(())));
        match (up, ready.get()) {
            (false, Ready::Serving) => {
                ready.set_if(Ready::Serving, Ready::StoreDown);
                let why = match answer {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the ping did not finish".into(),
                };
                error!(store = store.name(), error = %why, "session store down; health NOT_SERVING");
                health.set_not_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
                health.set_service_status("", ServingStatus::NotServing).await;
            }
            (true, Ready::StoreDown) => {
                ready.set_if(Ready::StoreDown, Ready::Serving);
                info!(store = store.name(), "session store answers again; SERVING");
                health.set_serving::<pb::scd_server::ScdServer<ScdHandler>>().await;
                health.set_service_status("", ServingStatus::Serving).await;
            }
            _ => {}
        }
    }
}
