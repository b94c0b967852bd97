//! What survives a restart: one redb file, `atp.redb`, in the agent's data
//! directory.
//!
//! | table | key → value | |
//! |---|---|---|
//! | `proofs` | index (u64) → `InteractionProof` encoding | append-only, in log order; the Merkle log and the trust book are rebuilt from it on open |
//! | `nonces`, `nonce_times` | (DID, nonce) → timestamp, and (timestamp, DID, nonce) | the replay log ([`NonceLog`]); entries more than 2 × skew older than a newer message are pruned |
//! | `checkpoints` | task id → `TaskCheckpoint` encoding | the latest per task |
//! | `peers` | DID → profile JSON | |
//! | `tasks` | task id → bytes (a small JSON or proto record) | |
//! | `audit_records`, `audit_meta` | see [`scd_audit`] | only once [`Store::audit_log`] was opened |
//!
//! Every write is its own durable (fsync'd) transaction, replay-log entries
//! included: a message seen just before a crash (SIGKILL, power loss) is
//! still refused as a replay after the restart. That costs one fsync per
//! incoming signed message (grouping entries without fsync was much cheaper
//! but forgot the last nonces on a SIGKILL, which the restart test caught);
//! the fsync bounds how many signed messages one agent verifies a second.
//! (Not yet measured by a committed bench.)
//!
//! [`Ledger`] puts the proof table, a [`MerkleLog`] and a [`TrustBook`]
//! together: appending a proof checks both signatures, stores it, logs it
//! and counts it.
//!
//! ```
//! use scd_atp::identity::NonceLog;
//! use scd_atp::store::Store;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let now = scd_atp::identity::now_s();
//! {
//!     let store = Store::open(dir.path()).unwrap();
//!     assert!(store.first_seen("did:key:z6Mk…", 42, now).unwrap());
//! }
//! let reopened = Store::open(dir.path()).unwrap();
//! assert!(!reopened.first_seen("did:key:z6Mk…", 42, now).unwrap());
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::error::{Error, Result};
use crate::identity::{check_proof, check_signature, now_s, NonceLog, Resolver, Signed, MAX_CLOCK_SKEW_S};
use crate::merkle::{proof_leaf_bytes, Hash, MerkleLog};
use crate::pb;
use crate::trust::{TrustBook, TrustParams, TrustScore};
use scd_audit::{AuditLevel, AuditLog, Retention};

const PROOFS: TableDefinition<u64, &[u8]> = TableDefinition::new("proofs");
const NONCES: TableDefinition<(&str, u64), i64> = TableDefinition::new("nonces");
const NONCE_TIMES: TableDefinition<(i64, &str, u64), ()> = TableDefinition::new("nonce_times");
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
const PEERS: TableDefinition<&str, &str> = TableDefinition::new("peers");
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");

/// The file name of the store in its directory.
pub const STORE_FILE: &str = "atp.redb";

/// Nonces are pruned every this many insertions (and on open).
const PRUNE_EVERY: u64 = 1024;

fn store_err<E: Into<redb::Error>>(e: E) -> Error {
    Error::Store { source: Box::new(e.into()) }
}

