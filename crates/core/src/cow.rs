//! Copy-on-write maps and sets for the replicated state, so that a snapshot can take the
//! whole state in O(1) and serialize it while entries go on being applied.
//!
//! [`CowMap`] is a persistent B-tree ([`imbl::OrdMap`]) whose values sit behind an `Arc`:
//! cloning the map shares every node; a later change copies only the nodes on the path to
//! the changed key (and the keys and `Arc` pointers in them), and the changed value only if
//! the snapshot still shares it. [`CowSet`] is the same for sets of small values.
//!
//! Both iterate in key order and serialize exactly as `BTreeMap` and `BTreeSet` do, so the
//! snapshot format does not depend on them (`tests/snapshot_format.rs`).

use std::fmt;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An ordered map with O(1) clones; see the module docs.
pub struct CowMap<K, V> {
    map: OrdMap<K, Arc<V>>,
}

impl<K: Ord + Clone, V> Clone for CowMap<K, V> {
    fn clone(&self) -> Self {
        CowMap {
            map: self.map.clone(),
        }
    }
}

impl<K: Ord + Clone, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap { map: OrdMap::new() }
    }
}

impl<K: Ord + Clone, V: Clone> CowMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        Q: Ord + ?Sized,
        K: std::borrow::Borrow<Q>,
    {
        self.map.get(key).map(|v| &**v)
    }

    /// The value under `key`, to change in place (copied first if a snapshot shares it).
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        Q: Ord + ?Sized,
        K: std::borrow::Borrow<Q>,
    {
        self.map.get_mut(key).map(Arc::make_mut)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        Q: Ord + ?Sized,
        K: std::borrow::Borrow<Q>,
    {
        self.map.contains_key(key)
    }

    /// The value under `key`, to change in place; `default()` inserted first if absent.
    pub fn get_or_insert_with(&mut self, key: K, default: impl FnOnce() -> V) -> &mut V {
        Arc::make_mut(self.map.entry(key).or_insert_with(|| Arc::new(default())))
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.map
            .insert(key, Arc::new(value))
            .map(Arc::unwrap_or_clone)
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        Q: Ord + ?Sized,
        K: std::borrow::Borrow<Q>,
    {
        self.map.remove(key).map(Arc::unwrap_or_clone)
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + '_ {
        self.map.iter().map(|(k, v)| (k, &**v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.map.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + '_ {
        self.map.values().map(|v| &**v)
    }

    /// Entries with keys in `range`, in key order.
    pub fn range<R, Q>(&self, range: R) -> impl DoubleEndedIterator<Item = (&K, &V)> + '_
    where
        R: std::ops::RangeBounds<Q>,
        Q: Ord + ?Sized,
        K: std::borrow::Borrow<Q>,
    {
        self.map.range(range).map(|(k, v)| (k, &**v))
    }

    /// The entry with the smallest key.
    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.map.get_min().map(|(k, v)| (k, &**v))
    }
}

impl<'a, K: Ord + Clone, V: Clone> IntoIterator for &'a CowMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a K, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<Q, K, V> std::ops::Index<&Q> for CowMap<K, V>
where
    Q: Ord + ?Sized,
    K: Ord + Clone + std::borrow::Borrow<Q>,
    V: Clone,
{
    type Output = V;

    /// Panics if `key` is absent, like `BTreeMap`'s index.
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(v) => v,
            None => panic!("no entry for the key"),
        }
    }
}

impl<K: Ord + Clone + PartialEq, V: PartialEq> PartialEq for CowMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.map.len() == other.map.len()
            && self
                .map
                .iter()
                .zip(other.map.iter())
                .all(|((k1, v1), (k2, v2))| k1 == k2 && **v1 == **v2)
    }
}

impl<K: Ord + Clone + Eq, V: Eq> Eq for CowMap<K, V> {}

impl<K: Ord + Clone + fmt::Debug, V: fmt::Debug> fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.map.iter().map(|(k, v)| (k, &**v)))
            .finish()
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for CowMap<K, V> {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        CowMap {
            map: iter.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
        }
    }
}

impl<K: Ord + Clone + Serialize, V: Serialize> Serialize for CowMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(ExactIter {
            len: self.map.len(),
            inner: self.map.iter().map(|(k, v)| (k, &**v)),
        })
    }
}

