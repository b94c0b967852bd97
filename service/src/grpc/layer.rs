//! The tower layer around every gRPC route (`Server::builder().layer(..)`):
//!
//! - **Outcome counting, once.** `scd_requests_total{method,code}` and
//!   `scd_request_duration_seconds{method}` for every RPC, including those
//!   that never reach a handler (undecodable or oversized messages). The
//!   code comes from `grpc-status` in the response headers (trailers-only
//!   errors) or the body's trailers (OK and streamed replies); a request whose
//!   response future or body is dropped first counts as CANCELLED, or
//!   DEADLINE_EXCEEDED when its deadline had passed.
//! - **Deadlines.** `grpc-timeout` becomes a [`Deadline`] in the request
//!   extensions. Handlers stop a little ([`MARGIN`]) before it, because tonic's
//!   own `GrpcTimeout` sits outside every user layer and answers an expired
//!   deadline with CANCELLED ("Timeout expired"): finishing first lets callers
//!   see DEADLINE_EXCEEDED.
//! - **Size limit message.** tonic refuses a message over
//!   `--max-request-bytes` with OUT_OF_RANGE; a request that is too big is bad
//!   input, so it is rewritten to INVALID_ARGUMENT naming the size and the flag.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use tonic::{Code, Status};

use crate::app::metrics::Metrics;

/// Handlers stop this much before the caller's deadline (see the module docs).
pub const MARGIN: Duration = Duration::from_millis(5);

/// When a request must be answered, from its `grpc-timeout`, less [`MARGIN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// Adds [`Observe`] around a service.
#[derive(Clone)]
pub struct ObserveLayer {
    metrics: Arc<Metrics>,
}

impl ObserveLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner, metrics: self.metrics.clone() }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// `Embed` for `/scd.v1.Scd/Embed`; other services keep their full path.
fn method_label(path: &str) -> String {
    let p = path.trim_start_matches('/');
    p.strip_prefix("scd.v1.Scd/").unwrap_or(p).to_string()
}

/// `grpc-timeout` as a duration; `None` when absent or malformed.
pub fn parse_timeout(headers: &HeaderMap) -> Option<Duration> {
    let s = headers.get("grpc-timeout")?.to_str().ok()?;
    if s.len() < 2 || s.len() > 9 {
        return None;
    }
    let (n, unit) = s.split_at(s.len() - 1);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// tonic's size-limit refusal, reworded as bad input.
fn rewrite(status: Status) -> Option<Status> {
    if status.code() != Code::OutOfRange {
        return None;
    }
    // "Error, decoded message length too large: found N bytes, the limit is: M bytes"
    let m = status.message();
    let rest = m.strip_prefix("Error, decoded message length too large: found ")?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some(Status::invalid_argument(format!("request is {found} bytes, over the limit {limit} (--max-request-bytes)")))
}

/// Reads (and where needed rewrites) the status in `headers`.
fn observe_status(headers: &mut HeaderMap) -> Option<Code> {
    let status = Status::from_header_map(headers)?;
    match rewrite(status) {
        Some(new) => {
            let code = new.code();
            headers.remove("grpc-message");
            let _ = new.add_header(headers);
            Some(code)
        }
        None => Some(Status::from_header_map(headers)?.code()),
    }
}

/// One RPC's record; written once, by whoever sees the end first.
struct Outcome {
    metrics: Arc<Metrics>,
    method: String,
    start: Instant,
    deadline: Option<Instant>,
    done: bool,
}

impl Outcome {
    fn finish(&mut self, code: Code) {
        if !self.done {
            self.done = true;
            self.metrics.request(&self.method, code.into(), self.start.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        // dropped before a status was seen: the client left, or tonic's
        // timeout fired first
        let code = match self.deadline {
            Some(d) if Instant::now() + MARGIN >= d => Code::DeadlineExceeded,
            _ => Code::Cancelled,
        };
        self.finish(code);
    }
}

impl<S, B> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = ObserveFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let start = Instant::now();
        let deadline = parse_timeout(req.headers()).map(|t| start + t.saturating_sub(MARGIN));
        if let Some(d) = deadline {
            req.extensions_mut().insert(Deadline(d));
        }
        let outcome = Outcome {
            metrics: self.metrics.clone(),
            method: method_label(req.uri().path()),
            start,
            deadline,
            done: false,
        };
        ObserveFuture { inner: self.inner.call(req), outcome: Some(outcome) }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Observe`].
    pub struct ObserveFuture<F> {
        #[pin]
        inner: F,
        outcome: Option<Outcome>,
    }
}

impl<F, E> Future for ObserveFuture<F>
where
    F: Future<Output = Result<http::Response<tonic::body::Body>, E>>,
{
    type Output = Result<http::Response<tonic::body::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx));
        let mut outcome = this.outcome.take().expect("polled after completion");
        Poll::Ready(match res {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                if let Some(code) = observe_status(&mut parts.headers) {
                    outcome.finish(code); // trailers-only
                }
                Ok(http::Response::from_parts(parts, tonic::body::Body::new(ObservedBody { inner: body, outcome })))
            }
            Err(e) => {
                outcome.finish(Code::Unknown);
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that reads `grpc-status` from its trailers.
    struct ObservedBody {
        #[pin]
        inner: tonic::body::Body,
        outcome: Outcome,
    }
}

impl http_body::Body for ObservedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match frame {
            Some(Ok(frame)) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    if let Some(code) = observe_status(&mut trailers) {
                        this.outcome.finish(code);
                    }
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                Err(data) => Poll::Ready(Some(Ok(data))),
            },
            Some(Err(e)) => {
                this.outcome.finish(e.code());
                Poll::Ready(Some(Err(e)))
            }
            None => {
                if !this.outcome.done {
                    this.outcome.finish(Code::Ok);
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_like_grpc() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert("grpc-timeout", v.parse().unwrap());
            parse_timeout(&m)
        };
        assert_eq!(h("500m"), Some(Duration::from_millis(500)));
        assert_eq!(h("2S"), Some(Duration::from_secs(2)));
        assert_eq!(h("123456789m"), None, "more than 8 digits");
        assert_eq!(h("5x"), None);
        assert_eq!(h("m"), None);
    }

    #[test]
    fn oversize_is_reworded() {
        let s = rewrite(Status::out_of_range(
            "Error, decoded message length too large: found 100012 bytes, the limit is: 65536 bytes",
        ))
        .unwrap();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "request is 100012 bytes, over the limit 65536 (--max-request-bytes)");
        assert!(rewrite(Status::out_of_range("other")).is_none());
    }
}
