//! Starting, serving and draining: `scd.v1.Scd` with health and reflection
//! on one listener, metrics on the HTTP one.

use std::net::SocketAddr;
use std::sync::Arc;

use scd_engine::encoder::{EncodeOptions, InputKind};
use scd_engine::extract::Scd;
use tracing::{info, warn};

use super::http::serve_metrics;
use super::metrics::Metrics;
use super::{pb, Limits, ScdService, DESCRIPTOR};

/// Everything `serve` needs.
pub struct ServeConfig {
    /// gRPC listen address (port 0 picks one).
    pub addr: SocketAddr,
    /// Metrics listen address.
    pub http_addr: Option<SocketAddr>,
    /// Limits.
    pub limits: Limits,
}

/// Runs the server until Ctrl-C / SIGTERM, then drains in-flight requests.
pub async fn serve(scd: Arc<Scd>, cfg: ServeConfig) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_not_serving::<pb::scd_server::ScdServer<Arc<ScdService>>>().await;
    let service = Arc::new(ScdService::new(scd.clone(), cfg.limits.clone(), metrics.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(DESCRIPTOR)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    let local = listener.local_addr()?;
    if let Some(http) = cfg.http_addr {
        let l = tokio::net::TcpListener::bind(http).await?;
        println!("metrics on http://{}/metrics", l.local_addr()?);
        tokio::spawn(serve_metrics(l, metrics.clone(), service.clone()));
    }
    println!("listening on {local}");
    // warm the model before reporting SERVING
    let warm = scd.clone();
    let health_setter = health.clone();
    tokio::spawn(async move {
        let ok = tokio::task::spawn_blocking(move || {
            warm.encoder().encode(&["warm up"], &EncodeOptions::new(InputKind::Query))
        })
        .await
        .map(|r| r.is_ok())
        .unwrap_or(false);
        if ok {
            health_setter.set_serving::<pb::scd_server::ScdServer<Arc<ScdService>>>().await;
            info!("model warm; SERVING");
        } else {
            warn!("warm-up failed; staying NOT_SERVING");
        }
    });
    let svc = pb::scd_server::ScdServer::new(service)
        .max_decoding_message_size(cfg.limits.max_request_bytes)
        .max_encoding_message_size(64 << 20);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await?;
    info!("drained; bye");
    Ok(())
}

async fn shutdown_signal() {
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
