//! Starting, serving and draining: `scd.v1.Scd` with health and reflection
//! on one listener, metrics on the HTTP one.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use scd_engine::encoder::{EncodeOptions, InputKind};
use scd_engine::extract::Scd;
use tonic_health::ServingStatus;
use tracing::{error, info, warn};

use super::http::{serve_metrics, HttpLimits};
use super::layer::ObserveLayer;
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
    /// Metrics listener limits.
    pub http: HttpLimits,
}

/// Runs the server until Ctrl-C / SIGTERM, then drains in-flight requests.
pub async fn serve(scd: Arc<Scd>, cfg: ServeConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    let http = match cfg.http_addr {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await?),
        None => None,
    };
    serve_on(scd, cfg, listener, http, shutdown_signal()).await
}

/// Serves on listeners already bound (`cfg.addr` and `cfg.http_addr` are
/// not used) until `shutdown` completes; tests run a server in-process with
/// this.
pub async fn serve_on(
    scd: Arc<Scd>,
    cfg: ServeConfig,
    listener: tokio::net::TcpListener,
    http: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(cfg.limits.max_batch_tokens));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_not_serving::<pb::scd_server::ScdServer<Arc<ScdService>>>().await;
    let service = Arc::new(ScdService::new(scd.clone(), cfg.limits.clone(), metrics.clone()));
    // v1 and v1alpha: Python's grpcio-reflection client speaks only v1alpha
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(DESCRIPTOR)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let local = listener.local_addr()?;
    if let Some(l) = http {
        println!("metrics on http://{}/metrics", l.local_addr()?);
        tokio::spawn(serve_metrics(l, service.clone(), cfg.http));
    }
    println!("listening on {local}");
    // fail-stop: a dead encoder thread makes the whole server NOT_SERVING
    let mut stopped = service.batcher().stopped_signal();
    let stop_health = health.clone();
    tokio::spawn(async move {
        let cause = stopped.wait_for(|c| c.is_some()).await.ok().and_then(|c| c.clone());
        if let Some(cause) = cause {
            error!(cause = %cause, "encoder thread stopped; health NOT_SERVING");
            stop_health.set_not_serving::<pb::scd_server::ScdServer<Arc<ScdService>>>().await;
            stop_health.set_service_status("", ServingStatus::NotServing).await;
        }
    });
    // warm the model before reporting SERVING
    let warm = scd.clone();
    let batcher_alive = service.clone();
    let health_setter = health.clone();
    tokio::spawn(async move {
        let ok = tokio::task::spawn_blocking(move || {
            warm.encoder().encode(&["warm up"], &EncodeOptions::new(InputKind::Query))
        })
        .await
        .map(|r| r.is_ok())
        .unwrap_or(false);
        if ok && batcher_alive.batcher().stopped().is_none() {
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
        .layer(ObserveLayer::new(metrics))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
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
