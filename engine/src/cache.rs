//! Content-addressed embedding cache: (model id, input kind, normalized
//! text) → vector, bounded in bytes. A `moka` cache (TinyLFU admission,
//! weighed by bytes) rather than a hand-written LRU, over an optional
//! persistent tier ([`DiskTier`]): one redb file that every process of the
//! machine shares (`scd compress`, `scd mcp`, `scd serve`), so re-sending a
//! file, or calling again after a restart, embeds only what is new.
//!
//! The file is a cache, never a source of truth: a vector read back that
//! is not finite and unit-length is a miss; a file redb finds corrupt (or
//! panics on) is moved aside as `<file>.corrupt-<unix seconds>` and the
//! process goes on with the memory tier alone; a file another process
//! holds is waited on briefly, then the disk tier is skipped for a while.
//! A file this tier creates is private to its user (0600, in folders it
//! creates 0700).

use std::io::Read as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use moka::sync::Cache;
use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

type Key = [u8; 32];

/// Hit/miss counters and size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to embed.
    pub misses: u64,
    /// Lookups answered by the persistent tier (counted in `hits` too).
    pub disk_hits: u64,
    /// Vectors held.
    pub entries: usize,
    /// Bytes held (vectors + keys).
    pub bytes: usize,
}

/// A thread-safe, byte-bounded embedding cache, over an optional
/// persistent tier.
pub struct EmbeddingCache {
    cache: Option<Cache<Key, Arc<[f32]>>>,
    disk: Option<DiskTier>,
    hits: AtomicU64,
    misses: AtomicU64,
    disk_hits: AtomicU64,
}

impl std::fmt::Debug for EmbeddingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingCache").field("stats", &self.stats()).finish()
    }
}

/// Bytes an entry costs beyond its floats (key, bookkeeping).
const ENTRY_OVERHEAD: usize = 32 + 48;