/// The agent's persistent state (see the module docs).
pub struct Store {
    db: Arc<Database>,
    path: PathBuf,
    /// Replay-log entries with a timestamp below this were pruned: such
    /// messages are refused.
    nonce_floor: AtomicI64,
    inserts: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) `dir/atp.redb`, creating `dir` if needed, and
    /// prunes replay entries older than 2 × skew before now.
    pub fn open(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join(STORE_FILE);
        let db = Database::create(&path).map_err(store_err)?;
        let tx = db.begin_write().map_err(store_err)?;
        {
            tx.open_table(PROOFS).map_err(store_err)?;
            tx.open_table(NONCES).map_err(store_err)?;
            tx.open_table(NONCE_TIMES).map_err(store_err)?;
            tx.open_table(CHECKPOINTS).map_err(store_err)?;
            tx.open_table(PEERS).map_err(store_err)?;
            tx.open_table(TASKS).map_err(store_err)?;
        }
        tx.commit().map_err(store_err)?;
        let store = Store { db: Arc::new(db), path, nonce_floor: AtomicI64::new(i64::MIN), inserts: AtomicU64::new(0) };
        let pruned = store.prune_nonces(now_s())?;
        tracing::debug!(path = %store.path.display(), pruned, proofs = store.proof_count()?, "store opened");
        Ok(store)
    }

    /// The redb file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The audit trail (see [`scd_audit`]) in this store's file: an ATP
    /// node keeps its `AtpTransfer` records beside its proofs.
    pub fn audit_log(&self, level: AuditLevel, retention: Retention) -> Result<AuditLog> {
        Ok(AuditLog::on(self.db.clone(), &self.path, level, retention)?)
    }

    /// Makes every earlier write durable (an empty fsync'd commit).
    pub fn flush(&self) -> Result<()> {
        let tx = self.db.begin_write().map_err(store_err)?;
        tx.commit().map_err(store_err)?;
        Ok(())
    }

    // -- proofs ------------------------------------------------------------

    /// Appends a proof (as given: callers check signatures); returns its index.
    pub fn append_proof(&self, proof: &pb::InteractionProof) -> Result<u64> {
        let tx = self.db.begin_write().map_err(store_err)?;
        let index = {
            let mut table = tx.open_table(PROOFS).map_err(store_err)?;
            let index = table.len().map_err(store_err)?;
            table.insert(index, proof.encode_to_vec().as_slice()).map_err(store_err)?;
            index
        };
        tx.commit().map_err(store_err)?;
        Ok(index)
    }

    /// Every stored proof, in order.
    pub fn proofs(&self) -> Result<Vec<pb::InteractionProof>> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(PROOFS).map_err(store_err)?;
        let mut out = Vec::with_capacity(table.len().map_err(store_err)? as usize);
        for row in table.iter().map_err(store_err)? {
            let (index, bytes) = row.map_err(store_err)?;
            let proof = pb::InteractionProof::decode(bytes.value())
                .map_err(|source| Error::Decode { what: format!("proofs[{}]", index.value()), source })?;
            out.push(proof);
        }
        Ok(out)
    }

    /// How many proofs are stored.
    pub fn proof_count(&self) -> Result<u64> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let n = tx.open_table(PROOFS).map_err(store_err)?.len().map_err(store_err)?;
        Ok(n)
    }

    // -- nonces ------------------------------------------------------------

    /// Forgets replay entries older than `now_s` − 2 × skew (a replay that
    /// old is refused as stale) and refuses such timestamps from now on.
    /// Returns how many were forgotten.
    pub fn prune_nonces(&self, now_s: i64) -> Result<usize> {
        let cutoff = now_s.saturating_sub(2 * MAX_CLOCK_SKEW_S);
        self.nonce_floor.fetch_max(cutoff, Ordering::SeqCst);
        let tx = self.db.begin_write().map_err(store_err)?;
        let pruned = {
            let mut times = tx.open_table(NONCE_TIMES).map_err(store_err)?;
            let mut nonces = tx.open_table(NONCES).map_err(store_err)?;
            let old: Vec<(i64, String, u64)> = times
                .range(..(cutoff, "", 0u64))
                .map_err(store_err)?
                .map(|row| {
                    row.map(|(k, _)| {
                        let (ts, did, nonce) = k.value();
                        (ts, did.to_string(), nonce)
                    })
                })
                .collect::<std::result::Result<_, _>>()
                .map_err(store_err)?;
            for (ts, did, nonce) in &old {
                times.remove((*ts, did.as_str(), *nonce)).map_err(store_err)?;
                nonces.remove((did.as_str(), *nonce)).map_err(store_err)?;
            }
            old.len()
        };
        tx.commit().map_err(store_err)?;
        Ok(pruned)
    }

    /// How many (DID, nonce) pairs the replay log holds.
    pub fn nonce_count(&self) -> Result<u64> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let n = tx.open_table(NONCES).map_err(store_err)?.len().map_err(store_err)?;
        Ok(n)
    }

    // -- checkpoints -------------------------------------------------------

    /// Stores a task's checkpoint unless the stored one, from the same
    /// agent, is further along (a late, out-of-order checkpoint never
    /// replaces a newer one).
    pub fn put_checkpoint(&self, checkpoint: &pb::TaskCheckpoint) -> Result<()> {
        if checkpoint.task_id.is_empty() {
            return Err(Error::Invalid { field: "checkpoint.task_id".into(), reason: "empty".into() });
        }
        if let Some(stored) = self.checkpoint(&checkpoint.task_id)? {
            if stored.agent == checkpoint.agent && stored.step_number > checkpoint.step_number {
                return Ok(());
            }
        }
        self.put_bytes(CHECKPOINTS, &checkpoint.task_id, &checkpoint.encode_to_vec())
    }

    /// The latest checkpoint of a task.
    pub fn checkpoint(&self, task_id: &str) -> Result<Option<pb::TaskCheckpoint>> {
        let Some(bytes) = self.get_bytes(CHECKPOINTS, task_id)? else { return Ok(None) };
        pb::TaskCheckpoint::decode(bytes.as_slice())
            .map(Some)
            .map_err(|source| Error::Decode { what: format!("checkpoints[{task_id}]"), source })
    }

    /// Forgets a task's checkpoint (the task finished).
    pub fn remove_checkpoint(&self, task_id: &str) -> Result<bool> {
        self.remove(CHECKPOINTS, task_id)
    }

    // -- peers -------------------------------------------------------------

    /// Stores a peer's profile (JSON).
    pub fn put_peer(&self, did: &str, profile: &serde_json::Value) -> Result<()> {
        let json = profile.to_string();
        let tx = self.db.begin_write().map_err(store_err)?;
        tx.open_table(PEERS).map_err(store_err)?.insert(did, json.as_str()).map_err(store_err)?;
        tx.commit().map_err(store_err)
    }

    /// A peer's profile.
    pub fn peer(&self, did: &str) -> Result<Option<serde_json::Value>> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(PEERS).map_err(store_err)?;
        let Some(json) = table.get(did).map_err(store_err)? else { return Ok(None) };
        serde_json::from_str(json.value())
            .map(Some)
            .map_err(|source| Error::Json { what: format!("peers[{did}]"), source })
    }

    /// Every peer and its profile.
    pub fn peers(&self) -> Result<Vec<(String, serde_json::Value)>> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(PEERS).map_err(store_err)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(store_err)? {
            let (did, json) = row.map_err(store_err)?;
            let did = did.value().to_string();
            let profile = serde_json::from_str(json.value())
                .map_err(|source| Error::Json { what: format!("peers[{did}]"), source })?;
            out.push((did, profile));
        }
        Ok(out)
    }

    // -- tasks -------------------------------------------------------------

    /// Stores a task record (a small JSON or proto encoding).
    pub fn put_task(&self, task_id: &str, record: &[u8]) -> Result<()> {
        self.put_bytes(TASKS, task_id, record)
    }

    /// A task record.
    pub fn task(&self, task_id: &str) -> Result<Option<Vec<u8>>> {
        self.get_bytes(TASKS, task_id)
    }

    /// Every task id and record.
    pub fn tasks(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(TASKS).map_err(store_err)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(store_err)? {
            let (id, record) = row.map_err(store_err)?;
            out.push((id.value().to_string(), record.value().to_vec()));
        }
        Ok(out)
    }

    // -- helpers -----------------------------------------------------------

    fn put_bytes(&self, table: TableDefinition<&'static str, &'static [u8]>, key: &str, value: &[u8]) -> Result<()> {
        let tx = self.db.begin_write().map_err(store_err)?;
        tx.open_table(table).map_err(store_err)?.insert(key, value).map_err(store_err)?;
        tx.commit().map_err(store_err)
    }

    fn get_bytes(&self, table: TableDefinition<&'static str, &'static [u8]>, key: &str) -> Result<Option<Vec<u8>>> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(table).map_err(store_err)?;
        let value = table.get(key).map_err(store_err)?.map(|v| v.value().to_vec());
        Ok(value)
    }

    fn remove<V: redb::Value + 'static>(&self, table: TableDefinition<&'static str, V>, key: &str) -> Result<bool> {
        let tx = self.db.begin_write().map_err(store_err)?;
        let removed = tx.open_table(table).map_err(store_err)?.remove(key).map_err(store_err)?.is_some();
        tx.commit().map_err(store_err)?;
        Ok(removed)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(path = %self.path.display(), error = %e, "store: last replay entries not made durable");
        }
    }
}

