//! The corpus queue of `scd embed-batch --queue` and `scd embed-worker`,
//! on a Redis Stream with one consumer group.
//!
//! * The coordinator (`embed-batch`) adds shards of the corpus to the
//!   stream `scd:v1:embed:shards`, at most `--queue-depth` ahead of the
//!   one it writes next, so the stream and the results waiting in Redis
//!   stay bounded. It keeps `run:<id>:live` alive while it runs.
//! * A worker reads a shard through the group `workers` (XREADGROUP), embeds
//!   it, stores the rows under `run:<id>:r:<shard>` (expiring), tells the
//!   coordinator on `run:<id>:done`, then acknowledges and deletes the entry.
//! * A worker killed mid-shard leaves the entry pending; another worker
//!   takes it over once it has been idle `--claim-idle-ms` (XAUTOCLAIM).
//!   A shard of a run whose coordinator is gone is dropped unread.

use std::time::Duration;

use redis::Value;
use scd_engine::shared::StoreError;
use serde::{Deserialize, Serialize};

use super::Redis;

/// The stream of shards.
pub const STREAM: &str = "scd:v1:embed:shards";
/// Its consumer group.
pub const GROUP: &str = "workers";
/// How long a shard's rows wait in Redis for the coordinator.
const RESULT_TTL_MS: u64 = 3_600_000;

/// A piece of the corpus: records `first..first + texts.len()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shard {
    /// The coordinator's run.
    pub run: String,
    /// The shard's place in the run.
    pub index: usize,
    /// Its first record's row.
    pub first: usize,
    /// The model every row must come from (its id).
    pub model: String,
    /// Embed as queries instead of passages.
    pub query: bool,
    /// Embed long texts as windows.
    pub windows: bool,
    /// The texts.
    pub texts: Vec<String>,
    /// Each text's input line, for errors.
    pub lines: Vec<usize>,
}

/// What a worker made of a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRows {
    /// The worker's name.
    pub worker: String,
    /// The vectors' width.
    pub dim: usize,
    /// Per text: tokens and windows.
    pub tokens: Vec<usize>,
    /// Per text: windows.
    pub windows: Vec<usize>,
    /// The vectors, row after row.
    pub data: Vec<f32>,
    /// Why the shard could not be embedded (naming the input line).
    pub error: Option<String>,
}

