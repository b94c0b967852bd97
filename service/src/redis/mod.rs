//! Redis, the shared state of replicas (`scd serve --state`) and the queue
//! of a corpus embedded by many workers (`scd embed-batch --queue`).
//!
//! One small pool of blocking connections per store: the engine calls its
//! session store from the threads that run requests, and the embed
//! workers are plain threads. Every command has a read and write timeout,
//! so a Redis that stops answering turns into an error naming the store,
//! never a hung request.

pub mod queue;
pub mod sessions;
pub mod tasks;

use std::sync::Mutex;
use std::time::Duration;

use scd_engine::shared::StoreError;

/// Connections kept idle per pool.
const IDLE: usize = 16;

/// A Redis server at one URL, with a pool of blocking connections.
pub struct Redis {
    client: redis::Client,
    /// `redis://host:port/db`, never the password.
    name: String,
    idle: Mutex<Vec<redis::Connection>>,
    timeout: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").field("name", &self.name).finish()
    }
}

/// Why a Redis URL was refused.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {message}")]
pub struct UrlError {
    flag: &'static str,
    message: String,
}

impl Redis {
    /// A pool for `url` (`redis://[user:password@]host:port/db`); `flag`
    /// names the option in errors. Nothing is connected yet.
    pub fn open(flag: &'static str, url: &str, timeout: Duration) -> Result<Self, UrlError> {
        let refuse = |m: &str| UrlError { flag, message: m.to_string() };
        if !url.starts_with("redis://") && !url.starts_with("unix://") {
            return Err(refuse("must be a redis:// URL (redis://host:port/db) or unix:///path/to/redis.sock"));
        }
        let client = redis::Client::open(url).map_err(|e| refuse(&format!("not a Redis URL ({})", e.category())))?;
        let info = client.get_connection_info();
        let name = match info.addr() {
            redis::ConnectionAddr::Unix(p) => format!("unix://{}", p.display()),
            a => format!("redis://{a}/{}", info.redis_settings().db()),
        };
        Ok(Self { client, name, idle: Mutex::new(Vec::new()), timeout })
    }

    /// The server as an operator names it, without credentials.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on a pooled connection (a fresh one when none is idle); a
    /// connection that failed is dropped, not pooled. A pooled connection
    /// that turns out dead (the server restarted since) is replaced once.
    pub fn with<T>(&self, mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let was_pooled = pooled.is_some();
        let mut con = match pooled {
            Some(c) => c,
            None => self.connect()?,
        };
        let mut result = f(&mut con);
        if let Err(e) = &result {
            // a dead pooled connection (the server restarted since), not a
            // timeout: a command that timed out may have run
            if was_pooled && !e.is_timeout() && (e.is_io_error() || e.is_connection_dropped()) {
                con = self.connect()?;
                result = f(&mut con);
            }
        }
        match result {
            Ok(v) => {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                if idle.len() < IDLE {
                    idle.push(con);
                }
                Ok(v)
            }
            Err(e) => Err(describe(e)),
        }
    }

    fn connect(&self) -> Result<redis::Connection, StoreError> {
        let c = self.client.get_connection_with_timeout(self.timeout).map_err(describe)?;
        c.set_read_timeout(Some(self.timeout)).map_err(describe)?;
        c.set_write_timeout(Some(self.timeout)).map_err(describe)?;
        Ok(c)
    }

    /// A connection of its own (not pooled) whose reads wait at most
    /// `read_timeout`: a Pub/Sub subscriber.
    pub fn subscriber(&self, read_timeout: Duration) -> Result<redis::Connection, StoreError> {
        let c = self.client.get_connection_with_timeout(self.timeout).map_err(describe)?;
        c.set_read_timeout(Some(read_timeout)).map_err(describe)?;
        c.set_write_timeout(Some(self.timeout)).map_err(describe)?;
        Ok(c)
    }

    /// `PING`.
    pub fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| redis::cmd("PING").query::<String>(c)).map(drop)
    }
}

/// A Redis error as operators read it: what kind, and the server's words
/// for a server error (they never carry our values).
fn describe(e: redis::RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError("no answer within the timeout".into())
    } else if e.is_io_error() || e.is_connection_dropped() {
        StoreError(format!("cannot reach it ({e})"))
    } else {
        StoreError(e.to_string())
    }
}
