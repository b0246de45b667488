//! etcd's `Lock` and `Election` services on the lock table ([`Command::EtcdLock`],
//! [`Command::EtcdUnlock`], under [`Semantics::ELECTIONS`]).
//!
//! An etcd lock *is* a lock of the lock table: exclusive, named as etcd names it, held by
//! the owner `<lease id in lowercase hex>` within the session that is the lease, waiting in
//! the lock's FIFO queue for as long as the lease lives. What etcd adds is a key: a grant
//! puts `name/<lease id in hex>` (the key etcd's `Lock` answers, and `Campaign`'s leader
//! key) into the etcd keyspace at the grant's revision, attached to the lease, so its
//! `create_revision` is the grant's fencing token — the token `LOCK.ACQUIRE name` would give
//! for the same lock. Every end of the grant (unlock, resign, force-unlock, the lease's end)
//! deletes the key at the revision of the command that ended it, and a hand-over puts the
//! next holder's key at that same revision: a prefix watcher sees the delete and the put of
//! one revision, in that order. Waiters put nothing, so the only key a lock projects is its
//! holder's (etcd's recipe keeps every waiter's key under the prefix; here tokens stay grant
//! revisions).
//!
//! Which grants and waits project keys is this module's [`EtcdLocks`], encoded after the
//! etcd quota in snapshot bodies of version 4 (`body`). A plain etcd write to a projected
//! key changes the key only: the lock table is the lock.

use serde::{Deserialize, Serialize};

use super::locks::{check_name, Lock, LockKind};
use super::StateMachine;
use crate::command::*;
use crate::cow::CowMap;
use crate::etcd::Bytes;
use crate::limits::*;
use crate::CoreError;

/// The grants and waits of etcd's `Lock`/`Campaign` calls: what the lock table projects into
/// the etcd keyspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct EtcdLocks {
    /// Queued `EtcdLock`s: the value each one's key will hold once granted.
    pub(super) waiting: CowMap<RequestId, Bytes>,
    /// Grants whose key is in the keyspace: (lock name, lease) → the request that has the
    /// grant now (the one that got it, or the last that got it again) — the only one whose
    /// cancel ends it.
    pub(super) held: CowMap<(String, SessionId), Option<RequestId>>,
}

impl EtcdLocks {
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.held.is_empty()
    }
}

/// The owner of an etcd lock's grant: the lease id in lowercase hex (as in its key).
pub fn lease_owner(lease: SessionId) -> String {
    format!("{lease:x}")
}

/// The etcd key a grant of lock `name` to `lease` puts: `name/<lease id in lowercase hex>`,
/// etcd's `Lock` and `Campaign` key.
pub fn lock_key(name: &str, lease: SessionId) -> Bytes {
    format!("{name}/{lease:x}").into_bytes()
}

impl StateMachine {
    /// [`Command::EtcdLock`] at `revision`.
    pub(super) fn etcd_lock(
        &mut self,
        revision: Revision,
        rid: Option<RequestId>,
        name: &str,
        lease: SessionId,
        value: &[u8],
        events: &mut Vec<Event>,
    ) -> Result<Response, CoreError> {
        check_name(name)?;
        if !self.sessions.contains_key(&lease) {
            return Err(CoreError::NoSuchSession(lease));
        }
        let owner = lease_owner(lease);
        if let Some(lock) = self.locks.get(name) {
            if lock.kind != LockKind::Exclusive {
                return Err(CoreError::WrongKind {
                    name: name.to_owned(),
                    existing: lock.kind.describe(),
                    requested: LockKind::Exclusive.describe(),
                });
            }
            // Held by this lease already: its grant again (etcd's Lock finds its own key), now
            // this request's — a cancel of the earlier one (its client gone, this one its
            // retry) no longer ends it.
            if let Some(h) = lock.holders.get(&(owner.clone(), Some(lease))) {
                let granted = Response::Granted {
                    token: h.token,
                    holds: h.holds,
                    deadline_ms: None,
                };
                if let Some(by) = self.etcd_locks.held.get_mut(&(name.to_owned(), lease)) {
                    *by = rid;
                }
                return Ok(granted);
            }
            // Waiting already (a retried or repeated call): this request takes its place.
            if let Some(earlier) = self.queued_etcd_wait(lock, &owner, lease) {
                let Some(request) = rid else {
                    return Err(CoreError::WaitNeedsRequestId);
                };
                if earlier != request {
                    self.move_wait(earlier, request, name, value, events);
                }
                return Ok(Response::Pending);
            }
        }
        let spec = AcquireSpec {
            names: vec![name.to_owned()],
            owner,
            mode: Mode::Exclusive,
            ttl_ms: 0,
            session: Some(lease),
            wait_ms: MAX_WAIT_MS,
            lock_delay_ms: 0,
        };
        let response = self.acquire_valid(revision, rid, &spec, None)?;
        match (&response, rid) {
            (Response::Granted { .. }, _) => self.project_grant(name, lease, value, rid, events),
            (Response::Pending, Some(request)) => {
                self.etcd_locks.waiting.insert(request, value.to_vec());
            }
            _ => {}
        }
        Ok(response)
    }