fn weight(v: &Arc<[f32]>) -> u32 {
    u32::try_from(v.len() * 4 + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
}

impl EmbeddingCache {
    /// A cache holding at most `max_bytes` (0 disables caching).
    pub fn new(max_bytes: usize) -> Self {
        let cache = (max_bytes > 0)
            .then(|| Cache::builder().max_capacity(max_bytes as u64).weigher(|_, v: &Arc<[f32]>| weight(v)).build());
        Self { cache, disk: None, hits: AtomicU64::new(0), misses: AtomicU64::new(0), disk_hits: AtomicU64::new(0) }
    }

    /// This cache over the persistent tier `disk`.
    pub fn with_disk(mut self, disk: Option<DiskTier>) -> Self {
        self.disk = disk;
        self
    }

    /// The persistent tier, if any.
    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    /// The vectors of `keys` from memory, then from the persistent tier (one
    /// read there for all memory misses); counts hits and misses.
    pub fn get_many(&self, keys: &[Key]) -> Vec<Option<Arc<[f32]>>> {
        let mut out: Vec<Option<Arc<[f32]>>> =
            keys.iter().map(|k| self.cache.as_ref().and_then(|c| c.get(k))).collect();
        if let Some(disk) = &self.disk {
            let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
            if !missing.is_empty() {
                let wanted: Vec<Key> = missing.iter().map(|&i| keys[i]).collect();
                for (&i, v) in missing.iter().zip(disk.get_many(&wanted)) {
                    if let Some(v) = v {
                        if let Some(c) = &self.cache {
                            c.insert(keys[i], v.clone());
                        }
                        self.disk_hits.fetch_add(1, Ordering::Relaxed);
                        out[i] = Some(v);
                    }
                }
            }
        }
        let hits = out.iter().filter(|v| v.is_some()).count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        out
    }

    /// Stores vectors in memory and (one write) in the persistent tier.
    pub fn put_many(&self, entries: &[(Key, Arc<[f32]>)]) {
        if let Some(c) = &self.cache {
            for (k, v) in entries {
                c.insert(*k, v.clone());
            }
        }
        if let Some(disk) = &self.disk {
            disk.put_many(entries);
        }
    }

    /// The key of `text` under `model`: whitespace-normalized text.
    pub fn key(model: &str, kind: u8, text: &str) -> Key {
        let mut h = Sha256::new();
        h.update(model.as_bytes());
        h.update([0, kind]);
        for (i, w) in text.split_whitespace().enumerate() {
            if i > 0 {
                h.update(b" ");
            }
            h.update(w.as_bytes());
        }
        h.finalize().into()
    }

    /// The cached vector, counting a hit or a miss.
    pub fn get(&self, key: &Key) -> Option<Arc<[f32]>> {
        let v = self.cache.as_ref().and_then(|c| c.get(key));
        let counter = if v.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        v
    }

    /// Stores a vector; the cache evicts past its byte bound.
    pub fn put(&self, key: Key, vector: Arc<[f32]>) {
        if let Some(c) = &self.cache {
            c.insert(key, vector);
        }
    }

    /// Counts `n` lookups answered by a higher-level cache (a prepared
    /// context reused whole) as hits.
    pub fn record_hits(&self, n: usize) {
        self.hits.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counters and size (size after pending evictions are applied).
    pub fn stats(&self) -> CacheStats {
        let (entries, bytes) = match &self.cache {
            Some(c) => {
                c.run_pending_tasks();
                (c.entry_count() as usize, c.weighted_size() as usize)
            }
            None => (0, 0),
        };
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }
}

/// Vectors by key: 8 bytes of insertion sequence, then the f32s (LE).
const VECTORS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("vectors");
/// Keys by insertion sequence, oldest first: what the bound evicts.
const ORDER: TableDefinition<u64, &[u8]> = TableDefinition::new("order");
/// `next_seq` and `bytes`.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Bytes one stored entry counts against the bound.
fn stored_bytes(floats: usize) -> u64 {
    (32 + 8 + 8 + 4 * floats) as u64
}

/// How long an operation waits for another process holding the file.
const LOCK_WAIT: Duration = Duration::from_millis(100);
/// How long the tier is skipped after the file was found held that long.
pub const BUSY_BACKOFF: Duration = Duration::from_secs(30);
/// How long an operation waits for another thread of this process using
/// the tier before it goes on without it.
const TURN_WAIT: Duration = Duration::from_millis(250);
/// The first bytes of every redb file: a corrupt file that starts so is
/// ours to move aside; any other file is left where it is.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Whether `v` can be an embedding: finite, and of unit length (every
/// encoder L2-normalizes its rows). Anything read back from a file or a
/// store that is not is treated as absent.
pub fn is_unit_vector(v: &[f32]) -> bool {
    let mut sq = 0f64;
    for &x in v {
        if !x.is_finite() {
            return false;
        }
        sq += f64::from(x) * f64::from(x);
    }
    (sq - 1.0).abs() <= 1e-3
}

/// The persistent tier: one redb file holding vectors by content key,
/// bounded in bytes (oldest written first out). The file is opened per
/// operation and closed after, so that several processes share it: one
/// that finds it held by another retries for [`LOCK_WAIT`], then skips the
/// tier for [`BUSY_BACKOFF`]; a thread that finds another of its process
/// using the tier for [`TURN_WAIT`] skips it for that call. A cache never
/// fails a request (the first failure is logged), and redb's panics on a
/// corrupt file are contained: the file is moved aside and the tier turned
/// off for the life of the process. A vector found on disk is not re-dated,
/// so the bound is by age of writing.
pub struct DiskTier {
    path: PathBuf,
    max_bytes: u64,
    /// One operation at a time in this process (redb allows one opener).
    lock: Mutex<()>,
    warned: AtomicBool,
    /// Set for good once the file was found corrupt.
    off: AtomicBool,
    born: Instant,
    /// Milliseconds after `born` before which the tier is skipped.
    skip_until_ms: AtomicU64,
}

/// Why a disk operation failed.
enum Fault {
    /// Another process held the file for [`LOCK_WAIT`].
    Busy,
    /// redb found the file corrupt.
    Corrupt(String),
    /// Anything else (permissions, a folder in the way, a full disk).
    Other(String),
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").field("path", &self.path).field("max_bytes", &self.max_bytes).finish()
    }
}

fn store_error(e: impl Into<redb::Error>) -> Fault {
    match e.into() {
        redb::Error::Corrupted(m) => Fault::Corrupt(m),
        redb::Error::DatabaseAlreadyOpen => Fault::Busy,
        other => Fault::Other(other.to_string()),
    }
}

/// A redb handle that is forgotten, not dropped, while its thread unwinds.
/// redb panics on some corrupt pages while it holds a transaction's table
/// lock; that lock is then poisoned, and an open table's destructor
/// unwraps it: a second panic during unwinding aborts the process, so the
/// contained panic of [`DiskTier::run`] would take the server down. A
/// forgotten table keeps its transaction, so that one opening of the file
/// (its descriptor and pages) leaks, once: the tier is off for the process
/// after. (The write transaction itself still unwraps that lock when
/// dropped after a storage failure; redb reports those as errors first.)
struct Unwinding<T>(Option<T>);

impl<T> Unwinding<T> {
    fn new(t: T) -> Self {
        Self(Some(t))
    }
}

impl<T> std::ops::Deref for Unwinding<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("held until dropped")
    }
}

