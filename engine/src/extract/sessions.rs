//! The engine's sessions: in this process (the default, a bounded
//! [`SessionStore`]) or in a store shared by replicas
//! ([`SharedState`], `scd serve --state`), behind one interface so that
//! compress and adaptive requests read the same either way.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, MutexGuard};

use sha2::{Digest, Sha256};
use tracing::warn;

use super::prepare::{Given, PreparedContext};
use super::{Ledger, Scd, SessionRequest};
use crate::budget::TokenizerRegistry;
use crate::cache::EmbeddingCache;
use crate::cancel::Cancel;
use crate::context::Field;
use crate::session::{key, new_session_id, random_hex, same_secret, SessionEntry, SessionGrant, SessionLimits};
use crate::session::{SessionStats, SessionStore};
use crate::shared::{gone_cause, hex, Committed, ContextBlob, Inflight, Loaded, Opened, SessionRecord, SharedState};
use crate::shared::{unhex, StoreError, Turn};
use crate::{Error, Param, Result};

/// Where sessions live.
pub(super) enum Sessions {
    Local(SessionStore<Ledger>),
    Shared(Shared),
}

/// Sessions in a shared store.
pub(super) struct Shared {
    store: Arc<dyn SharedState>,
    limits: SessionLimits,
    inflight: Arc<Inflight>,
    /// Resolves a record's budget tokenizer by name.
    tokenizers: TokenizerRegistry,
}

/// A live session a request holds: its turn, and in a shared store the
/// record as loaded.
pub(super) enum Handle {
    Local(Arc<SessionEntry<Ledger>>),
    Shared(Box<SharedHandle>),
}

/// A session of a shared store, as loaded, with this process's turn on it.
pub(super) struct SharedHandle {
    key: String,
    id: String,
    version: u64,
    record: SessionRecord,
    _turn: Turn,
}

/// A session's ledger while a request works on it.
pub(super) enum Guard<'a> {
    Local(MutexGuard<'a, Ledger>),
    Shared(Box<Ledger>),
}

impl Deref for Guard<'_> {
    type Target = Ledger;
    fn deref(&self) -> &Ledger {
        match self {
            Guard::Local(g) => g,
            Guard::Shared(l) => l,
        }
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Ledger {
        match self {
            Guard::Local(g) => &mut *g,
            Guard::Shared(l) => l,
        }
    }
}

impl Handle {
    /// The digest of the context the session was opened on.
    pub(super) fn context_key(&self) -> Option<[u8; 32]> {
        match self {
            Handle::Local(e) => Some(*e.context_key()),
            Handle::Shared(h) => unhex(&h.record.context),
        }
    }
}

fn sha256_hex(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes()))
}

/// A store key safe to use as a Redis key: the session's scoped key hashed.
fn shared_key(id: &str, scope: Option<&str>) -> String {
    sha256_hex(&key(id, scope))[..40].to_string()
}

impl Shared {
    fn down(&self, e: StoreError) -> Error {
        Error::StateUnavailable { store: self.store.name().to_string(), reason: e.0 }
    }
}

/// Refuses a record naming a chunk its context does not have (a chunk
/// index is read from the store, and is used to index the context).
fn check_indices(record: &SessionRecord, chunks: usize) -> std::result::Result<(), StoreError> {
    let last = record.last.iter().flat_map(|l| l.chunks.iter().map(|(i, _)| i));
    match record.sent.iter().chain(last).find(|&&i| i >= chunks) {
        Some(i) => Err(StoreError(format!(
            "a session record names chunk {i} of a context of {chunks} chunks; was it written by another version?"
        ))),
        None => Ok(()),
    }
}

/// A session's state as the store keeps it.
fn record_of(base: &SessionRecord, l: &Ledger) -> SessionRecord {
    let mut sent: Vec<usize> = l.sent.iter().copied().collect();
    sent.sort_unstable();
    SessionRecord {
        sent,
        total_sent: l.total_sent,
        cap: l.cap,
        reply_budget: l.reply_budget,
        tokenizer: l.counting.tokenizer.as_ref().map(|t| t.name().to_string()),
        last: l.last.clone(),
        ..base.clone()
    }
}

impl Scd {
    /// Keeps sessions in `store`, shared with every replica using it,
    /// instead of this process's memory; `tokenizers` resolves the budget
    /// tokenizer a session counts in when another replica opened it.
    pub fn with_shared_state(mut self, store: Arc<dyn SharedState>, tokenizers: TokenizerRegistry) -> Self {
        let limits = self.sessions_limits();
        self.sessions = Sessions::Shared(Shared { store, limits, inflight: Default::default(), tokenizers });
        self
    }

    /// The shared store sessions live in, if any.
    pub fn shared_state(&self) -> Option<&Arc<dyn SharedState>> {
        match &self.sessions {
            Sessions::Shared(s) => Some(&s.store),
            Sessions::Local(_) => None,
        }
    }

