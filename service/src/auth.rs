//! `scd serve --auth did-wba`: DID-authenticated callers on gRPC and HTTP.
//!
//! Every `scd.v1.Scd` call and every HTTP request must carry an ANP
//! `Authorization: DIDWba …` header signed by a DID whose document lies in
//! `--did-dir` (the allowlist; see [`scd_did::wba`] for the header, the
//! signed bytes and the checks). A refusal is UNAUTHENTICATED (HTTP 401 with
//! `WWW-Authenticate: DIDWba`) with a message naming the reason.
//!
//! - **Open paths.** `grpc.health.v1` and reflection stay open (probes and
//!   tooling carry no identity); over HTTP the DID documents of the
//!   directory are served without auth at their did:wba paths
//!   (`GET /.well-known/did.json`, `GET /<path>/did.json`, looked up by the
//!   request's `Host`), so the server's "own served documents" resolve.
//!   Everything else, `/metrics` included, needs a signed header.
//! - **Rate limit per DID.** A token bucket per authenticated DID
//!   (`--auth-rate` per second, `--auth-burst` deep), checked only after
//!   authentication succeeded, so unauthenticated traffic cannot drain
//!   someone else's bucket. Over it: RESOURCE_EXHAUSTED with `retry-after-ms`
//!   (HTTP 429 with `Retry-After`).
//! - **The caller.** An accepted call carries [`AuthenticatedDid`] in its
//!   extensions; `caller()` returns it, so sessions are bound to the DID
//!   that opened them and the audit trail records it.
//! - **Counting.** The layer sits inside the outcome-counting layer, so a
//!   refusal is counted once in `scd_requests_total{method,code}`, and in
//!   `scd_rejected_total{kind="auth_unauthenticated"|"auth_rate_limited"}`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use scd_did::wba::{did_for_served_path, Reason, WbaAuthenticator};
use tonic::Status;

use crate::app::metrics::Metrics;
use crate::app::ratelog::RateLimitedWarn;

/// The DID that signed a call's `Authorization` header, in its extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedDid(pub String);

/// What `--auth did-wba` needs.
#[derive(Debug)]
pub struct AuthConfig {
    /// Checks headers against the DID directory.
    pub authenticator: WbaAuthenticator,
    /// Requests per second per DID (the bucket's refill rate).
    pub rate_per_s: f64,
    /// Requests a DID may make at once after being idle (the bucket's size).
    pub burst: u32,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Denied {
    /// Authentication failed.
    Unauthenticated(Reason),
    /// The DID is over its rate limit.
    RateLimited {
        /// The DID.
        did: String,
        /// How long until it has a request again.
        retry_after: Duration,
        /// `--auth-rate`.
        rate_per_s: f64,
        /// `--auth-burst`.
        burst: u32,
    },
}

impl Denied {
    fn retry_after_ms(&self) -> u64 {
        match self {
            Denied::RateLimited { retry_after, .. } => (retry_after.as_millis() as u64).max(1),
            Denied::Unauthenticated(_) => 0,
        }
    }

    fn message(&self) -> String {
        match self {
            Denied::Unauthenticated(reason) => reason.to_string(),
            Denied::RateLimited { did, rate_per_s, burst, .. } => format!(
                "rate limit for {did}: {rate_per_s} requests/s, burst {burst} (--auth-rate, --auth-burst); \
                 retry after {} ms",
                self.retry_after_ms()
            ),
        }
    }

    /// The gRPC status: UNAUTHENTICATED, or RESOURCE_EXHAUSTED with `retry-after-ms`.
    pub fn status(&self) -> Status {
        match self {
            Denied::Unauthenticated(_) => Status::unauthenticated(self.message()),
            Denied::RateLimited { .. } => {
                let mut s = Status::resource_exhausted(self.message());
                s.metadata_mut().insert("retry-after-ms", self.retry_after_ms().to_string().parse().expect("digits"));
                s
            }
        }
    }

    /// The HTTP answer: 401 with `WWW-Authenticate: DIDWba`, or 429 with
    /// `Retry-After` (whole seconds, rounded up) and `retry-after-ms`; the
    /// body is the message.
    pub fn http(&self) -> Response {
        let body = format!("{}\n", self.message());
        match self {
            Denied::Unauthenticated(_) => {
                (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "DIDWba".to_string())], body).into_response()
            }
            Denied::RateLimited { .. } => {
                let ms = self.retry_after_ms();
                let headers = [(header::RETRY_AFTER, ms.div_ceil(1000).to_string())];
                let mut r = (StatusCode::TOO_MANY_REQUESTS, headers, body).into_response();
                r.headers_mut().insert("retry-after-ms", ms.to_string().parse().expect("digits"));
                r
            }
        }
    }
}

pub use scd_net::rate::DidRateLimiter;

static REFUSED: RateLimitedWarn = RateLimitedWarn::new("auth_unauthenticated");
static LIMITED: RateLimitedWarn = RateLimitedWarn::new("auth_rate_limited");

/// Authentication plus the per-DID rate limit, shared by the gRPC layer and
/// the HTTP middleware.
pub struct Auth {
    authenticator: WbaAuthenticator,
    limiter: DidRateLimiter,
    rate_per_s: f64,
    burst: u32,
    metrics: Arc<Metrics>,
}