    /// The etcd lock wait of `lease` (its owner `owner`) in `lock`'s queue, if any.
    fn queued_etcd_wait(&self, lock: &Lock, owner: &str, lease: SessionId) -> Option<RequestId> {
        lock.queue.iter().copied().find(|r| {
            self.etcd_locks.waiting.contains_key(r)
                && self
                    .waiters
                    .get(r)
                    .is_some_and(|w| w.owner == owner && w.session == Some(lease))
        })
    }

    /// Give the queued etcd lock wait `from` to request `to`: same place in every queue,
    /// `value` its key's value; `from` gives up (resolved `NotGranted`).
    fn move_wait(
        &mut self,
        from: RequestId,
        to: RequestId,
        name: &str,
        value: &[u8],
        events: &mut Vec<Event>,
    ) {
        let Some(w) = self.waiters.remove(&from) else {
            return;
        };
        self.etcd_locks.waiting.remove(&from);
        for n in &w.names {
            if let Some(lock) = self.locks.get_mut(n) {
                for r in lock.queue.iter_mut().filter(|r| **r == from) {
                    *r = to;
                }
            }
        }
        if let Some(s) = w.session.and_then(|s| self.sessions.get_mut(&s)) {
            s.waiting.remove(&from);
            s.waiting.insert(to);
        }
        self.waiters.insert(to, w);
        self.etcd_locks.waiting.insert(to, value.to_vec());
        self.dedup_resolve(from, Response::NotGranted);
        events.push(Event::WaiterGaveUp {
            request: from,
            name: name.to_owned(),
        });
    }

    /// [`Command::EtcdUnlock`]: end `lease`'s grant of `name` (if its token is `token`,
    /// when given), or withdraw its wait.
    pub(super) fn etcd_unlock(
        &mut self,
        name: &str,
        lease: SessionId,
        token: Option<Token>,
        events: &mut Vec<Event>,
    ) -> Response {
        let key = (lease_owner(lease), Some(lease));
        let Some(lock) = self.locks.get(name) else {
            return Response::NotHeld;
        };
        if let Some(h) = lock.holders.get(&key) {
            if token.is_some_and(|t| t != h.token) {
                return Response::NotHeld;
            }
            self.end_grant(name, &key, ReleaseReason::Released, events);
            return Response::Released { holds: 0 };
        }
        if token.is_some() {
            return Response::NotHeld;
        }
        match self.queued_etcd_wait(lock, &key.0, lease) {
            Some(rid) => {
                self.remove_waiter(rid, events);
                Response::Released { holds: 0 }
            }
            None => Response::NotHeld,
        }
    }

    /// [`Command::EtcdCancel`]: undo what `EtcdLock` request `request` did or would do.
    pub(super) fn etcd_cancel(
        &mut self,
        name: &str,
        lease: SessionId,
        request: RequestId,
        events: &mut Vec<Event>,
    ) -> Response {
        match self.dedup_lookup(request) {
            // Not applied yet: it never will act (its dedup record answers it).
            None => {
                self.dedup_store(request, Response::NotGranted);
                Response::NotHeld
            }
            Some(Response::Pending) if self.waiters.contains_key(&request) => {
                self.remove_waiter(request, events);
                Response::Released { holds: 0 }
            }
            Some(Response::Granted { token, .. })
                if self.etcd_locks.held.get(&(name.to_owned(), lease)) == Some(&Some(request)) =>
            {
                self.etcd_unlock(name, lease, Some(token), events)
            }
            Some(_) => Response::NotHeld,
        }
    }

