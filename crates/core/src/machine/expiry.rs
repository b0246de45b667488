//! Deadlines: the `deadlines` index of leases, sessions, waits, lock-delays and idle dedup
//! records, ordered by time, and the expiry step that ends whatever is due.
//!
//! `Due`'s variant order is part of the snapshot encoding *and* the order in which things
//! due at the same time expire (so of the tokens their hand-overs issue): never reorder it.

use serde::{Deserialize, Serialize};

use super::StateMachine;
use crate::command::*;
use crate::limits::*;

/// Something with a deadline; the `deadlines` index orders them by time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Due {
    Lease(String, String),
    Session(SessionId),
    Wait(RequestId),
    Delay(String),
    ClientIdle(u64),
}

impl StateMachine {
    /// The earliest pending deadline (lease, session, wait, lock-delay, dedup eviction, key
    /// expiry), if any. The leader proposes a [`Command::Tick`] once its log clock passes it.
    pub fn next_deadline(&self) -> Option<Millis> {
        let locks = self.deadlines.first().map(|(t, _)| *t);
        match (locks, self.kv.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Expire everything whose deadline is at or before `now`, oldest first.
    /// A session that expires deletes its etcd keys under [`Semantics::LEASES`] (`semantics`
    /// is the entry's), at the expiry step's revision.
    pub(super) fn expire_due(&mut self, semantics: Semantics, events: &mut Vec<Event>) {
        while let Some((t, due)) = self.deadlines.first().cloned() {
            if t > self.now {
                break;
            }
            self.deadlines.remove(&(t, due.clone()));
            match due {
                Due::Lease(name, owner) => {
                    let key = (owner, None);
                    let lease = self
                        .locks
                        .get(&name)
                        .and_then(|l| l.holders.get(&key))
                        .and_then(|h| h.deadline);
                    if lease == Some(t) {
                        self.end_grant(&name, &key, ReleaseReason::Expired, events);
                    }
                }
                Due::Session(id) => {
                    self.close_session(id, ReleaseReason::SessionExpired, semantics, events);
                }
                Due::Wait(rid) => self.remove_waiter(rid, events),
                Due::Delay(name) => {
                    if let Some(l) = self.locks.get_mut(&name) {
                        if l.delay_until == Some(t) {
                            l.delay_until = None;
                            self.dirty.insert(name);
                        }
                    }
                }
                Due::ClientIdle(id) => {
                    if self
                        .clients
                        .get(&id)
                        .is_some_and(|c| c.last_seen + CLIENT_IDLE_MS == t)
                    {
                        self.clients.remove(&id);
                        self.request_digests.remove(&id);
                    }
                }
            }
        }
    }

    /// The disarm of the cluster's `CORRUPT` alarm under [`Semantics::ALARM_HOLDS_LEASES`]:
    /// every deadline of the `deadlines` index, and every record's time they stand for (a
    /// session's deadline, a leased grant's, a wait's end, a lock-delay, a client's last
    /// request), moves `held` ms later, the time the replicated clock stood still while the
    /// alarm was raised, so each has the time left it had at the raise. Keys' TTLs (the Redis
    /// keyspace's) are the data's own and do not move. Bounded: one step per record.
    pub(super) fn hold_deadlines(&mut self, held: Millis) {
        if held == 0 {
            return;
        }
        let later = |t: Millis| t.saturating_add(held);
        let moved: Vec<(Millis, Due)> = self
            .deadlines
            .iter()
            .map(|(t, due)| (later(*t), due.clone()))
            .collect();
        self.deadlines.clear();
        for d in moved {
            self.deadlines.insert(d);
        }
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.deadline = later(s.deadline);
            }
        }
        let names: Vec<String> = self.locks.keys().cloned().collect();
        for name in names {
            let Some(l) = self.locks.get_mut(&name) else {
                continue;
            };
            l.delay_until = l.delay_until.map(later);
            let keys: Vec<_> = l.holders.keys().cloned().collect();
            for key in keys {
                if let Some(h) = l.holders.get_mut(&key) {
                    h.deadline = h.deadline.map(later);
                }
            }
        }
        let rids: Vec<RequestId> = self.waiters.keys().copied().collect();
        for rid in rids {
            if let Some(w) = self.waiters.get_mut(&rid) {
                w.until = later(w.until);
            }
        }
        let clients: Vec<u64> = self.clients.keys().copied().collect();
        for id in clients {
            if let Some(c) = self.clients.get_mut(&id) {
                c.last_seen = later(c.last_seen);
            }
        }
    }
}
