//! Serving an agent: message limits, the SubmitTask admission gate, TLS.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::node::Node;
use super::service::AgentService;
use crate::{pb, Error, Result};

/// Largest ATP message accepted (a task with its context).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Concurrent calls per connection.
const MAX_CONCURRENT_STREAMS: u32 = 64;

/// Admits a SubmitTask call before its body is read: a task (up to
/// [`MAX_MESSAGE_BYTES`]) is decoded only while the queue has room and
/// fewer than its slots are being decoded at once; otherwise the call is
/// answered RESOURCE_EXHAUSTED at once, with the queue's drain time as the
/// retry hint. So a flood of maximal tasks costs the worker at most its
/// slots' worth of decoding, whatever the peers send, and a refusal costs
/// no decode at all.
#[derive(Clone)]
struct SubmitGate {
    node: Arc<Node>,
    decoding: Arc<Semaphore>,
}

const SUBMIT_TASK: &str = "/atp.v1.AtpService/SubmitTask";

impl scd_net::Admission for SubmitGate {
    /// One decoding slot, until the call's response is ready.
    type Guard = OwnedSemaphorePermit;

    fn admit<B>(&self, req: &http::Request<B>) -> scd_net::Admit<OwnedSemaphorePermit> {
        if req.uri().path() != SUBMIT_TASK {
            return scd_net::Admit::Pass;
        }
        let node = &self.node;
        let permit = self.decoding.clone().try_acquire_owned().ok().filter(|_| node.queue.available_permits() > 0);
        match permit {
            Some(permit) => scd_net::Admit::Hold(permit),
            None => scd_net::Admit::Refuse(node.queue_full().into_http()),
        }
    }
}

/// Serves `node` on `listener` until `shutdown` resolves: `atp.v1.AtpService`
/// plus gRPC health and reflection; starts the heartbeat loop.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<pb::atp_service_server::AtpServiceServer<AgentService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::DESCRIPTOR)
        .build_v1()
        .map_err(|e| Error::Invalid { field: "reflection".into(), reason: e.to_string() })?;
    node.start_heartbeats();
    let gate = SubmitGate {
        decoding: Arc::new(Semaphore::new(node.config.max_queue + node.config.max_running)),
        node: node.clone(),
    };
    let node_limits = node.config.connections;
    let tls = node.config.server_tls.clone();
    let svc = pb::atp_service_server::AtpServiceServer::new(AgentService(node))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let guard = scd_net::ConnGuard::new(node_limits);
    let incoming = guard.incoming(listener);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| Error::Transport { what: "TLS of atp.v1".into(), message: e.to_string() })?;
    }
    builder
        .layer(guard.layer())
        .layer(scd_net::AdmitLayer::new(gate))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .concurrency_limit_per_connection(MAX_CONCURRENT_STREAMS as usize)
        .add_service(health)
        .add_service(reflection)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| Error::Transport { what: "serving atp.v1".into(), message: e.to_string() })
}
