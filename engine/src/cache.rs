//! Content-addressed embedding cache: (model id, normalized text) → vector,
//! bounded in bytes, least recently used evicted first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

type Key = [u8; 32];

struct Entry {
    vector: Arc<[f32]>,
    last_used: u64,
}

struct Inner {
    map: HashMap<Key, Entry>,
    bytes: usize,
    tick: u64,
}

/// Hit/miss counters and size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to embed.
    pub misses: u64,
    /// Vectors held.
    pub entries: usize,
    /// Bytes held (vectors + keys).
    pub bytes: usize,
}

/// A thread-safe, byte-bounded embedding cache.
pub struct EmbeddingCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for EmbeddingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingCache").field("stats", &self.stats()).finish()
    }
}

const ENTRY_OVERHEAD: usize = 32 + 48;

impl EmbeddingCache {
    /// A cache holding at most `max_bytes` (0 disables caching).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner { map: HashMap::new(), bytes: 0, tick: 0 }),
            max_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
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
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tick += 1;
        let tick = inner.tick;
        match inner.map.get_mut(key) {
            Some(e) => {
                e.last_used = tick;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(e.vector.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores a vector, evicting the least recently used past the bound.
    pub fn put(&self, key: Key, vector: Arc<[f32]>) {
        let size = vector.len() * 4 + ENTRY_OVERHEAD;
        if size > self.max_bytes {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(old) = inner.map.insert(key, Entry { vector, last_used: tick }) {
            inner.bytes -= old.vector.len() * 4 + ENTRY_OVERHEAD;
        }
        inner.bytes += size;
        if inner.bytes > self.max_bytes {
            // evict the oldest quarter of the entries beyond the bound in one pass
            let mut ages: Vec<(u64, Key)> = inner.map.iter().map(|(k, e)| (e.last_used, *k)).collect();
            ages.sort_unstable();
            let target = self.max_bytes - self.max_bytes / 4;
            for (_, k) in ages {
                if inner.bytes <= target {
                    break;
                }
                if let Some(e) = inner.map.remove(&k) {
                    inner.bytes -= e.vector.len() * 4 + ENTRY_OVERHEAD;
                }
            }
        }
    }

    /// Counts `n` lookups answered by a higher-level cache (a prepared
    /// context reused whole) as hits.
    pub fn record_hits(&self, n: usize) {
        self.hits.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counters and size.
    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: inner.map.len(),
            bytes: inner.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_misses_and_byte_bound() {
        let c = EmbeddingCache::new(10 * (16 + ENTRY_OVERHEAD));
        let k = EmbeddingCache::key("m", 0, "a  b\nc");
        assert_eq!(k, EmbeddingCache::key("m", 0, "a b c"), "whitespace-normalized");
        assert_ne!(k, EmbeddingCache::key("other", 0, "a b c"));
        assert!(c.get(&k).is_none());
        c.put(k, Arc::from(vec![1.0f32; 4]));
        assert_eq!(&*c.get(&k).unwrap(), &[1.0; 4]);
        for i in 0..100 {
            c.put(EmbeddingCache::key("m", 0, &i.to_string()), Arc::from(vec![0.0f32; 4]));
        }
        let s = c.stats();
        assert!(s.bytes <= 10 * (16 + ENTRY_OVERHEAD), "{s:?}");
        assert_eq!((s.hits, s.misses), (1, 1));
    }
}