impl NonceLog for Store {
    /// Durable: a (DID, nonce) seen before a restart is still refused after it.
    fn first_seen(&self, did: &str, nonce: u64, ts_s: i64) -> scd_did::Result<bool> {
        self.first_seen_durably(did, nonce, ts_s).map_err(|e| scd_did::Error::NonceLog { reason: e.to_string() })
    }
}

impl Store {
    fn first_seen_durably(&self, did: &str, nonce: u64, ts_s: i64) -> Result<bool> {
        if ts_s < self.nonce_floor.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let tx = self.db.begin_write().map_err(store_err)?;
        let fresh = {
            let mut nonces = tx.open_table(NONCES).map_err(store_err)?;
            if nonces.get((did, nonce)).map_err(store_err)?.is_some() {
                false
            } else {
                nonces.insert((did, nonce), ts_s).map_err(store_err)?;
                tx.open_table(NONCE_TIMES).map_err(store_err)?.insert((ts_s, did, nonce), ()).map_err(store_err)?;
                true
            }
        };
        if !fresh {
            return Ok(false);
        }
        let inserted = self.inserts.fetch_add(1, Ordering::Relaxed) + 1;
        tx.commit().map_err(store_err)?;
        if inserted.is_multiple_of(PRUNE_EVERY) {
            self.prune_nonces(ts_s)?;
        }
        Ok(true)
    }
}

