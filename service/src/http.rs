//! The HTTP listener (`--http-addr`; over TLS with `--tls-cert`, mTLS with
//! `--client-ca`): Prometheus metrics at `GET /metrics`
//! (with `--auth did-wba`: signed requests only, and the DID documents of
//! `--did-dir` at their did:wba paths, see [`crate::auth`]), `/health`,
//! `/ready`, and the A2A and REST routes merged in; served by axum over
//! hyper's HTTP/1.1 connection driver with the caps, probe reserve and time
//! limits of [`conn`].

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::app::metrics::Scrape;
use crate::app::{Call, Code, Core};
use crate::auth::{http_middleware, Auth};

mod conn;

pub use conn::{CallDeadline, HttpLimits};

async fn metrics(State(service): State<Arc<Core>>) -> impl IntoResponse {
    let stats = service.scd.cache_stats();
    let sessions = service.scd.session_stats();
    let gauges = [
        ("scd_queue_depth", service.batcher.depth() as f64),
        ("scd_sessions", sessions.live as f64),
        ("scd_session_bytes", sessions.bytes as f64),
        ("scd_cache_bytes", stats.bytes as f64),
    ];
    let counters = [
        ("scd_sessions_evicted_total", sessions.evicted),
        ("scd_sessions_expired_total", sessions.expired),
        ("scd_cache_hits_total", stats.hits),
        ("scd_cache_misses_total", stats.misses),
    ];
    let model = service.scd.encoder().model_id().to_string();
    let view = Scrape { gauges: &gauges, counters: &counters, engine_encoded: service.scd.encoded(), model: &model };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], service.metrics.render(&view))
}

/// Who sends an HTTP request (A2A, REST): the DID that signed it (`--auth
/// did-wba`) and the client's address, as the listener put them in the
/// request's extensions. Sessions, shares, A2A tasks and the audit trail
/// key on these.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The DID that signed it (`--auth did-wba`): the engine binds sessions
    /// to it and the audit trail records it.
    pub did: Option<String>,
    /// The client's address (the audit trail's `peer`).
    pub addr: Option<std::net::SocketAddr>,
    /// When the core gives up on the call ([`CallDeadline`]: a little before
    /// the listener's `--http-request-timeout-ms`); `None` off the listener.
    pub deadline: Option<std::time::Instant>,
}

impl Caller {
    /// Whom its A2A tasks and contexts belong to: the key of its share over
    /// gRPC ([`crate::app::shares::key`]): `id:` the DID, else `ip:` the IP
    /// address without the port, else `local` (an in-process call).
    pub fn owner(&self) -> String {
        crate::app::shares::key(self.did.as_deref(), self.peer().as_deref())
    }

    /// The address as the audit trail records it (`ip:port`).
    pub(crate) fn peer(&self) -> Option<String> {
        self.addr.map(|a| a.to_string())
    }

    /// The caller of a request with `parts`, as the listener marked it.
    pub fn of(parts: &axum::http::request::Parts) -> Caller {
        Caller {
            did: parts.extensions.get::<crate::auth::AuthenticatedDid>().map(|d| d.0.clone()),
            addr: parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0),
            deadline: parts.extensions.get::<CallDeadline>().map(|d| d.0),
        }
    }

    /// The core's call of `method` through `surface` (`REST Compress` in
    /// the audit trail) from this caller, until its deadline.
    pub fn call(&self, surface: &str, method: &str) -> Call {
        Call::new(surface, method).from(self.did.clone(), self.peer()).until(self.deadline)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller::of(parts))
    }
}

impl aide::OperationInput for Caller {}

/// What a counting layer needs: the recorder, the label's prefix (`REST`,
/// `A2A`) and the route of a path (ids are not labels).
#[derive(Clone)]
pub(crate) struct Counted {
    pub(crate) metrics: Arc<crate::app::metrics::Metrics>,
    pub(crate) prefix: &'static str,
    pub(crate) route_of: fn(&str) -> &'static str,
}

