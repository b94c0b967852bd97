//! `scd mcp` over stdio with every message checked for repeated keys before
//! rmcp reads it ([`StrictLines`]). rmcp parses a line into maps that keep
//! a repeated key's last value, so `"confidential": true, "confidential":
//! false` would reach the tools as a public field; here such a line never
//! reaches rmcp, and the client gets a JSON-RPC error naming the key's path
//! (`params.arguments.context.fields[0].confidential: duplicate key; …`).

use std::future::Future;

use rmcp::model::{ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

/// A line refused: the request's id (when it had one) and why.
type Refusal = (Option<RequestId>, String);

/// rmcp's line transport over `write`, fed by a task that reads `read`
/// line by line (at most `max_line` bytes a line; a longer one is dropped,
/// as rmcp drops it) and passes on only the lines without a repeated key.
pub struct StrictLines<W: AsyncWrite + Send + Unpin + 'static> {
    inner: AsyncRwTransport<RoleServer, DuplexStream, W>,
    refused: mpsc::Receiver<Refusal>,
}

impl<W: AsyncWrite + Send + Unpin + 'static> StrictLines<W> {
    /// Starts the reading task (on the current tokio runtime).
    pub fn new<R: AsyncRead + Send + Unpin + 'static>(read: R, write: W, max_line: usize) -> Self {
        let (pipe, inner_read) = tokio::io::duplex(64 << 10);
        let (tx, refused) = mpsc::channel(16);
        tokio::spawn(forward(BufReader::new(read), pipe, tx, max_line));
        Self { inner: AsyncRwTransport::new_server(inner_read, write).with_max_line_length(max_line), refused }
    }
}

/// What [`read_line`] read.
#[derive(Debug, PartialEq)]
enum Read {
    /// A line, in the buffer without its `\n`.
    Line,
    /// A line over the limit, read to its end and not kept.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads one line into `line`, keeping at most `max` bytes of it.
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Read> {
    line.clear();
    let mut over = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(match (over, line.is_empty()) {
                (true, _) => Read::TooLong,
                (false, false) => Read::Line,
                (false, true) => Read::End,
            });
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buf.len(), false),
        };
        if !over && line.len() + take <= max {
            line.extend_from_slice(&buf[..take]);
        } else {
            over = true;
            line.clear();
        }
        r.consume(take + usize::from(done));
        if done {
            return Ok(if over { Read::TooLong } else { Read::Line });
        }
    }
}

async fn forward<R: AsyncRead + Unpin>(
    mut read: BufReader<R>,
    mut pipe: DuplexStream,
    refused: mpsc::Sender<Refusal>,
    max_line: usize,
) {
    let mut line = Vec::new();
    loop {
        match read_line(&mut read, &mut line, max_line).await {
            Ok(Read::Line) => {}
            Ok(Read::TooLong) => {
                tracing::warn!(max_line, "MCP over stdio: a line over --max-request-bytes was dropped");
                continue;
            }
            Ok(Read::End) | Err(_) => return,
        }
        match scd_engine::context::check_unique_keys(&line) {
            Ok(()) => {
                line.push(b'\n');
                if pipe.write_all(&line).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                #[derive(serde::Deserialize)]
                struct Probe {
                    id: Option<RequestId>,
                }
                let id = serde_json::from_slice::<Probe>(&line).ok().and_then(|p| p.id);
                if refused.send((id, e.to_string())).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl<W: AsyncWrite + Send + Unpin + 'static> Transport<RoleServer> for StrictLines<W> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            tokio::select! {
                m = self.inner.receive() => return m,
                Some((id, why)) = self.refused.recv() => {
                    let error = if why.starts_with("params") {
                        ErrorData::invalid_params(why, None)
                    } else {
                        ErrorData::invalid_request(why, None)
                    };
                    if self.inner.send(ServerJsonRpcMessage::error(error, id)).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_read_whole_and_a_long_one_is_dropped() {
        let input: &[u8] = b"{\"a\":1}\n0123456789abcdef\n\nlast";
        let mut r = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut got = Vec::new();
        loop {
            match read_line(&mut r, &mut line, 10).await.unwrap() {
                Read::Line => got.push(String::from_utf8(line.clone()).unwrap()),
                Read::TooLong => got.push("(too long)".into()),
                Read::End => break,
            }
        }
        assert_eq!(got, ["{\"a\":1}", "(too long)", "", "last"]);
    }
}