    fn sessions_limits(&self) -> SessionLimits {
        SessionLimits {
            ttl: self.cfg.sessions.session_ttl,
            max_sessions: self.cfg.sessions.max_sessions,
            max_bytes: self.cfg.sessions.session_bytes,
        }
    }

    /// The live session `id`, its turn taken, when the token and caller
    /// match; `Ok(None)` when no session is live under it (a compress then
    /// opens one under that id).
    pub(super) fn find_session(&self, sr: &SessionRequest) -> Result<Option<Handle>> {
        let Some(id) = &sr.id else { return Ok(None) };
        match self.session(id, sr.token.as_deref().unwrap_or(""), sr.caller.as_deref(), sr.scope.as_deref()) {
            Ok(h) => Ok(Some(h)),
            Err(Error::UnknownSession { .. } | Error::SessionGone { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The live session `id`, its turn taken, if `token` (and `caller`, for
    /// a session bound to one) match.
    pub(super) fn session(&self, id: &str, token: &str, caller: Option<&str>, scope: Option<&str>) -> Result<Handle> {
        let s = match &self.sessions {
            Sessions::Local(store) => return store.get(id, token, caller, scope).map(Handle::Local),
            Sessions::Shared(s) => s,
        };
        if id.is_empty() {
            return Err(Error::invalid(Param::SessionId, "must not be empty"));
        }
        let key = shared_key(id, scope);
        let turn = s.inflight.take(&key);
        let (bytes, version) = match s.store.load(&key, &s.limits).map_err(|e| s.down(e))? {
            Loaded::Live { record, version } => (record, version),
            Loaded::Gone(code) => {
                return Err(Error::SessionGone { session_id: id.to_string(), cause: gone_cause(&code) })
            }
            Loaded::Unknown => return Err(Error::UnknownSession { session_id: id.to_string() }),
        };
        let record: SessionRecord = serde_json::from_slice(&bytes).map_err(|e| {
            s.down(StoreError(format!("session record unreadable ({e}); was it written by another version?")))
        })?;
        let owner_ok = record.owner.as_deref().is_none_or(|o| caller == Some(o));
        if !same_secret(&record.token_sha256, &sha256_hex(token)) || !owner_ok {
            return Err(Error::SessionForbidden { session_id: id.to_string() });
        }
        Ok(Handle::Shared(Box::new(SharedHandle { key, id: id.to_string(), version, record, _turn: turn })))
    }

    /// The ledger of a session held by `handle`. A shared one is rebuilt
    /// from its record: on `prepared` when the request already has the
    /// context, else from this replica's cache or the store's blob.
    pub(super) fn ledger<'a>(
        &self,
        handle: &'a Handle,
        prepared: Option<Arc<PreparedContext>>,
        cancel: &Cancel,
    ) -> Result<Guard<'a>> {
        let (record, id) = match handle {
            Handle::Local(e) => return Ok(Guard::Local(e.lock())),
            Handle::Shared(h) => (&h.record, &h.id),
        };
        let Sessions::Shared(s) = &self.sessions else { unreachable!("a shared handle comes from a shared store") };
        let context = match prepared {
            Some(p) => p,
            None => self.restore_context(s, &record.context, id, cancel)?,
        };
        let tokenizer = match &record.tokenizer {
            Some(name) => s.tokenizers.resolve(name).map_err(|_| {
                s.down(StoreError(format!(
                    "the session counts in tokenizer {name:?}, which this replica does not have (start every replica with the same --tokenizer)"
                )))
            })?,
            None => None,
        };
        check_indices(record, context.chunks.len()).map_err(|e| s.down(e))?;
        let counting = self.counting(&context, tokenizer)?;
        Ok(Guard::Shared(Box::new(Ledger {
            context,
            sent: record.sent.iter().copied().collect(),
            total_sent: record.total_sent,
            cap: record.cap,
            reply_budget: record.reply_budget,
            counting,
            last: record.last.clone(),
        })))
    }

    /// The prepared context of digest `digest`: this replica's, or rebuilt
    /// from the store's blob with its embeddings (the encoder is not run).
    fn restore_context(&self, s: &Shared, digest: &str, id: &str, cancel: &Cancel) -> Result<Arc<PreparedContext>> {
        // a malformed digest matches nothing: the rebuilt context's check refuses it
        let key = unhex(digest).unwrap_or([0; 32]);
        if let Some(p) = self.prepared.get(&key) {
            return Ok(p);
        }
        let gone = || Error::SessionGone { session_id: id.to_string(), cause: gone_cause("evicted") };
        let bytes = s.store.context(digest).map_err(|e| s.down(e))?.ok_or_else(gone)?;
        let blob = ContextBlob::decode(&bytes).ok_or_else(|| {
            s.down(StoreError("a context blob is unreadable; was it written by another version?".into()))
        })?;
        // the blob's vectors are used only for the chunks of its own fields
        // whose keys they carry, checked, and cached nowhere (prepare_given)
        let given: Given = blob.embeddings.into_iter().collect();
        let fields: Vec<&Field> = blob.fields.iter().collect();
        let prepared = self.prepare_given(&fields, &given, cancel)?;
        if prepared.key != key {
            return Err(s.down(StoreError(
                "the stored context does not rebuild to its digest: every replica must run the same model and chunking options".into(),
            )));
        }
        Ok(prepared)
    }

    /// Writes back what a request changed in a shared session. Another
    /// replica's commit in between is [`Error::SessionContended`]: the
    /// request is redone on the new ledger.
    pub(super) fn commit(&self, handle: &Handle, ledger: &Guard<'_>) -> Result<()> {
        let (Handle::Shared(h), Sessions::Shared(s)) = (handle, &self.sessions) else {
            return Ok(());
        };
        let SharedHandle { key, id, version, record, .. } = &**h;
        let bytes = serde_json::to_vec(&record_of(record, ledger)).expect("a record serializes");
        match s.store.commit(key, *version, &bytes, &s.limits).map_err(|e| s.down(e))? {
            Committed::Done => Ok(()),
            Committed::Conflict => Err(Error::SessionContended { session_id: id.clone() }),
            Committed::Gone(code) => Err(Error::SessionGone {
                session_id: id.clone(),
                cause: gone_cause(code.as_deref().unwrap_or("evicted")),
            }),
        }
    }

    /// Opens a session for `sr` holding `ledger`, over the public `fields`.
    pub(super) fn open_session(
        &self,
        sr: &SessionRequest,
        prepared: &PreparedContext,
        fields: &[&Field],
        ledger: Ledger,
    ) -> Result<SessionGrant> {
        let bytes = prepared.bytes + 8 * prepared.chunks.len();
        let s = match &self.sessions {
            Sessions::Local(store) => {
                return store.open(sr.id.clone(), sr.caller.clone(), sr.scope.as_deref(), prepared.key, bytes, ledger)
            }
            Sessions::Shared(s) => s,
        };
        let id = new_session_id(sr.id.clone())?;
        let weight = s.limits.weight(bytes)?;
        let token = random_hex();
        let digest = hex(&prepared.key);
        let record = SessionRecord {
            token_sha256: sha256_hex(&token),
            owner: sr.caller.clone(),
            context: digest.clone(),
            sent: vec![],
            total_sent: 0,
            cap: None,
            reply_budget: 0,
            tokenizer: None,
            last: None,
        };
        let record = serde_json::to_vec(&record_of(&record, &ledger)).expect("a record serializes");
        let model = self.encoder.model_id();
        let blob = ContextBlob {
            fields: fields.iter().map(|f| (*f).clone()).collect(),
            embeddings: prepared
                .chunks
                .iter()
                .map(|c| (EmbeddingCache::key(model, 0, &c.embed_text), c.embedding.to_vec()))
                .collect(),
        };
        let key = shared_key(&id, sr.scope.as_deref());
        let _turn = s.inflight.take(&key);
        let opened = s
            .store
            .open(&key, sr.scope.as_deref(), u64::from(weight), &record, (&digest, &blob.encode()), &s.limits)
            .map_err(|e| s.down(e))?;
        match opened {
            Opened::Fresh => Ok(SessionGrant { id, token }),
            Opened::Taken => Err(Error::SessionForbidden { session_id: id }),
        }
    }

    /// Closes a session; `Ok(false)` when none is live under `id`.
    pub fn close_session(&self, id: &str, token: &str, caller: Option<&str>, scope: Option<&str>) -> Result<bool> {
        let s = match &self.sessions {
            Sessions::Local(store) => return store.close(id, token, caller, scope),
            Sessions::Shared(s) => s,
        };
        match self.session(id, token, caller, scope) {
            Ok(Handle::Shared(h)) => s.store.close(&h.key, &s.limits).map_err(|e| s.down(e)),
            Ok(Handle::Local(_)) => unreachable!("a shared store gives shared handles"),
            Err(Error::UnknownSession { .. } | Error::SessionGone { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Live sessions, their bytes, evictions and expiries (over every
    /// replica when shared; zeros, logged, when the store does not answer).
    pub fn session_stats(&self) -> SessionStats {
        match &self.sessions {
            Sessions::Local(store) => store.stats(),
            Sessions::Shared(s) => s.store.stats(&s.limits).unwrap_or_else(|e| {
                warn!(store = s.store.name(), error = %e, "session counts unavailable");
                SessionStats::default()
            }),
        }
    }
}