/// Counts each call in `scd_requests_total` (method `<prefix> <verb>
/// <route>`, the code of its HTTP status, [`code_of`]) with its duration.
pub(crate) async fn counted(
    State(c): State<Counted>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let start = std::time::Instant::now();
    let method = format!("{} {} {}", c.prefix, req.method(), (c.route_of)(req.uri().path()));
    let r = next.run(req).await;
    c.metrics.request(&method, code_of(r.status()), start.elapsed().as_secs_f64());
    r
}

/// The core's code of a call an HTTP status ended: 2xx is `Ok`, 400, 413
/// and 415 `InvalidArgument`, 429 `ResourceExhausted`, 504
/// `DeadlineExceeded`, …, an unlisted one `Internal` (the codes gRPC would
/// have answered).
pub fn code_of(status: axum::http::StatusCode) -> Code {
    match status.as_u16() {
        200..=299 => Code::Ok,
        400 | 413 | 415 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::FailedPrecondition,
        429 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// `GET /health`: the process answers (200 whatever its state).
async fn health() -> impl IntoResponse {
    "ok\n"
}

/// `GET /ready`: 200 while the server takes work, else 503 saying why (for
/// a load balancer's check; gRPC health says the same, except that it is
/// NOT_SERVING while the session store is down and `/ready` says 200,
/// degraded, so that stateless calls still reach the replica).
async fn ready(State(service): State<Arc<Core>>) -> impl IntoResponse {
    use crate::app::Ready;
    match service.readiness().get() {
        Ready::Serving => (axum::http::StatusCode::OK, "serving\n"),
        Ready::Starting => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "starting: the model is warming up\n"),
        Ready::Draining => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "draining: finishing the calls in flight\n"),
        Ready::Stopped => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stopped: the encoder is not running\n"),
        // still taking work: a load balancer keeps sending stateless calls
        // (Embed, CountTokens, Compress without a session); gRPC health says
        // NOT_SERVING, for clients that need sessions
        Ready::StoreDown => (
            axum::http::StatusCode::OK,
            "degraded: the session store does not answer; session calls fail UNAVAILABLE, stateless calls are served\n",
        ),
    }
}

/// Serves `GET /metrics`, `GET /health` and `GET /ready` (and the `routes`
/// merged in: the server puts the A2A and REST routes there) on `listener`,
/// over TLS with `tls`, until the task is dropped; with `auth`, every
/// request is authenticated (DID documents, the agent card, `/health` and
/// `/ready` excepted).
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    service: Arc<Core>,
    limits: HttpLimits,
    auth: Option<Arc<Auth>>,
    routes: Option<axum::Router>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let mut router = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .with_state(service.clone());
    if let Some(routes) = routes {
        router = router.merge(routes);
    }
    if let Some(auth) = auth {
        // the fallback first, so unknown paths pass through the check too
        router = router
            .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "not found\n") })
            .layer(axum::middleware::from_fn_with_state(auth, http_middleware));
    }
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    conn::serve(listener, router, limits, tls, move |kind| service.metrics.rejected(kind)).await
}

/// Serves `router` on `listener` with `limits` until the task is dropped;
/// `on_reject` runs with the `scd_rejected_total` kind of each refusal
/// (see [`conn`]). Each request carries its client's address as
/// an `Extension<ConnectInfo<SocketAddr>>` (the A2A agent's audit `peer`).
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    on_reject: impl Fn(&'static str) + Send + Sync + 'static,
) {
    conn::serve(listener, router, limits, None, on_reject).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_count_under_the_codes_grpc_would_answer() {
        let cases = [
            (200, "Ok"),
            (204, "Ok"),
            (400, "InvalidArgument"),
            (413, "InvalidArgument"),
            (415, "InvalidArgument"),
            (401, "Unauthenticated"),
            (403, "PermissionDenied"),
            (404, "NotFound"),
            (409, "FailedPrecondition"),
            (429, "ResourceExhausted"),
            (503, "Unavailable"),
            (504, "DeadlineExceeded"),
            (500, "Internal"),
            (302, "Internal"),
        ];
        for (status, want) in cases {
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            assert_eq!(code_of(status).name(), want, "{status}");
        }
    }
}