    /// A grant of etcd lock `name` to `lease` was made at the current revision: put its key.
    pub(super) fn project_grant(
        &mut self,
        name: &str,
        lease: SessionId,
        value: &[u8],
        by: Option<RequestId>,
        events: &mut Vec<Event>,
    ) {
        let revision = self.revision;
        let Ok(lease_id) = i64::try_from(lease) else {
            return;
        };
        self.etcd_locks.held.insert((name.to_owned(), lease), by);
        // Apply's revisions only grow, so this cannot be refused; should it be, the lock is
        // held without its key (replicas still agree).
        if self
            .etcd
            .project_put(&lock_key(name, lease), value, lease_id, revision)
            .is_ok()
        {
            changed(revision, events);
        }
    }

    /// A queued acquire `rid` was granted `name` (the hand-over): if it is an etcd lock's,
    /// put its key.
    pub(super) fn project_waiter_grant(
        &mut self,
        rid: RequestId,
        name: &str,
        session: Option<SessionId>,
        events: &mut Vec<Event>,
    ) {
        if let (Some(value), Some(lease)) = (self.etcd_locks.waiting.remove(&rid), session) {
            self.project_grant(name, lease, &value, Some(rid), events);
        }
    }

    /// The grant of `name` held by `(owner, session)` ended: delete its key if it projects
    /// one.
    pub(super) fn project_end(
        &mut self,
        name: &str,
        session: Option<SessionId>,
        events: &mut Vec<Event>,
    ) {
        let Some(lease) = session else {
            return;
        };
        if self
            .etcd_locks
            .held
            .remove(&(name.to_owned(), lease))
            .is_none()
        {
            return;
        }
        let revision = self.revision;
        if let Ok(true) = self.etcd.project_delete(&lock_key(name, lease), revision) {
            changed(revision, events);
        }
    }
}

impl StateMachine {
    /// The first entry under [`Semantics::KEYSPACE_LOCKS`] found what `EtcdLock` left under
    /// older rules: end it in the lock table, at the current revision. Each waiter (it has
    /// no key) is withdrawn — its request resolved `NotGranted`, so a call still waiting on
    /// it learns so. Each holder's lock-table record is dropped *without* deleting its
    /// projected key: that key (attached to the lease, created at the grant's revision, which
    /// is its token) is the holder of etcd lock `name` on the keyspace from now on, so it
    /// keeps the lock with the same token and the next recipe or `Lock` key waits for its
    /// delete. The lock-table lock of the same name is free then: fenced's `LOCK.*` is a
    /// separate namespace, and its next waiter is granted at this revision. Work bounded by
    /// the records left (at most the waiter and lock limits).
    pub(super) fn migrate_etcd_locks(&mut self, events: &mut Vec<Event>) {
        let waiting: Vec<RequestId> = self.etcd_locks.waiting.keys().copied().collect();
        for rid in waiting {
            self.remove_waiter(rid, events);
        }
        // A waiting record without a waiter (cannot happen) goes too.
        self.etcd_locks.waiting = CowMap::default();
        let held: Vec<(String, SessionId)> = self.etcd_locks.held.keys().cloned().collect();
        self.etcd_locks.held = CowMap::default();
        for (name, lease) in held {
            // `held` is empty now, so ending the grant deletes no key.
            self.end_grant(
                &name,
                &(lease_owner(lease), Some(lease)),
                ReleaseReason::Released,
                events,
            );
        }
    }
}

/// Wake the watches once per revision (revisions only grow, so the last wake-up is the
/// newest).
fn changed(revision: Revision, events: &mut Vec<Event>) {
    let last = events.iter().rev().find_map(|e| match e {
        Event::EtcdChanged { revision } => Some(*revision),
        _ => None,
    });
    if last != Some(revision) {
        events.push(Event::EtcdChanged { revision });
    }
}
