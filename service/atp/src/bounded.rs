//! Maps of bounded size: what a peer makes an agent or a requester keep
//! never grows past a limit, whoever sends it.

use std::collections::HashMap;

/// Inserts into a map of at most `limit` entries: a new key at the limit
/// takes the place of the oldest entry by `age` (a key already there is
/// replaced in place).
pub(crate) fn bounded_insert<K: std::hash::Hash + Eq + Clone, V, A: Ord>(
    map: &mut HashMap<K, V>,
    limit: usize,
    key: K,
    value: V,
    age: impl Fn(&V) -> A,
) {
    if map.len() >= limit && !map.contains_key(&key) {
        if let Some(oldest) = map.iter().min_by_key(|(_, v)| age(v)).map(|(k, _)| k.clone()) {
            map.remove(&oldest);
        }
    }
    map.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_gives_way_and_a_present_key_evicts_nothing() {
        let mut m = HashMap::new();
        for (k, age) in [("a", 3), ("b", 1), ("c", 2)] {
            bounded_insert(&mut m, 3, k, age, |v| *v);
        }
        bounded_insert(&mut m, 3, "c", 9, |v| *v);
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("b"), Some(&1), "replacing c in place evicted b");
        bounded_insert(&mut m, 3, "d", 4, |v| *v);
        assert_eq!(m.len(), 3);
        assert!(!m.contains_key("b"), "b was the oldest and should have given way");
        assert_eq!(m.get("c"), Some(&9));
    }
}