/// Proofs, their Merkle log and the trust they give, kept together and
/// persisted in a [`Store`].
pub struct Ledger {
    store: Arc<Store>,
    owner: String,
    resolver: Arc<dyn Resolver>,
    log: MerkleLog,
    book: TrustBook,
    proofs: Vec<pb::InteractionProof>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("owner", &self.owner).field("proofs", &self.proofs.len()).finish_non_exhaustive()
    }
}

impl Ledger {
    /// Loads the proofs in `store` into a Merkle log and a trust book owned
    /// (anchored) by `owner_did`; proof signers resolve with `resolver`.
    pub fn open(
        store: Arc<Store>,
        owner_did: &str,
        params: TrustParams,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Ledger> {
        let mut ledger = Ledger {
            store,
            owner: owner_did.to_string(),
            book: TrustBook::with_resolver(params, owner_did, resolver.clone()),
            resolver,
            log: MerkleLog::new(),
            proofs: Vec::new(),
        };
        for proof in ledger.store.proofs()? {
            // Checked when appended; counted again without re-verifying.
            ledger.book.add_checked(&proof)?;
            ledger.log.append(&proof_leaf_bytes(&proof));
            ledger.proofs.push(proof);
        }
        Ok(ledger)
    }

    /// Checks a proof (both signatures, the trust book's rules), stores it,
    /// logs it; returns its index, the new root and its inclusion proof.
    pub fn append(&mut self, proof: pb::InteractionProof) -> Result<(u64, Hash, pb::InclusionProof)> {
        check_proof(self.resolver.as_ref(), &proof)?;
        let logged = self.log_checked(proof)?;
        let inclusion = self.log.inclusion_proof(logged).expect("the leaf was just appended");
        tracing::debug!(index = logged, size = self.log.len(), "proof logged");
        Ok((logged, self.log.root(), inclusion))
    }

    /// Counts, stores and logs a proof whose signatures were checked.
    fn log_checked(&mut self, proof: pb::InteractionProof) -> Result<u64> {
        self.book.add_checked(&proof)?;
        let index = self.store.append_proof(&proof)?;
        let logged = self.log.append(&proof_leaf_bytes(&proof));
        debug_assert_eq!(index, logged, "store and log stay in step");
        self.proofs.push(proof);
        Ok(logged)
    }

    /// Logs the owner's own observation of another agent that its subject
    /// did not countersign (it refused, or its answer did not verify): it
    /// counts in the owner's book, as the owner believes what it saw, and
    /// never in an offer's evidence (that shows proofs about the owner).
    /// The evaluator must be the owner, its signature must verify and the
    /// responder signature must be empty.
    pub fn append_own(&mut self, proof: pb::InteractionProof) -> Result<u64> {
        if proof.sender() != self.owner {
            return Err(Error::Invalid {
                field: "proof.evaluator".into(),
                reason: "an unsigned-by-subject proof must be the ledger owner's own".into(),
            });
        }
        if !proof.responder_signature.is_empty() {
            return Err(Error::Invalid {
                field: "proof.responder_signature".into(),
                reason: "set: a countersigned proof goes through append".into(),
            });
        }
        check_signature(self.resolver.as_ref(), &proof)?;
        let logged = self.log_checked(proof)?;
        tracing::debug!(index = logged, "own observation logged without a countersignature");
        Ok(logged)
    }

    /// What an offer shows: the log's root and size, and up to `max` of the
    /// most recent proofs of `task_type` about the owner, each with its
    /// inclusion proof at the current size.
    pub fn evidence(&self, task_type: pb::TaskType, max: usize) -> pb::TrustEvidence {
        let mut proofs = Vec::new();
        let mut inclusion = Vec::new();
        for (index, proof) in self.proofs.iter().enumerate().rev() {
            if proofs.len() >= max {
                break;
            }
            let about_owner = proof.subject.as_ref().is_some_and(|s| s.uuid == self.owner);
            if about_owner && proof.task_type == task_type as i32 {
                proofs.push(proof.clone());
                inclusion.push(self.log.inclusion_proof(index as u64).expect("index in range"));
            }
        }
        pb::TrustEvidence { merkle_root: self.log.root().to_vec(), log_size: self.log.len(), proofs, inclusion }
    }

    /// T(did) per task type or aggregated, at `now_s`.
    pub fn trust(&self, did: &str, task_type: Option<pb::TaskType>, now_s: i64) -> TrustScore {
        self.book.trust(did, task_type, now_s)
    }

    /// Transitive trust (see [`TrustBook::transitive`]).
    pub fn transitive(&self, did: &str, task_type: Option<pb::TaskType>, now_s: i64) -> f64 {
        self.book.transitive(did, task_type, now_s)
    }

    /// The Merkle root now.
    pub fn root(&self) -> Hash {
        self.log.root()
    }

    /// How many proofs.
    pub fn len(&self) -> u64 {
        self.log.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// The proofs, in log order.
    pub fn proofs(&self) -> &[pb::InteractionProof] {
        &self.proofs
    }

    /// The Merkle log.
    pub fn log(&self) -> &MerkleLog {
        &self.log
    }

    /// The trust book.
    pub fn book(&self) -> &TrustBook {
        &self.book
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::SignMessages as _;
    use crate::identity::{fresh_nonce, DidResolver, Identity, MemoryNonceLog, Verifier};
    use crate::merkle::{verify_evidence, verify_inclusion};

    const CODE: pb::TaskType = pb::TaskType::CodeGeneration;

    fn proof(eval: &Identity, subj: &Identity, tt: pb::TaskType, q: f64) -> pb::InteractionProof {
        let mut p = pb::InteractionProof {
            evaluator: Some(eval.agent_id()),
            subject: Some(subj.agent_id()),
            task_id: format!("t-{}", fresh_nonce()),
            task_type: tt as i32,
            quality_score: q,
            latency_ms: 120,
            cost: 0.01,
            ..Default::default()
        };
        eval.stamp_and_sign(&mut p);
        subj.countersign(&mut p);
        p
    }

    fn ledger(store: &Arc<Store>, owner: &Identity) -> Ledger {
        Ledger::open(store.clone(), owner.did(), TrustParams::default(), Arc::new(DidResolver::new())).unwrap()
    }

    #[test]
    fn an_own_observation_counts_without_a_countersignature_and_only_the_owners() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (me, w, other) = (Identity::generate(), Identity::generate(), Identity::generate());
        let mut l = ledger(&store, &me);
        let uncountersigned = |eval: &Identity, q: f64| {
            let mut p = proof(eval, &w, CODE, q);
            p.responder_signature.clear();
            p
        };
        for _ in 0..3 {
            l.append_own(uncountersigned(&me, 0.0)).unwrap();
        }
        let t = l.trust(w.did(), Some(CODE), now_s());
        assert!(t.score == 0.0 && t.samples == 3, "{t:?}");
        assert!(l.evidence(CODE, 8).proofs.is_empty(), "evidence shows proofs about the owner only");
        // another evaluator's, a countersigned one, a forged signature
        let e = l.append_own(uncountersigned(&other, 0.9)).unwrap_err().to_string();
        assert!(e.starts_with("proof.evaluator:"), "{e}");
        let e = l.append_own(proof(&me, &w, CODE, 0.9)).unwrap_err().to_string();
        assert!(e.starts_with("proof.responder_signature:"), "{e}");
        let mut forged = uncountersigned(&me, 0.9);
        forged.quality_score = 1.0;
        assert!(l.append_own(forged).is_err(), "the evaluator's signature is checked");
        // it survives a restart like any other proof
        drop(l);
        let l = ledger(&store, &me);
        assert_eq!(l.trust(w.did(), Some(CODE), now_s()).samples, 3);
    }

    #[test]
    fn everything_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (me, w1, w2) = (Identity::generate(), Identity::generate(), Identity::generate());
        let now = now_s();
        let (root, trust_w1, trust_w2, transitive, count, beat);
        {
            let store = Arc::new(Store::open(dir.path()).unwrap());
            let mut ledger = ledger(&store, &me);
            for i in 0..4 {
                ledger.append(proof(&me, &w1, CODE, 0.7 + i as f64 * 0.05)).unwrap();
                ledger.append(proof(&me, &w2, pb::TaskType::Analysis, 0.4)).unwrap();
                ledger.append(proof(&w1, &w2, CODE, 0.9)).unwrap();
            }
            root = ledger.root();
            count = ledger.len();
            trust_w1 = ledger.trust(w1.did(), Some(CODE), now);
            trust_w2 = ledger.trust(w2.did(), None, now);
            transitive = ledger.transitive(w2.did(), None, now);
            assert!(trust_w1.samples == 4 && trust_w1.score > 0.5);

            let verifier = Verifier::new(Arc::new(DidResolver::new()), store.clone());
            let mut hb = pb::Heartbeat { from: Some(w1.agent_id()), sequence: 1, ..Default::default() };
            w1.stamp_and_sign(&mut hb);
            verifier.verify(&hb).unwrap();
            beat = hb;

            let cp = pb::TaskCheckpoint {
                task_id: "task-1".into(),
                agent: Some(w1.agent_id()),
                step_number: 3,
                intermediate_state: b"half done".to_vec(),
                ..Default::default()
            };
            store.put_checkpoint(&cp).unwrap();
            store.put_peer(w1.did(), &serde_json::json!({"endpoint": "http://127.0.0.1:1"})).unwrap();
            store.put_task("task-1", b"{\"status\":\"running\"}").unwrap();
        }
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let ledger = ledger(&store, &me);
        assert_eq!(ledger.len(), count);
        assert_eq!(ledger.root(), root);
        assert_eq!(ledger.trust(w1.did(), Some(CODE), now), trust_w1);
        assert_eq!(ledger.trust(w2.did(), None, now), trust_w2);
        assert_eq!(ledger.transitive(w2.did(), None, now), transitive);
        // The replayed heartbeat is still refused after the restart.
        let verifier = Verifier::new(Arc::new(DidResolver::new()), store.clone());
        assert!(matches!(verifier.verify(&beat), Err(crate::identity::AuthFailure::Replayed { .. })));
        let cp = store.checkpoint("task-1").unwrap().unwrap();
        assert_eq!((cp.step_number, cp.intermediate_state.as_slice()), (3, b"half done".as_slice()));
        assert_eq!(store.peer(w1.did()).unwrap().unwrap()["endpoint"], "http://127.0.0.1:1");
        assert_eq!(store.peers().unwrap().len(), 1);
        assert_eq!(store.task("task-1").unwrap().unwrap(), b"{\"status\":\"running\"}");
        assert_eq!(store.tasks().unwrap().len(), 1);
        assert_eq!(store.checkpoint("task-2").unwrap(), None);
    }

    #[test]
    fn ledger_refuses_bad_proofs_and_proves_inclusion() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let (me, w) = (Identity::generate(), Identity::generate());
        let mut ledger = ledger(&store, &me);
        let good = proof(&w, &me, CODE, 0.9);
        let (index, root, inclusion) = ledger.append(good.clone()).unwrap();
        assert_eq!(index, 0);
        assert!(verify_inclusion(&inclusion, &root));
        // The same proof again, one countersigned by the wrong agent, one unsigned.
        assert!(matches!(ledger.append(good.clone()), Err(Error::Auth(_))));
        let mut forged = proof(&w, &me, CODE, 0.9);
        w.countersign(&mut forged);
        assert!(matches!(ledger.append(forged), Err(Error::Auth(_))));
        let mut unsigned = proof(&w, &me, CODE, 0.9);
        unsigned.signature.clear();
        assert!(matches!(ledger.append(unsigned), Err(Error::Auth(_))));
        assert_eq!(store.proof_count().unwrap(), 1, "nothing refused was stored");

        for _ in 0..5 {
            ledger.append(proof(&w, &me, CODE, 0.8)).unwrap();
            ledger.append(proof(&w, &me, pb::TaskType::Analysis, 0.8)).unwrap();
            ledger.append(proof(&me, &w, CODE, 0.8)).unwrap();
        }
        let evidence = ledger.evidence(CODE, 3);
        assert_eq!(evidence.proofs.len(), 3);
        assert_eq!(evidence.log_size, ledger.len());
        assert!(evidence
            .proofs
            .iter()
            .all(|p| p.subject.as_ref().unwrap().uuid == me.did() && p.task_type == CODE as i32));
        assert!(verify_evidence(&evidence));
        assert_eq!(ledger.evidence(CODE, 100).proofs.len(), 6);
        assert!(ledger.evidence(pb::TaskType::CreativeWriting, 5).proofs.is_empty());
    }

