//! `scd embed-batch --server`: blocks embedded by a running `scd serve`
//! over EmbedStream, retried while the server is busy.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use scd_engine::encoder::{EncodeOptions, Encoded, InputKind};

use crate::grpc::pb;

/// A running `scd serve`, called over EmbedStream.
pub(super) struct Remote {
    rt: tokio::runtime::Runtime,
    client: pb::scd_client::ScdClient<tonic::transport::Channel>,
    pub(super) info: pb::InfoResponse,
    request_texts: usize,
}

impl Remote {
    pub(super) fn connect(addr: &str, request_texts: usize) -> anyhow::Result<Remote> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let (client, info) = rt.block_on(async {
            let mut c = pb::scd_client::ScdClient::connect(addr.to_string())
                .await
                .with_context(|| format!("--server {addr}"))?;
            let info = c.info(pb::InfoRequest {}).await.with_context(|| format!("--server {addr}: Info"))?;
            anyhow::Ok((c, info.into_inner()))
        })?;
        Ok(Remote { rt, client, info, request_texts })
    }

    /// Embeds one block over EmbedStream, retrying (whole block) while the
    /// server answers RESOURCE_EXHAUSTED.
    pub(super) fn embed(&mut self, texts: &[String], opts: &EncodeOptions) -> anyhow::Result<Encoded> {
        let kind = match opts.kind {
            InputKind::Query => pb::InputKind::Query,
            InputKind::Passage => pb::InputKind::Passage,
        } as i32;
        let windows = opts.long_inputs == scd_engine::encoder::LongInputPolicy::Windows;
        let requests: Vec<pb::EmbedRequest> =
            texts.chunks(self.request_texts).map(|c| pb::EmbedRequest { texts: c.to_vec(), kind, windows }).collect();
        let dim = self.info.dim as usize;
        for attempt in 0.. {
            let stream = tokio_stream::iter(requests.clone());
            let mut client = self.client.clone();
            let got: Result<Vec<pb::EmbedResponse>, tonic::Status> = self.rt.block_on(async move {
                let mut replies = client.embed_stream(stream).await?.into_inner();
                let mut out = Vec::new();
                while let Some(r) = tokio_stream::StreamExt::next(&mut replies).await {
                    out.push(r?);
                }
                Ok(out)
            });
            match got {
                Ok(replies) => {
                    let mut enc = Encoded { dim, data: Vec::new(), tokens: Vec::new(), windows: Vec::new() };
                    for e in replies.into_iter().flat_map(|r| r.embeddings) {
                        ensure!(e.values.len() == dim, "server sent a vector of {} values, not {dim}", e.values.len());
                        enc.data.extend_from_slice(&e.values);
                        enc.tokens.push(e.tokens as usize);
                        enc.windows.push(e.windows as usize);
                    }
                    ensure!(enc.len() == texts.len(), "server answered {} of {} texts", enc.len(), texts.len());
                    return Ok(enc);
                }
                Err(s) if s.code() == tonic::Code::ResourceExhausted && attempt < 100 => {
                    let wait = s
                        .metadata()
                        .get("retry-after-ms")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(100u64);
                    tracing::debug!(wait, "server busy; retrying the block");
                    std::thread::sleep(Duration::from_millis(wait));
                }
                Err(s) => bail!("--server: {}: {}", s.code(), s.message()),
            }
        }
        unreachable!("the retry loop returns or fails")
    }
}