impl<T> std::ops::DerefMut for Unwinding<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held until dropped")
    }
}

impl<T> Drop for Unwinding<T> {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            if std::thread::panicking() {
                std::mem::forget(t);
            }
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    let text = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
    format!("redb panicked: {}", text.unwrap_or_else(|| "(no message)".into()))
}

impl DiskTier {
    /// A tier in the file `path` (created, 0600, with its folders, 0700, on
    /// first write), holding at most `max_bytes` of entries.
    pub fn new(path: impl Into<PathBuf>, max_bytes: u64) -> Self {
        Self {
            path: path.into(),
            max_bytes,
            lock: Mutex::new(()),
            warned: AtomicBool::new(false),
            off: AtomicBool::new(false),
            born: Instant::now(),
            skip_until_ms: AtomicU64::new(0),
        }
    }

    /// Whether the tier is in use now: not turned off by a corrupt file,
    /// not backing off from a file another process holds.
    pub fn is_active(&self) -> bool {
        !self.off.load(Ordering::Relaxed) && self.now_ms() >= self.skip_until_ms.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs `op` on the file unless the tier is off, backing off, or busy
    /// in this process; contains a panic of redb. `None`: not done.
    fn run<T>(&self, what: &str, op: impl FnOnce() -> Result<T, Fault>) -> Option<T> {
        if !self.is_active() {
            return None;
        }
        let Some(_one) = self.lock.try_lock_for(TURN_WAIT) else {
            debug!(path = %self.path.display(), "embedding cache: the file is in use by this process; skipped");
            return None;
        };
        if !self.is_active() {
            return None;
        }
        match std::panic::catch_unwind(AssertUnwindSafe(op)) {
            Ok(Ok(v)) => Some(v),
            Ok(Err(Fault::Busy)) => {
                let until = self.now_ms().saturating_add(BUSY_BACKOFF.as_millis() as u64);
                self.skip_until_ms.store(until, Ordering::Relaxed);
                self.fail(what, format!("held by another process; skipped for {} s", BUSY_BACKOFF.as_secs()));
                None
            }
            Ok(Err(Fault::Corrupt(why))) => {
                self.quarantine(&why);
                None
            }
            Ok(Err(Fault::Other(why))) => {
                self.fail(what, why);
                None
            }
            Err(panic) => {
                self.quarantine(&panic_text(&*panic));
                None
            }
        }
    }

    /// Turns the tier off for this process and moves a corrupt redb file
    /// aside (`<file>.corrupt-<unix seconds>`), so that the next process
    /// starts a fresh one; a file that is not redb's is left in place.
    fn quarantine(&self, why: &str) {
        self.off.store(true, Ordering::Relaxed);
        let mut magic = [0u8; REDB_MAGIC.len()];
        let ours =
            std::fs::File::open(&self.path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == REDB_MAGIC;
        if !ours {
            warn!(path = %self.path.display(), error = %why, "embedding cache: not a cache file; going on without the disk tier");
            return;
        }
        let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut aside = self.path.clone().into_os_string();
        aside.push(format!(".corrupt-{secs}"));
        let aside = PathBuf::from(aside);
        match std::fs::rename(&self.path, &aside) {
            Ok(()) => warn!(path = %self.path.display(), moved_to = %aside.display(), error = %why,
                "embedding cache: the file is corrupt; moved aside, going on without the disk tier"),
            Err(e) => warn!(path = %self.path.display(), error = %why, rename_error = %e,
                "embedding cache: the file is corrupt and could not be moved aside; going on without the disk tier"),
        }
    }

    /// Creates the file's folders (0700) and the file itself, empty and
    /// 0600, when absent (redb initializes an empty file); an existing
    /// file or folder keeps its mode.
    fn create_private(&self) -> Result<(), Fault> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir).map_err(|e| Fault::Other(format!("{}: {e}", dir.display())))?;
        }
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        match o.open(&self.path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Fault::Other(format!("{}: {e}", self.path.display()))),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bound in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn fail(&self, what: &str, e: String) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(path = %self.path.display(), error = %e, "embedding cache: {what} failed; going on without it");
        } else {
            debug!(path = %self.path.display(), error = %e, "embedding cache: {what} failed");
        }
    }

    /// Opens the file, waiting [`LOCK_WAIT`] at most for another process
    /// that holds it.
    fn open(&self, create: bool) -> Result<Option<Database>, Fault> {
        if !create && !self.path.exists() {
            return Ok(None);
        }
        if create {
            self.create_private()?;
        }
        let start = Instant::now();
        loop {
            match Database::create(&self.path) {
                Ok(db) => return Ok(Some(db)),
                Err(redb::DatabaseError::DatabaseAlreadyOpen) if start.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(store_error(e)),
            }
        }
    }

    /// The stored vectors of `keys` (None where absent, not a finite unit
    /// vector, or when the file cannot be read).
    pub fn get_many(&self, keys: &[Key]) -> Vec<Option<Arc<[f32]>>> {
        let read = || -> Result<Vec<Option<Arc<[f32]>>>, Fault> {
            let Some(db) = self.open(false)? else { return Ok(vec![None; keys.len()]) };
            let tx = db.begin_read().map_err(store_error)?;
            let table = match tx.open_table(VECTORS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![None; keys.len()]),
                Err(e) => return Err(store_error(e)),
            };
            keys.iter()
                .map(|k| {
                    Ok(table.get(k.as_slice()).map_err(store_error)?.and_then(|v| {
                        let bytes = v.value();
                        // a value that is not 8 + 4n bytes is not ours: a miss
                        (bytes.len() >= 8 && (bytes.len() - 8) % 4 == 0)
                            .then(|| -> Arc<[f32]> {
                                bytes[8..]
                                    .chunks_exact(4)
                                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                                    .collect()
                            })
                            .filter(|v| is_unit_vector(v))
                    }))
                })
                .collect()
        };
        self.run("reading", read).unwrap_or_else(|| vec![None; keys.len()])
    }

    /// Stores `entries` (those not stored yet) in one transaction, then
    /// removes the oldest until the bound holds.
    pub fn put_many(&self, entries: &[(Key, Arc<[f32]>)]) {
        if entries.is_empty() {
            return;
        }
        let write = || -> Result<usize, Fault> {
            let Some(db) = self.open(true)? else { return Err(Fault::Other("the file vanished".into())) };
            let mut tx = db.begin_write().map_err(store_error)?;
            tx.set_durability(Durability::Immediate).map_err(store_error)?;
            let mut evicted = 0;
            {
                let mut vectors = Unwinding::new(tx.open_table(VECTORS).map_err(store_error)?);
                let mut order = Unwinding::new(tx.open_table(ORDER).map_err(store_error)?);
                let mut meta = Unwinding::new(tx.open_table(META).map_err(store_error)?);
                let get = |m: &redb::Table<&str, u64>, k: &str| m.get(k).map(|v| v.map_or(0, |v| v.value()));
                let mut next = get(&meta, "next_seq").map_err(store_error)?;
                let mut bytes = get(&meta, "bytes").map_err(store_error)?;
                let mut value = Vec::new();
                for (k, v) in entries {
                    if vectors.get(k.as_slice()).map_err(store_error)?.is_some() {
                        continue;
                    }
                    value.clear();
                    value.extend_from_slice(&next.to_le_bytes());
                    for x in v.iter() {
                        value.extend_from_slice(&x.to_le_bytes());
                    }
                    vectors.insert(k.as_slice(), value.as_slice()).map_err(store_error)?;
                    order.insert(next, k.as_slice()).map_err(store_error)?;
                    bytes += stored_bytes(v.len());
                    next += 1;
                }
                while bytes > self.max_bytes {
                    let Some((_, key)) = order.pop_first().map_err(store_error)? else { break };
                    let key = key.value().to_vec();
                    if let Some(old) = vectors.remove(key.as_slice()).map_err(store_error)? {
                        bytes = bytes.saturating_sub(stored_bytes((old.value().len().saturating_sub(8)) / 4));
                    }
                    evicted += 1;
                }
                meta.insert("next_seq", next).map_err(store_error)?;
                meta.insert("bytes", bytes).map_err(store_error)?;
            }
            tx.commit().map_err(store_error)?;
            Ok(evicted)
        };
        if let Some(evicted) = self.run("writing", write).filter(|&n| n > 0) {
            debug!(evicted, "embedding cache: oldest entries evicted");
        }
    }

    /// Entries and their bytes on disk (0, 0 when the file is absent).
    pub fn stats(&self) -> (u64, u64) {
        let read = || -> Result<(u64, u64), Fault> {
            let Some(db) = self.open(false)? else { return Ok((0, 0)) };
            let tx = db.begin_read().map_err(store_error)?;
            let (Ok(vectors), Ok(meta)) = (tx.open_table(VECTORS), tx.open_table(META)) else { return Ok((0, 0)) };
            let n = redb::ReadableTableMetadata::len(&vectors).map_err(store_error)?;
            let bytes = meta.get("bytes").map_err(store_error)?.map_or(0, |v| v.value());
            Ok((n, bytes))
        };
        self.run("reading", read).unwrap_or((0, 0))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn hits_misses_and_byte_bound() {
        let bound = 10 * (16 + ENTRY_OVERHEAD);
        let c = EmbeddingCache::new(bound);
        let k = EmbeddingCache::key("m", 0, "a  b\nc");
        assert_eq!(k, EmbeddingCache::key("m", 0, "a b c"), "whitespace-normalized");
        assert_ne!(k, EmbeddingCache::key("other", 0, "a b c"));
        assert_ne!(k, EmbeddingCache::key("m", 1, "a b c"), "query and passage differ");
        assert!(c.get(&k).is_none());
        c.put(k, Arc::from(vec![1.0f32; 4]));
        assert_eq!(&*c.get(&k).unwrap(), &[1.0; 4]);
        for i in 0..100 {
            c.put(EmbeddingCache::key("m", 0, &i.to_string()), Arc::from(vec![0.0f32; 4]));
        }
        let s = c.stats();
        assert!(s.bytes <= bound && s.entries <= 10, "{s:?}");
        assert_eq!((s.hits, s.misses), (1, 1));
    }

    /// A unit vector, different for each seed.
    fn vector(seed: usize) -> Arc<[f32]> {
        let mut v: Vec<f32> = (0..8).map(|i| (seed * 8 + i + 1) as f32).collect();
        crate::encoder::l2_normalize(&mut v);
        v.into()
    }

    #[test]
    fn the_disk_tier_keeps_vectors_across_instances_within_its_byte_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/embeddings.redb");
        let keys: Vec<Key> = (0..20).map(|i| EmbeddingCache::key("m", 0, &i.to_string())).collect();
        // a fresh file: nothing, and nothing created by a read
        let a = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 10 * stored_bytes(8))));
        assert!(a.get_many(&keys[..2]).iter().all(Option::is_none));
        assert!(!path.exists());
        a.put_many(&keys[..4].iter().enumerate().map(|(i, k)| (*k, vector(i))).collect::<Vec<_>>());
        // another instance (a new process) reads them back, bit for bit
        let b = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 10 * stored_bytes(8))));
        let got = b.get_many(&keys[..5]);
        for (i, v) in got.iter().enumerate().take(4) {
            assert_eq!(v.as_deref(), Some(&*vector(i)), "entry {i}");
        }
        assert!(got[4].is_none());
        let s = b.stats();
        assert_eq!((s.hits, s.disk_hits, s.misses), (4, 4, 1));
        // then from memory, not the disk again
        b.get_many(&keys[..4]);
        assert_eq!(b.stats().disk_hits, 4);
        // the bound: 10 entries at most, the oldest written go first
        b.put_many(&keys[4..].iter().enumerate().map(|(i, k)| (*k, vector(i + 4))).collect::<Vec<_>>());
        let disk = b.disk().unwrap();
        assert_eq!(disk.stats(), (10, 10 * stored_bytes(8)));
        let c = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 10 * stored_bytes(8))));
        let held = c.get_many(&keys);
        assert!(held[..10].iter().all(Option::is_none) && held[10..].iter().all(Option::is_some), "{held:?}");
    }

    #[test]
    fn a_disk_tier_that_cannot_be_used_is_a_miss_never_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.redb");
        std::fs::write(&junk, b"not a database at all, just bytes").unwrap();
        let key = EmbeddingCache::key("m", 0, "x");
        for path in [junk, dir.path().to_path_buf()] {
            let c = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 1 << 20)));
            c.put_many(&[(key, vector(1))]);
            // memory still serves it; the file is neither read nor replaced
            assert_eq!(c.get_many(&[key])[0].as_deref(), Some(&*vector(1)));
            let fresh = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 1 << 20)));
            assert!(fresh.get_many(&[key])[0].is_none());
        }
        assert_eq!(std::fs::read(dir.path().join("junk.redb")).unwrap(), b"not a database at all, just bytes");
    }

    #[test]
    fn a_vector_read_back_that_is_not_finite_and_unit_length_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.redb");
        let bad: [Arc<[f32]>; 4] =
            [Arc::from(vec![2.0f32; 8]), Arc::from(vec![0.0f32; 8]), Arc::from(vec![f32::NAN; 8]), {
                let mut v = vec![0.0f32; 8];
                v[0] = f32::INFINITY;
                Arc::from(v)
            }];
        let keys: Vec<Key> = (0..5).map(|i| EmbeddingCache::key("m", 0, &i.to_string())).collect();
        let mut entries: Vec<(Key, Arc<[f32]>)> = keys.iter().zip(bad).map(|(k, v)| (*k, v)).collect();
        entries.push((keys[4], vector(4)));
        DiskTier::new(&path, 1 << 20).put_many(&entries);
        let got = DiskTier::new(&path, 1 << 20).get_many(&keys);
        assert!(got[..4].iter().all(Option::is_none), "{got:?}");
        assert_eq!(got[4].as_deref(), Some(&*vector(4)));
        assert!(!is_unit_vector(&[]) && is_unit_vector(&vector(9)));
    }

    /// Flips `n` runs of 16 bytes of `path` at places drawn from `seed`.
    pub(crate) fn flip(path: &Path, seed: u64, n: usize) {
        use rand::{Rng, SeedableRng};
        let mut bytes = std::fs::read(path).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..n {
            let at = rng.random_range(0..bytes.len() - 16);
            for b in &mut bytes[at..at + 16] {
                *b ^= rng.random::<u8>() | 1;
            }
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_corrupted_cache_file_never_panics_and_is_moved_aside() {
        let keys: Vec<Key> = (0..64).map(|i| EmbeddingCache::key("m", 0, &i.to_string())).collect();
        let entries: Vec<(Key, Arc<[f32]>)> = keys.iter().enumerate().map(|(i, k)| (*k, vector(i))).collect();
        let mut moved = 0;
        for seed in 0..24 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("e.redb");
            DiskTier::new(&path, 1 << 20).put_many(&entries);
            let len = std::fs::metadata(&path).unwrap().len();
            // the header and the first pages, where redb's tables and bitmaps are
            flip(&path, seed, 4);
            let c = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 1 << 20)));
            // whatever the flips hit: no panic, and nothing but unit vectors comes back
            for (i, v) in c.get_many(&keys).into_iter().enumerate() {
                assert!(v.is_none_or(|v| is_unit_vector(&v)), "seed {seed}: entry {i}");
            }
            c.put_many(&[(EmbeddingCache::key("m", 0, "new"), vector(99))]);
            assert_eq!(c.get_many(&[EmbeddingCache::key("m", 0, "new")])[0].as_deref(), Some(&*vector(99)));
            let aside: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("e.redb.corrupt-"))
                .collect();
            if !aside.is_empty() {
                moved += 1;
                assert!(!c.disk().unwrap().is_active(), "seed {seed}: the tier is off once the file is moved");
                assert_eq!(std::fs::metadata(dir.path().join(&aside[0])).unwrap().len(), len);
                // the next process starts a fresh file
                let next = DiskTier::new(&path, 1 << 20);
                next.put_many(&entries[..1]);
                assert_eq!(next.get_many(&keys[..1])[0].as_deref(), Some(&*vector(0)));
            }
        }
        assert!(moved > 0, "no seed corrupted the file: the test flips too little");
    }

    #[cfg(unix)]
    #[test]
    fn a_new_cache_file_is_private_and_existing_folders_keep_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("a/b/e.redb");
        DiskTier::new(&path, 1 << 20).put_many(&[(EmbeddingCache::key("m", 0, "x"), vector(1))]);
        assert_eq!(mode(&path), 0o600);
        assert_eq!((mode(&dir.path().join("a")), mode(&dir.path().join("a/b"))), (0o700, 0o700));
        assert_eq!(mode(dir.path()), 0o755, "a folder that was there is not ours to change");
    }

    #[test]
    fn a_file_held_by_another_opener_is_waited_on_briefly_then_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.redb");
        let key = EmbeddingCache::key("m", 0, "x");
        DiskTier::new(&path, 1 << 20).put_many(&[(key, vector(1))]);
        let held = Database::create(&path).unwrap();
        let c = EmbeddingCache::new(1 << 20).with_disk(Some(DiskTier::new(&path, 1 << 20)));
        let start = Instant::now();
        assert!(c.get_many(&[EmbeddingCache::key("m", 0, "y")])[0].is_none());
        assert!(start.elapsed() < Duration::from_millis(1000), "waited {:?}", start.elapsed());
        assert!(!c.disk().unwrap().is_active());
        // backing off: the next calls do not touch the file at all
        let start = Instant::now();
        for _ in 0..20 {
            c.put_many(&[(EmbeddingCache::key("m", 0, "z"), vector(2))]);
            assert!(c.get_many(&[key])[0].is_none());
        }
        assert!(start.elapsed() < Duration::from_millis(200), "took {:?}", start.elapsed());
        drop(held);
        // another process (a fresh tier) uses the file again, which was left as it was
        assert_eq!(DiskTier::new(&path, 1 << 20).get_many(&[key])[0].as_deref(), Some(&*vector(1)));
    }

    #[test]
    fn zero_bytes_disables_the_cache() {
        let c = EmbeddingCache::new(0);
        let k = EmbeddingCache::key("m", 0, "x");
        c.put(k, Arc::from(vec![1.0f32; 4]));
        assert!(c.get(&k).is_none());
        assert_eq!(c.stats().entries, 0);
    }
}