impl Auth {
    /// Auth from `cfg`, counting refusals in `metrics`.
    pub fn new(cfg: AuthConfig, metrics: Arc<Metrics>) -> Auth {
        Auth {
            limiter: DidRateLimiter::new(cfg.rate_per_s, cfg.burst),
            authenticator: cfg.authenticator,
            rate_per_s: cfg.rate_per_s,
            burst: cfg.burst,
            metrics,
        }
    }

    /// The caller's DID if the request's `authorization` header passes and
    /// the DID is within its rate; refusals are counted and logged (at most
    /// one line per 10 s per kind).
    pub fn admit(&self, headers: &HeaderMap) -> Result<String, Denied> {
        let denied = match self.authenticate(headers) {
            Ok(did) => match self.limiter.check_at(&did, Instant::now()) {
                Ok(()) => return Ok(did),
                Err(retry_after) => {
                    Denied::RateLimited { did, retry_after, rate_per_s: self.rate_per_s, burst: self.burst }
                }
            },
            Err(reason) => Denied::Unauthenticated(reason),
        };
        match &denied {
            Denied::Unauthenticated(reason) => {
                self.metrics.rejected("auth_unauthenticated");
                REFUSED.hit(&format!("unauthenticated request refused ({reason})"));
            }
            Denied::RateLimited { did, .. } => {
                self.metrics.rejected("auth_rate_limited");
                LIMITED.hit(&format!("{did} over its rate limit"));
            }
        }
        Err(denied)
    }

    fn authenticate(&self, headers: &HeaderMap) -> Result<String, Reason> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(Reason::Malformed { part: "header".into(), reason: "given more than once".into() });
        }
        let value = first
            .map(|v| v.to_str())
            .transpose()
            .map_err(|_| Reason::Malformed { part: "header".into(), reason: "not visible ASCII".into() })?;
        self.authenticator.check(value, scd_did::time::now_s())
    }

    /// The DID document `GET path` serves on `host` (a did:wba path whose
    /// document is in the directory), as JSON text.
    fn served_document(&self, host: &str, path: &str) -> Option<String> {
        let did = did_for_served_path(host, path)?;
        let file = scd_did::document::wba_document_path(self.authenticator.dir(), &did).ok()?;
        let meta = std::fs::metadata(&file).ok()?;
        if !meta.is_file() || meta.len() > scd_did::wba::MAX_DOCUMENT_BYTES {
            return None;
        }
        std::fs::read_to_string(file).ok()
    }
}

/// gRPC paths that need no identity: health and reflection.
fn open_path(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.") || path.starts_with("/grpc.reflection.")
}

/// The tower layer that authenticates gRPC calls (a no-op without auth).
#[derive(Clone)]
pub struct AuthLayer(pub Option<Arc<Auth>>);

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService { inner, auth: self.0.clone() }
    }
}

/// See [`AuthLayer`].
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Arc<Auth>>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if let Some(auth) = &self.auth {
            if !open_path(req.uri().path()) {
                match auth.admit(req.headers()) {
                    Ok(did) => {
                        req.extensions_mut().insert(AuthenticatedDid(did));
                    }
                    Err(denied) => return Box::pin(std::future::ready(Ok(denied.status().into_http()))),
                }
            }
        }
        Box::pin(self.inner.call(req))
    }
}

/// The HTTP side: serves the directory's DID documents without auth, and
/// admits every other request only with a valid header (see the module docs).
pub async fn http_middleware(
    axum::extract::State(auth): axum::extract::State<Arc<Auth>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.method() == http::Method::GET && req.uri().path().ends_with("/did.json") {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host())
            .unwrap_or_default();
        return match auth.served_document(host, req.uri().path()) {
            Some(doc) => ([(header::CONTENT_TYPE, "application/did+json")], doc).into_response(),
            None => (StatusCode::NOT_FOUND, "no such DID document\n").into_response(),
        };
    }
    // discovery: the A2A agent card is public (it declares the scheme), and
    // so are the liveness and readiness checks a load balancer makes
    if req.method() == http::Method::GET
        && matches!(req.uri().path(), "/.well-known/agent-card.json" | "/health" | "/ready")
    {
        return next.run(req).await;
    }
    match auth.admit(req.headers()) {
        Ok(did) => {
            req.extensions_mut().insert(AuthenticatedDid(did));
            next.run(req).await
        }
        Err(denied) => denied.http(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_map_to_codes_and_headers() {
        let d = Denied::RateLimited {
            did: "did:wba:a".into(),
            retry_after: Duration::from_millis(1500),
            rate_per_s: 2.0,
            burst: 4,
        };
        let s = d.status();
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(s.metadata().get("retry-after-ms").unwrap(), "1500");
        assert_eq!(
            s.message(),
            "rate limit for did:wba:a: 2 requests/s, burst 4 (--auth-rate, --auth-burst); retry after 1500 ms"
        );
        let r = d.http();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let u = Denied::Unauthenticated(Reason::Missing);
        assert_eq!(u.status().code(), tonic::Code::Unauthenticated);
        let r = u.http();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "DIDWba");
    }
}
