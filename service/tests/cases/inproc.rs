//! A server running in this test process (`serve_on`), over any encoder (the
//! engine's hash encoder needs no model); it stops when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use scd_audit::AuditLog;
use scd_engine::encoder::{Encoder, HashEncoder};
use scd_engine::extract::{Scd, ScdConfig};
use scd_service::app::Limits;
use scd_service::auth::AuthConfig;
use scd_service::http::HttpLimits;
use scd_service::server::{serve_on, ServeConfig};

/// `scd serve`'s defaults.
pub(crate) fn limits() -> Limits {
    Limits {
        max_texts: 256,
        max_text_bytes: 1 << 20,
        max_fields: 256,
        max_request_bytes: 16 << 20,
        queue_size: 256,
        batch_texts: 64,
        max_batch_tokens: 8192,
        max_concurrent_compress: 8,
    }
}

/// What differs between the tests' servers.
pub(crate) struct Options {
    pub(crate) encoder: Arc<dyn Encoder>,
    pub(crate) limits: Limits,
    pub(crate) http: HttpLimits,
    pub(crate) auth: Option<AuthConfig>,
    pub(crate) audit: Option<Arc<AuditLog>>,
    pub(crate) audit_access: scd_service::grpc::audit::AuditAccess,
    pub(crate) connections: scd_net::ConnLimits,
    pub(crate) scd: ScdConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            encoder: Arc::new(HashEncoder::new(64, 512)),
            limits: limits(),
            http: HttpLimits { max_connections: 256, header_timeout: Duration::from_secs(5), ..HttpLimits::default() },
            auth: None,
            audit: None,
            audit_access: Default::default(),
            connections: scd_net::ConnLimits::default(),
            scd: ScdConfig::default(),
        }
    }
}

pub(crate) struct InProc {
    /// `http://127.0.0.1:port` of the gRPC listener.
    pub(crate) grpc: String,
    /// The HTTP listener.
    pub(crate) http: SocketAddr,
    /// Dropping it stops the server.
    pub(crate) _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts a server on free loopback ports (it may not be SERVING yet).
pub(crate) fn start(o: Options) -> InProc {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let h = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (grpc, http) = (l.local_addr().unwrap(), h.local_addr().unwrap());
    let scd = Arc::new(Scd::new(o.encoder, o.scd));
    let cfg = ServeConfig {
        listener: l,
        connections: o.connections,
        http_listener: Some(h),
        limits: o.limits,
        http: o.http,
        tls: None,
        http_tls: None,
        drain_timeout: Duration::from_secs(1),
        auth: o.auth,
        audit: o.audit,
        audit_access: o.audit_access,
        a2a: Default::default(),
        a2a_state: None,
        a2a_public_url: None,
        tokenizers: Default::default(),
        confidence_map: Default::default(),
        ui: true,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        serve_on(scd, cfg, async {
            let _ = stopped.await;
        })
        .await
        .unwrap()
    });
    InProc { grpc: format!("http://{grpc}"), http, _stop: stop }
}

/// Waits until health (open without credentials) says `scd.v1.Scd` is SERVING.
pub(crate) async fn wait_serving(s: &InProc) {
    let ch = tonic::transport::Channel::from_shared(s.grpc.clone()).unwrap().connect_lazy();
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    for _ in 0..400 {
        let r = health.check(tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() }).await;
        if r.is_ok_and(|r| r.into_inner().status == 1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("in-process server never became SERVING");
}
