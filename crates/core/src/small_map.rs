//! [`SmallMap`]: an ordered map for the holders of one lock — almost always one entry, up to
//! [`crate::limits::MAX_HOLDERS_PER_LOCK`] for readers and permits.
//!
//! A `BTreeMap` allocates a whole node (room for 11 entries, ~1 KB here) for its first entry,
//! which made one held lock cost ~2 KB of memory. A sorted vector costs one allocation of the
//! entries themselves; past [`SPILL`] entries (where inserting into a vector gets slow) the map
//! moves into a `BTreeMap`. Both iterate in key order, and both serialize as a map, exactly as
//! `BTreeMap` does, so snapshots read the same either way.

use std::collections::{btree_map, BTreeMap};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Entries kept in the sorted vector before it spills into a `BTreeMap`.
pub const SPILL: usize = 16;

#[derive(Clone)]
pub enum SmallMap<K, V> {
    Few(Vec<(K, V)>),
    Many(BTreeMap<K, V>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap::Few(Vec::new())
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        match self {
            SmallMap::Few(v) => v.len(),
            SmallMap::Many(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        match self {
            SmallMap::Few(v) => v
                .binary_search_by(|(k, _)| k.cmp(key))
                .ok()
                .map(|i| &v[i].1),
            SmallMap::Many(m) => m.get(key),
        }
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match self {
            SmallMap::Few(v) => match v.binary_search_by(|(k, _)| k.cmp(key)) {
                Ok(i) => Some(&mut v[i].1),
                Err(_) => None,
            },
            SmallMap::Many(m) => m.get_mut(key),
        }
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Insert `value` under `key`; the previous value, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self {
            SmallMap::Few(v) => match v.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => Some(std::mem::replace(&mut v[i].1, value)),
                Err(i) if v.len() < SPILL => {
                    v.insert(i, (key, value));
                    None
                }
                Err(_) => {
                    let mut m: BTreeMap<K, V> = std::mem::take(v).into_iter().collect();
                    m.insert(key, value);
                    *self = SmallMap::Many(m);
                    None
                }
            },
            SmallMap::Many(m) => m.insert(key, value),
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        match self {
            SmallMap::Few(v) => match v.binary_search_by(|(k, _)| k.cmp(key)) {
                Ok(i) => Some(v.remove(i).1),
                Err(_) => None,
            },
            SmallMap::Many(m) => m.remove(key),
        }
    }

    /// Entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        match self {
            SmallMap::Few(v) => Iter::Few(v.iter()),
            SmallMap::Many(m) => Iter::Many(m.iter()),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

/// Iterator of a [`SmallMap`], in key order.
pub enum Iter<'a, K, V> {
    Few(std::slice::Iter<'a, (K, V)>),
    Many(btree_map::Iter<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(i) => i.next().map(|(k, v)| (k, v)),
            Iter::Many(i) => i.next(),
        }
    }

    /// Exact (serializers need the length of a map up front).
    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Few(i) => i.size_hint(),
            Iter::Many(i) => i.size_hint(),
        }
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<'a, K: Ord, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        let m: BTreeMap<K, V> = iter.into_iter().collect();
        if m.len() <= SPILL {
            SmallMap::Few(m.into_iter().collect())
        } else {
            SmallMap::Many(m)
        }
    }
}

impl<K: Ord + PartialEq, V: PartialEq> PartialEq for SmallMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Ord + Eq, V: Eq> Eq for SmallMap<K, V> {}

impl<K: Ord + fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for SmallMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<K, V>::deserialize(deserializer).map(|m| m.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of inserts and removes gives what a BTreeMap gives, in the same order,
        /// and the same bytes when serialized.
        #[test]
        fn behaves_like_a_btreemap(ops in proptest::collection::vec((any::<bool>(), 0u8..40, any::<u16>()), 0..200)) {
            let mut small = SmallMap::new();
            let mut model = BTreeMap::new();
            for (insert, k, v) in ops {
                if insert {
                    prop_assert_eq!(small.insert(k, v), model.insert(k, v));
                } else {
                    prop_assert_eq!(small.remove(&k), model.remove(&k));
                }
                prop_assert_eq!(small.len(), model.len());
                prop_assert_eq!(small.get(&k), model.get(&k));
                prop_assert!(small.iter().eq(model.iter()));
            }
            let bytes = bincode::serialize(&small).expect("encode");
            prop_assert_eq!(&bytes, &bincode::serialize(&model).expect("encode"));
            let back: SmallMap<u8, u16> = bincode::deserialize(&bytes).expect("decode");
            prop_assert_eq!(back, small);
        }
    }
}