    #[test]
    fn old_nonces_are_pruned_and_older_timestamps_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let t = now_s();
        assert!(store.first_seen("did:key:a", 1, t).unwrap());
        assert!(store.first_seen("did:key:a", 2, t + 10).unwrap());
        assert!(!store.first_seen("did:key:a", 1, t).unwrap());
        assert_eq!(store.nonce_count().unwrap(), 2);
        assert_eq!(store.prune_nonces(t + 2 * MAX_CLOCK_SKEW_S + 5).unwrap(), 1);
        assert_eq!(store.nonce_count().unwrap(), 1);
        // The pruned one is refused by its age, not forgotten into acceptance.
        assert!(!store.first_seen("did:key:a", 1, t).unwrap());
        assert!(!store.first_seen("did:key:a", 2, t + 10).unwrap());
        drop(store);
        // Reopening prunes against the clock.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.nonce_count().unwrap(), 1);
        let old = t - 3600;
        let fresh = Store::open(tempfile::tempdir().unwrap().path()).unwrap();
        assert!(!fresh.first_seen("did:key:b", 1, old).unwrap(), "a timestamp older than 2×skew is refused");
    }

    #[test]
    fn nonces_prune_themselves_as_time_passes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let t = now_s();
        for i in 0..PRUNE_EVERY {
            assert!(store.first_seen("did:key:a", i, t + (i as i64) / 4).unwrap());
        }
        // The last insertion pruned everything older than its timestamp − 2×skew.
        let newest = t + (PRUNE_EVERY as i64 - 1) / 4;
        let expected = (0..PRUNE_EVERY).filter(|i| t + (*i as i64) / 4 >= newest - 2 * MAX_CLOCK_SKEW_S).count();
        assert_eq!(store.nonce_count().unwrap(), expected as u64);
    }

    #[test]
    fn checkpoints_keep_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = (Identity::generate(), Identity::generate());
        let cp = |agent: &Identity, step| pb::TaskCheckpoint {
            task_id: "t".into(),
            agent: Some(agent.agent_id()),
            step_number: step,
            ..Default::default()
        };
        store.put_checkpoint(&cp(&a, 5)).unwrap();
        store.put_checkpoint(&cp(&a, 4)).unwrap();
        assert_eq!(store.checkpoint("t").unwrap().unwrap().step_number, 5, "a late checkpoint does not regress");
        // After failover the replacement's checkpoints win.
        store.put_checkpoint(&cp(&b, 1)).unwrap();
        assert_eq!(store.checkpoint("t").unwrap().unwrap().agent, Some(b.agent_id()));
        assert!(store.remove_checkpoint("t").unwrap());
        assert!(store.checkpoint("t").unwrap().is_none());
        let err = store.put_checkpoint(&pb::TaskCheckpoint::default()).unwrap_err();
        assert_eq!(err.to_string(), "checkpoint.task_id: empty");
    }

    #[test]
    fn memory_and_store_nonce_logs_agree() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let memory = MemoryNonceLog::default();
        let t = now_s();
        for (did, nonce, ts) in [("a", 1, t), ("a", 1, t), ("b", 1, t), ("a", 2, t + 1), ("b", 1, t + 2)] {
            assert_eq!(store.first_seen(did, nonce, ts).unwrap(), memory.first_seen(did, nonce, ts).unwrap());
        }
    }

    #[test]
    fn the_atp_store_hosts_the_audit_tables() {
        use scd_audit::{AuditChunk, AuditFilter, AuditRecord};
        let rec = |caller: &str| {
            let mut r = AuditRecord::new("transfer");
            r.caller = Some(caller.into());
            r.chunks = vec![AuditChunk { id: "c1".into(), field: "code".into(), score: 0.5, tokens: 12 }];
            r.chunk_count = 1;
            r
        };
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.audit_log(AuditLevel::Chunks, Retention::default()).unwrap();
            log.append(vec![rec("did:key:a")]).unwrap();
            store.put_task("t", b"{}").unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let log = store.audit_log(AuditLevel::Chunks, Retention::default()).unwrap();
        let got = log.query(&AuditFilter::default()).unwrap();
        assert_eq!((got.len(), got[0].chunks[0].id.as_str()), (1, "c1"));
        assert_eq!(log.path(), store.path());
        assert_eq!(store.task("t").unwrap().unwrap(), b"{}");
    }
}
