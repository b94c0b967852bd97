//! A layer that decides on each call before the inner service sees it:
//! answers it at once, passes it through, or lets it through holding a
//! guard. The tonic `Service` plumbing lives here once; a layer says only
//! what it admits ([`Admission`]).
//!
//! ```
//! use scd_net::{Admission, Admit, AdmitLayer};
//!
//! /// Refuses every call but health checks.
//! #[derive(Clone)]
//! struct HealthOnly;
//!
//! impl Admission for HealthOnly {
//!     type Guard = ();
//!     fn admit<B>(&self, req: &http::Request<B>) -> Admit<()> {
//!         if req.uri().path().starts_with("/grpc.health.v1.Health/") {
//!             Admit::Pass
//!         } else {
//!             Admit::Refuse(tonic::Status::unavailable("health checks only").into_http())
//!         }
//!     }
//! }
//!
//! let layer = AdmitLayer::new(HealthOnly);
//! # let _ = layer;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A response on the gRPC wire.
pub type Response = http::Response<tonic::body::Body>;

/// What an [`Admission`] decides for one call.
pub enum Admit<G> {
    /// Let the call through untouched.
    Pass,
    /// Answer at once with this response; the inner service never sees
    /// the call.
    Refuse(Response),
    /// Let the call through holding this guard, until
    /// [`Admission::respond`] lets it go.
    Hold(G),
}

/// What an [`AdmitLayer`] admits.
pub trait Admission: Clone {
    /// What an admitted call holds.
    type Guard: Send + 'static;

    /// Decides on `req`, before the inner service sees it (its body is
    /// not read yet).
    fn admit<B>(&self, req: &http::Request<B>) -> Admit<Self::Guard>;

    /// The inner service's response to a call admitted with `guard`. By
    /// default the guard goes once the response is ready (its head, not
    /// its body); [`crate::HeldUntilEnd`] holds it until the body ends.
    fn respond(resp: Response, guard: Self::Guard) -> Response {
        drop(guard);
        resp
    }
}

/// A tower layer over an [`Admission`].
#[derive(Clone)]
pub struct AdmitLayer<A> {
    admission: A,
}

impl<A> AdmitLayer<A> {
    /// The layer that asks `admission` about every call.
    pub fn new(admission: A) -> Self {
        Self { admission }
    }
}

impl<S, A: Clone> tower_layer::Layer<S> for AdmitLayer<A> {
    type Service = AdmitService<S, A>;

    fn layer(&self, inner: S) -> AdmitService<S, A> {
        AdmitService { inner, admission: self.admission.clone() }
    }
}

/// See [`AdmitLayer`].
#[derive(Clone)]
pub struct AdmitService<S, A> {
    inner: S,
    admission: A,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, A> tonic::codegen::Service<http::Request<B>> for AdmitService<S, A>
where
    S: tonic::codegen::Service<http::Request<B>, Response = Response>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    A: Admission,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self.admission.admit(&req) {
            Admit::Pass => Box::pin(self.inner.call(req)),
            Admit::Refuse(resp) => Box::pin(std::future::ready(Ok(resp))),
            Admit::Hold(guard) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let resp = fut.await?;
                    Ok(A::respond(resp, guard))
                })
            }
        }
    }
}