impl ShardRows {
    /// A JSON head and the vectors as little-endian `f32`s (exact bits).
    pub fn encode(&self) -> Vec<u8> {
        let head = serde_json::to_vec(&ShardRows { data: vec![], ..self.clone() }).expect("rows serialize");
        let mut out = Vec::with_capacity(4 + head.len() + 4 * self.data.len());
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        for x in &self.data {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// The inverse of [`ShardRows::encode`]; `None` when malformed.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let n = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let mut rows: ShardRows = serde_json::from_slice(bytes.get(4..4 + n)?).ok()?;
        let data = bytes.get(4 + n..)?;
        if data.len() % 4 != 0 || (rows.error.is_none() && data.len() != 4 * rows.dim * rows.tokens.len()) {
            return None;
        }
        rows.data = data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        Some(rows)
    }
}

/// A shard a worker took, with its stream entry.
#[derive(Debug)]
pub struct Taken {
    /// The stream entry, to acknowledge.
    pub entry: String,
    /// The shard.
    pub shard: Shard,
    /// Taken over from a worker that went silent.
    pub reclaimed: bool,
}

/// The queue at a Redis URL.
#[derive(Debug)]
pub struct Queue {
    redis: Redis,
}

fn key(run: &str, what: &str) -> String {
    format!("scd:v1:embed:run:{run}:{what}")
}

fn bulk(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// The first entry of an XREADGROUP or XAUTOCLAIM entry list:
/// `[[id, [field, value, ...]], ...]`.
fn first_entry(entries: &Value) -> Option<(String, Vec<u8>)> {
    let Value::Array(entries) = entries else { return None };
    let Value::Array(entry) = entries.first()? else { return None };
    let id = String::from_utf8(bulk(entry.first()?)?).ok()?;
    let Value::Array(fields) = entry.get(1)? else { return None };
    let body = fields.chunks(2).find(|kv| bulk(&kv[0]).as_deref() == Some(b"shard")).and_then(|kv| bulk(kv.get(1)?))?;
    Some((id, body))
}

impl Queue {
    /// The queue at `url` (`flag` names the option in errors).
    pub fn open(flag: &'static str, url: &str) -> Result<Self, super::UrlError> {
        // blocking reads wait up to a second: the timeout is above it
        Ok(Self { redis: Redis::open(flag, url, Duration::from_secs(5))? })
    }

    /// The server, without credentials.
    pub fn name(&self) -> &str {
        self.redis.name()
    }

    /// Makes the stream and its group if they are not there.
    pub fn ensure_group(&self) -> Result<(), StoreError> {
        let made = self.redis.with(|c| {
            redis::cmd("XGROUP").arg("CREATE").arg(STREAM).arg(GROUP).arg("0").arg("MKSTREAM").query::<()>(c)
        });
        match made {
            Err(e) if e.0.contains("BUSYGROUP") => Ok(()),
            r => r,
        }
    }

    /// Marks `run` alive for `ttl` (the coordinator refreshes it).
    pub fn keep_alive(&self, run: &str, ttl: Duration) -> Result<(), StoreError> {
        let ms = ttl.as_millis() as u64;
        self.redis.with(|c| redis::cmd("SET").arg(key(run, "live")).arg(1).arg("PX").arg(ms).query::<()>(c))
    }

    /// Whether `run`'s coordinator is still there.
    pub fn is_live(&self, run: &str) -> Result<bool, StoreError> {
        self.redis.with(|c| redis::cmd("EXISTS").arg(key(run, "live")).query::<bool>(c))
    }

    /// Adds a shard to the stream.
    pub fn push(&self, shard: &Shard) -> Result<(), StoreError> {
        let body = serde_json::to_vec(shard).expect("a shard serializes");
        self.redis
            .with(|c| redis::cmd("XADD").arg(STREAM).arg("*").arg("shard").arg(&body).query::<String>(c))
            .map(drop)
    }

    /// The next shard for `consumer`: one idle for at least `claim_idle`
    /// (its worker went silent) first, else a new one, waiting up to
    /// `block` for it.
    pub fn take(&self, consumer: &str, claim_idle: Duration, block: Duration) -> Result<Option<Taken>, StoreError> {
        let claimed: Value = self.redis.with(|c| {
            redis::cmd("XAUTOCLAIM")
                .arg(STREAM)
                .arg(GROUP)
                .arg(consumer)
                .arg(claim_idle.as_millis() as u64)
                .arg("0-0")
                .arg("COUNT")
                .arg(1)
                .query(c)
        })?;
        let reclaimed = match &claimed {
            Value::Array(parts) => parts.get(1).and_then(first_entry),
            _ => None,
        };
        let (entry, body, reclaimed) = match reclaimed {
            Some((id, body)) => (id, body, true),
            None => {
                let read: Value = self.redis.with(|c| {
                    redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg(GROUP)
                        .arg(consumer)
                        .arg("COUNT")
                        .arg(1)
                        .arg("BLOCK")
                        .arg(block.as_millis() as u64)
                        .arg("STREAMS")
                        .arg(STREAM)
                        .arg(">")
                        .query(c)
                })?;
                // [[stream, [[id, fields]]]] or nil on timeout
                let got = match &read {
                    Value::Array(streams) => match streams.first() {
                        Some(Value::Array(s)) => s.get(1).and_then(first_entry),
                        _ => None,
                    },
                    Value::Map(m) => m.first().and_then(|(_, v)| first_entry(v)),
                    _ => None,
                };
                match got {
                    Some((id, body)) => (id, body, false),
                    None => return Ok(None),
                }
            }
        };
        match serde_json::from_slice::<Shard>(&body) {
            Ok(shard) => Ok(Some(Taken { entry, shard, reclaimed })),
            Err(e) => {
                // not ours to read: drop it rather than have every worker trip on it
                self.done_with(&entry)?;
                Err(StoreError(format!("stream entry {entry} is not a shard ({e}); dropped")))
            }
        }
    }

    /// Acknowledges and deletes a stream entry.
    pub fn done_with(&self, entry: &str) -> Result<(), StoreError> {
        self.redis.with(|c| {
            redis::pipe()
                .cmd("XACK")
                .arg(STREAM)
                .arg(GROUP)
                .arg(entry)
                .cmd("XDEL")
                .arg(STREAM)
                .arg(entry)
                .query::<()>(c)
        })
    }

    /// Stores a shard's rows, tells the coordinator, then acknowledges it.
    pub fn finish(&self, taken: &Taken, rows: &ShardRows) -> Result<(), StoreError> {
        let run = &taken.shard.run;
        let result = key(run, &format!("r:{}", taken.shard.index));
        let done = key(run, "done");
        self.redis.with(|c| {
            redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(&result)
                .arg(rows.encode())
                .arg("PX")
                .arg(RESULT_TTL_MS)
                .cmd("RPUSH")
                .arg(&done)
                .arg(taken.shard.index)
                .cmd("PEXPIRE")
                .arg(&done)
                .arg(RESULT_TTL_MS)
                .query::<()>(c)
        })?;
        self.done_with(&taken.entry)
    }

    /// Waits up to `wait` for a worker to finish a shard of `run`.
    pub fn wait_done(&self, run: &str, wait: Duration) -> Result<(), StoreError> {
        let secs = wait.as_secs_f64().max(0.01);
        self.redis.with(|c| redis::cmd("BLPOP").arg(key(run, "done")).arg(secs).query::<Value>(c)).map(drop)
    }

    /// Takes shard `index`'s rows of `run`, if a worker has stored them.
    pub fn rows(&self, run: &str, index: usize) -> Result<Option<ShardRows>, StoreError> {
        let k = key(run, &format!("r:{index}"));
        let bytes: Option<Vec<u8>> = self.redis.with(|c| redis::cmd("GETDEL").arg(&k).query(c))?;
        match bytes {
            None => Ok(None),
            Some(b) => {
                ShardRows::decode(&b).map(Some).ok_or_else(|| StoreError(format!("shard {index}: unreadable rows")))
            }
        }
    }

    /// Entries added but not yet acknowledged, over every run.
    pub fn backlog(&self) -> Result<u64, StoreError> {
        self.redis.with(|c| redis::cmd("XLEN").arg(STREAM).query::<u64>(c))
    }

    /// Forgets `run`: its liveness and notifications.
    pub fn end(&self, run: &str) -> Result<(), StoreError> {
        self.redis.with(|c| redis::cmd("DEL").arg(key(run, "live")).arg(key(run, "done")).query::<()>(c))
    }

    /// `PING`.
    pub fn ping(&self) -> Result<(), StoreError> {
        self.redis.ping()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_bit_for_bit_and_a_cut_one_is_refused() {
        let rows = ShardRows {
            worker: "w1".into(),
            dim: 2,
            tokens: vec![3, 4],
            windows: vec![1, 1],
            data: vec![0.1, -0.0, f32::MIN_POSITIVE, 7.5],
            error: None,
        };
        let bytes = rows.encode();
        let back = ShardRows::decode(&bytes).unwrap();
        assert_eq!(
            back.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            rows.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(back, rows);
        assert_eq!(ShardRows::decode(&bytes[..bytes.len() - 4]), None);
    }
}
