//! Content-addressed embedding cache: (model id, input kind, normalized
//! text) → vector, bounded in bytes. A `moka` cache (TinyLFU admission,
//! weighed by bytes) rather than a hand-written LRU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use moka::sync::Cache;
use sha2::{Digest, Sha256};

type Key = [u8; 32];

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
    cache: Option<Cache<Key, Arc<[f32]>>>,
    hits: AtomicU64,
    misses: AtomicU64,
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
        Self { cache, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
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
            entries,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn zero_bytes_disables_the_cache() {
        let c = EmbeddingCache::new(0);
        let k = EmbeddingCache::key("m", 0, "x");
        c.put(k, Arc::from(vec![1.0f32; 4]));
        assert!(c.get(&k).is_none());
        assert_eq!(c.stats().entries, 0);
    }
}
