//! The replicated keyspace's data: keys with their values, revisions and expiries, fence
//! high-water marks and the script cache, with the primitive operations the commands use.
//! Nothing here parses a command.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::error::{FenceError, KvError, KvResult, Stale};
use super::limit::Limiter;
use super::script::LuaCache;
use super::types::{Bytes, MAX_VALUE_LEN};
use crate::cow::{CowMap, CowSet};
use crate::{Millis, Revision, Token};

/// A sorted-set score: a non-NaN double with a total order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // -0.0 and 0.0 compare equal in Redis; normalise so total_cmp agrees.
        let a = if self.0 == 0.0 { 0.0 } else { self.0 };
        let b = if other.0 == 0.0 { 0.0 } else { other.0 };
        a.total_cmp(&b)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ZSet {
    pub(crate) by_member: BTreeMap<Bytes, Score>,
    pub(crate) by_score: BTreeSet<(Score, Bytes)>,
}

impl ZSet {
    pub(crate) fn insert(&mut self, member: Bytes, score: Score) {
        if let Some(old) = self.by_member.insert(member.clone(), score) {
            self.by_score.remove(&(old, member.clone()));
        }
        self.by_score.insert((score, member));
    }
    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.by_member.remove(member) {
            Some(old) => {
                self.by_score.remove(&(old, member.to_vec()));
                true
            }
            None => false,
        }
    }
    pub fn len(&self) -> usize {
        self.by_member.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_member.is_empty()
    }
}

/// The value of a key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(Bytes),
    Hash(BTreeMap<Bytes, Bytes>),
    List(VecDeque<Bytes>),
    ZSet(ZSet),
    /// A rate limiter's state (`CL.THROTTLE`, `LIMIT.*`). Appended last, so snapshots written
    /// before it existed still decode.
    Limiter(Limiter),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Hash(_) => "hash",
            Value::List(_) => "list",
            Value::ZSet(_) => "zset",
            Value::Limiter(_) => "ratelimit",
        }
    }
    pub(super) fn is_empty_container(&self) -> bool {
        match self {
            Value::Str(_) => false,
            Value::Hash(h) => h.is_empty(),
            Value::List(l) => l.is_empty(),
            Value::ZSet(z) => z.is_empty(),
            Value::Limiter(_) => false,
        }
    }
}

/// A key's value and metadata.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub value: Value,
    /// Revision of the command that created the key (its token when taken with `SET NX`).
    pub create_revision: Revision,
    /// Revision of the command that last modified it.
    pub mod_revision: Revision,
    /// Absolute expiry in log time; the key is gone from this time on.
    pub expire_at: Option<Millis>,
}

/// The replicated keyspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyspace {
    // Copy-on-write tables: a snapshot clones the keyspace in O(1) (see `crate::cow`).
    pub(super) keys: CowMap<Bytes, Entry>,
    /// `(expire_at, key)` for every key with an expiry.
    pub(super) expiries: CowSet<(Millis, Bytes)>,
    /// Highest token accepted by `FENCE.SET` per key. Kept when the key is deleted or
    /// flushed, so a stale writer stays fenced off.
    pub(super) fences: CowMap<Bytes, Token>,
    /// Script cache: lower-case hex SHA1 → source.
    pub(super) scripts: CowMap<String, String>,
    /// Compiled scripts, each in its interpreter: this replica's, not replicated (skipped by
    /// serde, empty in a clone, ignored by `==`).
    #[serde(skip)]
    pub(super) lua: LuaCache,
}

impl Keyspace {
    /// Remove keys whose expiry is at or before `now`.
    pub fn expire_due(&mut self, now: Millis) {
        while let Some((t, key)) = self.expiries.first().cloned() {
            if t > now {
                break;
            }
            self.expiries.remove(&(t, key.clone()));
            if self.keys.get(&key).and_then(|e| e.expire_at) == Some(t) {
                self.keys.remove(&key);
            }
        }
    }

