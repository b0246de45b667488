//! The context one command runs in inside `apply`, and the helpers write commands share.

use super::error::{KvError, KvResult};
use super::store::{Keyspace, Kind};
use super::types::{Bytes, KvEvent, Reply, Restriction};
use crate::{Millis, Revision, Semantics};

/// Runs one command in a context: the command table's dispatcher (`cmd::exec`), passed in so
/// that commands which run other commands (`EVAL`) need not know the table.
pub(crate) type Dispatch = fn(&mut Ctx<'_>, &[Bytes]) -> Reply;

/// The context of one command inside `apply`.
pub(crate) struct Ctx<'a> {
    pub ks: &'a mut Keyspace,
    /// Revision of the command being run (keys it writes get it as `mod_revision`).
    pub revision: Revision,
    pub now: Millis,
    pub events: &'a mut Vec<KvEvent>,
    /// Inside a Lua script: scripting, blocking and connection commands are refused.
    pub in_script: bool,
    /// ACL restrictions of the entry ([`super::KvCommand::Restricted`], nested ones all
    /// apply): checked before every command, `redis.call` inside scripts included.
    pub limits: Vec<&'a Restriction>,
    pub dispatch: Dispatch,
    /// The entry's apply rules: with [`Semantics::deterministic`], a script sees nothing
    /// replica-dependent.
    pub semantics: Semantics,
}

impl Ctx<'_> {
    /// Run one command; errors become error replies.
    pub fn exec(&mut self, argv: &[Bytes]) -> Reply {
        (self.dispatch)(self, argv)
    }

    /// Run `f` on the value of `key` as type `K`: `WRONGTYPE` before touching anything if the
    /// key holds another type (so a failed command changes no revision); `None` without
    /// calling `f` if the key is absent and not `create`d. Afterwards the key takes this
    /// command's revision — unless `f` failed, which must then have changed nothing — and is
    /// removed if it is empty (a container made for `f` that failed is not left behind).
    pub fn with<K: Kind, T>(
        &mut self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&mut K) -> KvResult<T>,
    ) -> KvResult<Option<T>> {
        self.type_check::<K>(key)?;
        if self.ks.entry_mut(key).is_none() {
            if !create {
                return Ok(None);
            }
            self.ks.put(self.revision, key, K::empty(), None, false);
        }
        let Some(e) = self.ks.entry_mut(key) else {
            return Ok(None);
        };
        let r = K::of_mut(&mut e.value)
            .ok_or(KvError::WrongType)
            .and_then(f);
        self.ks.touched(key, r.is_ok().then_some(self.revision));
        r.map(Some)
    }

    /// `WRONGTYPE` if `key` holds a value that is not a `K`.
    pub fn type_check<K: Kind>(&self, key: &[u8]) -> KvResult<()> {
        self.ks.get_as::<K>(key, self.now).map(|_| ())
    }
}