impl<'de, K, V> Deserialize<'de> for CowMap<K, V>
where
    K: Ord + Clone + Deserialize<'de>,
    V: Clone + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<K, V>(std::marker::PhantomData<(K, V)>);
        impl<'de, K, V> serde::de::Visitor<'de> for Visit<K, V>
        where
            K: Ord + Clone + Deserialize<'de>,
            V: Clone + Deserialize<'de>,
        {
            type Value = CowMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = OrdMap::new();
                while let Some((k, v)) = a.next_entry::<K, V>()? {
                    map.insert(k, Arc::new(v));
                }
                Ok(CowMap { map })
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// An ordered set with O(1) clones; see the module docs.
pub struct CowSet<T> {
    set: OrdSet<T>,
}

impl<T: Ord + Clone> Clone for CowSet<T> {
    fn clone(&self) -> Self {
        CowSet {
            set: self.set.clone(),
        }
    }
}

impl<T: Ord + Clone> Default for CowSet<T> {
    fn default() -> Self {
        CowSet { set: OrdSet::new() }
    }
}

impl<T: Ord + Clone> CowSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether `value` was new.
    pub fn insert(&mut self, value: T) -> bool {
        self.set.insert(value).is_none()
    }

    /// Whether `value` was there.
    pub fn remove<Q>(&mut self, value: &Q) -> bool
    where
        Q: Ord + ?Sized,
        T: std::borrow::Borrow<Q>,
    {
        self.set.remove(value).is_some()
    }

    pub fn contains<Q>(&self, value: &Q) -> bool
    where
        Q: Ord + ?Sized,
        T: std::borrow::Borrow<Q>,
    {
        self.set.contains(value)
    }

    pub fn first(&self) -> Option<&T> {
        self.set.get_min()
    }

    pub fn clear(&mut self) {
        self.set.clear();
    }

    /// Values in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.set.iter()
    }

    /// Values in `range`, in order.
    pub fn range<R, Q>(&self, range: R) -> impl DoubleEndedIterator<Item = &T> + '_
    where
        R: std::ops::RangeBounds<Q>,
        Q: Ord + ?Sized,
        T: std::borrow::Borrow<Q>,
    {
        self.set.range(range)
    }
}

impl<T: Ord + Clone> PartialEq for CowSet<T> {
    fn eq(&self, other: &Self) -> bool {
        self.set.len() == other.set.len() && self.set.iter().eq(other.set.iter())
    }
}

impl<T: Ord + Clone> Eq for CowSet<T> {}

impl<T: Ord + Clone + fmt::Debug> fmt::Debug for CowSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.set.iter()).finish()
    }
}

impl<T: Ord + Clone> FromIterator<T> for CowSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        CowSet {
            set: iter.into_iter().collect(),
        }
    }
}

impl<T: Ord + Clone + Serialize> Serialize for CowSet<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(ExactIter {
            len: self.set.len(),
            inner: self.set.iter(),
        })
    }
}

impl<'de, T: Ord + Clone + Deserialize<'de>> Deserialize<'de> for CowSet<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Ord + Clone + Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = CowSet<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut set = OrdSet::new();
                while let Some(v) = a.next_element::<T>()? {
                    set.insert(v);
                }
                Ok(CowSet { set })
            }
        }
        deserializer.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// An iterator with a known length (serializers need the length of a map or sequence first).
struct ExactIter<I> {
    len: usize,
    inner: I,
}

impl<I: Iterator> Iterator for ExactIter<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let item = self.inner.next()?;
        self.len -= 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    proptest! {
        /// Any sequence of changes, with snapshots (clones) taken along the way, gives what a
        /// BTreeMap/BTreeSet gives, and every snapshot keeps the state it was taken at and
        /// encodes to the same bytes as a BTreeMap of that state.
        #[test]
        fn behaves_like_std_and_snapshots_stay_put(
            ops in proptest::collection::vec((0u8..3, 0u16..300, any::<u32>()), 0..400)
        ) {
            let mut map: CowMap<u16, Vec<u32>> = CowMap::new();
            let mut set: CowSet<(u16, u32)> = CowSet::new();
            let mut model: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
            let mut model_set: BTreeSet<(u16, u32)> = BTreeSet::new();
            let mut snapshots = Vec::new();
            for (i, (op, k, v)) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        prop_assert_eq!(map.insert(k, vec![v]), model.insert(k, vec![v]));
                        prop_assert_eq!(set.insert((k, v)), model_set.insert((k, v)));
                    }
                    1 => {
                        if let Some(x) = map.get_mut(&k) {
                            x.push(v);
                        }
                        if let Some(x) = model.get_mut(&k) {
                            x.push(v);
                        }
                    }
                    _ => {
                        prop_assert_eq!(map.remove(&k), model.remove(&k));
                        let first = model_set.first().copied();
                        if let Some(f) = first {
                            prop_assert!(set.remove(&f) && model_set.remove(&f));
                        }
                    }
                }
                if i % 37 == 0 {
                    snapshots.push((map.clone(), set.clone(), model.clone(), model_set.clone()));
                }
                prop_assert!(map.iter().eq(model.iter()));
                prop_assert!(set.iter().eq(model_set.iter()));
                prop_assert_eq!(map.first_key_value(), model.first_key_value());
            }
            for (m, s, want, want_set) in snapshots {
                prop_assert!(m.iter().eq(want.iter()), "a snapshot changed after it was taken");
                let bytes = bincode::serialize(&m).expect("encode");
                prop_assert_eq!(&bytes, &bincode::serialize(&want).expect("encode"));
                let back: CowMap<u16, Vec<u32>> = bincode::deserialize(&bytes).expect("decode");
                prop_assert_eq!(back, m);
                let bytes = bincode::serialize(&s).expect("encode");
                prop_assert_eq!(&bytes, &bincode::serialize(&want_set).expect("encode"));
            }
        }
    }
}