    /// The earliest key expiry, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.expiries.first().map(|(t, _)| *t)
    }

    /// The live entry of `key` at log time `now`.
    pub fn get(&self, key: &[u8], now: Millis) -> Option<&Entry> {
        self.keys
            .get(key)
            .filter(|e| !matches!(e.expire_at, Some(t) if t <= now))
    }

    /// `mod_revision` of `key` at `now`, 0 if absent (what `WATCH` records).
    pub fn mod_revision(&self, key: &[u8], now: Millis) -> Revision {
        self.get(key, now).map_or(0, |e| e.mod_revision)
    }

    /// The fence high-water mark of `key` (0 if no `FENCE.SET` ever wrote it).
    pub fn fence(&self, key: &[u8]) -> Token {
        self.fences.get(key).copied().unwrap_or(0)
    }

    /// Number of live keys at `now`.
    pub fn len(&self, now: Millis) -> usize {
        let expired = self.expiries.iter().take_while(|(t, _)| *t <= now).count();
        self.keys.len() - expired.min(self.keys.len())
    }

    /// Number of live keys at `now` that have an expiry (`INFO keyspace`'s `expires=`).
    pub fn expires(&self, now: Millis) -> usize {
        let expired = self.expiries.iter().take_while(|(t, _)| *t <= now).count();
        self.expiries.len() - expired.min(self.expiries.len())
    }

    pub fn is_empty(&self, now: Millis) -> bool {
        self.len(now) == 0
    }

    pub fn has_script(&self, sha: &str) -> bool {
        self.scripts.contains_key(&sha.to_ascii_lowercase())
    }

    /// `FENCE.SET`: store `value` under `key` at `revision` if `token` is at least the key's
    /// fence mark, and raise the mark to `token`. A stale token changes nothing.
    pub fn fence_set(
        &mut self,
        revision: Revision,
        key: &[u8],
        value: &[u8],
        token: Token,
    ) -> Result<(), FenceError> {
        let highest = self.fence(key);
        if token < highest {
            return Err(Stale { token, highest }.into());
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(FenceError::TooLarge);
        }
        self.fences.insert(key.to_vec(), token);
        self.put(revision, key, Value::Str(value.to_vec()), None, false);
        Ok(())
    }

    // ---- mutation helpers used by the commands ------------------------------------------

    /// Mutable live entry (during apply every expired key was already removed).
    pub(super) fn entry_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.keys.get_mut(key)
    }

    /// Store `value` under `key` at `revision`: keeps `create_revision` if the key exists,
    /// replaces the expiry with `expire_at` unless `keep_ttl`.
    pub(super) fn put(
        &mut self,
        revision: Revision,
        key: &[u8],
        value: Value,
        expire_at: Option<Millis>,
        keep_ttl: bool,
    ) {
        let (create, old_exp) = match self.keys.get(key) {
            Some(e) => (e.create_revision, e.expire_at),
            None => (revision, None),
        };
        let exp = if keep_ttl { old_exp } else { expire_at };
        if old_exp != exp {
            if let Some(t) = old_exp {
                self.expiries.remove(&(t, key.to_vec()));
            }
            if let Some(t) = exp {
                self.expiries.insert((t, key.to_vec()));
            }
        }
        self.keys.insert(
            key.to_vec(),
            Entry {
                value,
                create_revision: create,
                mod_revision: revision,
                expire_at: exp,
            },
        );
    }

    pub(super) fn set_expiry(
        &mut self,
        key: &[u8],
        revision: Revision,
        expire_at: Option<Millis>,
    ) -> bool {
        let Some(e) = self.keys.get_mut(key) else {
            return false;
        };
        if let Some(t) = e.expire_at {
            self.expiries.remove(&(t, key.to_vec()));
        }
        if let Some(t) = expire_at {
            self.expiries.insert((t, key.to_vec()));
        }
        e.expire_at = expire_at;
        e.mod_revision = revision;
        true
    }

    pub(super) fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let e = self.keys.remove(key)?;
        if let Some(t) = e.expire_at {
            self.expiries.remove(&(t, key.to_vec()));
        }
        Some(e)
    }

    /// After a container was modified: bump its revision (if `Some`), drop it if it is
    /// empty.
    pub(super) fn touched(&mut self, key: &[u8], revision: Option<Revision>) {
        let empty = match self.keys.get_mut(key) {
            Some(e) => {
                if let Some(r) = revision {
                    e.mod_revision = r;
                }
                e.value.is_empty_container()
            }
            None => return,
        };
        if empty {
            self.remove(key);
        }
    }

    pub(super) fn flush(&mut self) {
        self.keys.clear();
        self.expiries.clear();
    }
}

/// A data type a key can hold, for commands that work on one: its empty container and a view
/// of a [`Value`] as it.
pub(crate) trait Kind: Sized {
    /// A new, empty value of this type (what a write to an absent key starts from).
    fn empty() -> Value;
    fn of(v: &Value) -> Option<&Self>;
    fn of_mut(v: &mut Value) -> Option<&mut Self>;
}

/// A hash's fields.
pub(crate) type Hash = BTreeMap<Bytes, Bytes>;
/// A list's elements.
pub(crate) type List = VecDeque<Bytes>;

macro_rules! kind {
    ($ty:ty, $variant:ident, $empty:expr) => {
        impl Kind for $ty {
            fn empty() -> Value {
                Value::$variant($empty)
            }
            fn of(v: &Value) -> Option<&Self> {
                match v {
                    Value::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn of_mut(v: &mut Value) -> Option<&mut Self> {
                match v {
                    Value::$variant(x) => Some(x),
                    _ => None,
                }
            }
        }
    };
}

kind!(Bytes, Str, Vec::new());
kind!(Hash, Hash, BTreeMap::new());
kind!(List, List, VecDeque::new());
kind!(ZSet, ZSet, ZSet::default());

impl Entry {
    /// The value as type `K`, or `WRONGTYPE`.
    pub(crate) fn as_kind<K: Kind>(&self) -> KvResult<&K> {
        K::of(&self.value).ok_or(KvError::WrongType)
    }
}

impl Keyspace {
    /// The live value of `key` at `now` as type `K`: `None` if absent, `WRONGTYPE` if it holds
    /// another type.
    pub(crate) fn get_as<K: Kind>(&self, key: &[u8], now: Millis) -> KvResult<Option<&K>> {
        self.get(key, now).map(Entry::as_kind).transpose()
    }
}
