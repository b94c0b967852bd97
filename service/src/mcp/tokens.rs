//! The secret tokens of the sessions an MCP server opened, each bound to
//! the MCP client that opened it ([`Owner`]); see the module docs of
//! [`super`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{http, Peer};

/// The MCP client a request comes from, to which the sessions it opens are
/// bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Not over HTTP: stdio, one client per process.
    Stdio,
    /// Over HTTP within this MCP session (`Mcp-Session-Id`).
    HttpSession(String),
    /// Over HTTP without an MCP session (stateless mode): all such requests
    /// from one address (its text; empty when the listener gave none).
    HttpStateless(String),
}

/// The HTTP client's address of a request with `extensions` (the HTTP
/// listener puts it in the request's parts); `None` over stdio.
pub fn peer_of(extensions: &rmcp::model::Extensions) -> Peer {
    let parts = extensions.get::<axum::http::request::Parts>()?;
    parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0)
}

impl Owner {
    /// The owner of a request with `extensions` (rmcp puts the HTTP
    /// request's parts there).
    pub fn of(extensions: &rmcp::model::Extensions) -> Owner {
        match extensions.get::<axum::http::request::Parts>() {
            None => Owner::Stdio,
            Some(parts) => match parts.headers.get(http::SESSION_HEADER).and_then(|v| v.to_str().ok()) {
                Some(id) => Owner::HttpSession(id.to_string()),
                None => Owner::HttpStateless(
                    peer_of(extensions).map(|a| a.ip().to_canonical().to_string()).unwrap_or_default(),
                ),
            },
        }
    }

    /// Where the tokens map holds session `id` of this owner: a generated
    /// id as it is (global), a chosen one within its owner.
    fn slot(&self, id: &str) -> String {
        if scd_engine::session::is_generated(id) {
            return id.to_string();
        }
        match self {
            Owner::Stdio => format!("stdio\u{1f}{id}"),
            Owner::HttpSession(s) => format!("mcp:{s}\u{1f}{id}"),
            Owner::HttpStateless(a) => format!("ip:{a}\u{1f}{id}"),
        }
    }
}

/// A held session token and the client it belongs to.
type Held = (Owner, String);

/// A session `id` held for another MCP client.
#[derive(Debug)]
pub(super) struct NotYours;

/// The secret tokens of the sessions this server opened, by session id,
/// each with the [`Owner`] that opened it; bounded: past `capacity` the
/// oldest is forgotten (that session can then no longer be continued
/// through this server; the engine expires it).
pub struct SessionTokens {
    inner: Mutex<(HashMap<String, Held>, VecDeque<String>)>,
    capacity: usize,
}

impl SessionTokens {
    /// Holds at most `capacity` tokens (at least 1).
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self { inner: Mutex::new((HashMap::new(), VecDeque::new())), capacity: capacity.max(1) })
    }

    /// The token of session `id` for `owner`: none when it is not held,
    /// [`NotYours`] when another MCP client opened it.
    pub(super) fn get(&self, id: &str, owner: &Owner) -> Result<Option<String>, NotYours> {
        match self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.get(&owner.slot(id)) {
            None => Ok(None),
            Some((o, token)) if o == owner => Ok(Some(token.clone())),
            Some(_) => Err(NotYours),
        }
    }

    pub(super) fn insert(&self, id: String, owner: Owner, token: String) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        let id = owner.slot(&id);
        if map.insert(id.clone(), (owner, token)).is_none() {
            order.push_back(id);
            while order.len() > self.capacity {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                    tracing::debug!("forgot the oldest session token (--max-sessions)");
                }
            }
        }
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_tokens_are_bounded_oldest_first() {
        let t = SessionTokens::new(2);
        let o = Owner::Stdio;
        t.insert("a".into(), o.clone(), "ta".into());
        t.insert("b".into(), o.clone(), "tb".into());
        t.insert("a".into(), o.clone(), "ta2".into());
        assert_eq!(t.len(), 2);
        t.insert("c".into(), o.clone(), "tc".into());
        let get = |id| t.get(id, &o).unwrap();
        assert_eq!((get("a"), get("b").as_deref(), get("c").as_deref()), (None, Some("tb"), Some("tc")));
        // a generated id is global: another client's is refused; a chosen
        // id is each client's own
        let generated = format!("s-{}", "7".repeat(32));
        t.insert(generated.clone(), o.clone(), "tg".into());
        let stateless = Owner::HttpStateless("127.0.0.2".into());
        assert!(t.get(&generated, &stateless).is_err());
        assert_eq!(t.get("b", &stateless).unwrap(), None);
        t.insert("b".into(), stateless.clone(), "theirs".into());
        assert_eq!((t.get("b", &stateless).unwrap().as_deref(), get("b").as_deref()), (Some("theirs"), None));
    }
}
