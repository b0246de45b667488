//! The state's internal consistency (indexes agree with the data; no admissible waiter left
//! queued), checked by tests after every step.

use std::collections::{BTreeMap, BTreeSet};

use super::expiry::Due;
use super::locks::LockKind;
use super::StateMachine;
use crate::command::*;
use crate::limits::*;

impl StateMachine {
    /// Check the internal indexes agree with the data, and that no queue was left with an
    /// admissible waiter at its head. For tests; O(n).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.dirty.is_empty() {
            return Err("dirty locks left between commands".into());
        }
        let mut expected = BTreeSet::new();
        let mut queued: BTreeMap<RequestId, usize> = BTreeMap::new();
        for (name, lock) in &self.locks {
            if lock.is_idle() {
                return Err(format!("{name}: idle lock kept"));
            }
            let writers = lock
                .holders
                .values()
                .filter(|h| matches!(h.mode, Mode::Exclusive | Mode::Write))
                .count();
            if writers > 1 || (writers == 1 && lock.holders.len() > 1) {
                return Err(format!("{name}: exclusive holder shares the lock"));
            }
            if let LockKind::Semaphore { permits } = lock.kind {
                if lock.holders.len() > permits as usize {
                    return Err(format!("{name}: more permits than {permits}"));
                }
            }
            if let Some(d) = lock.delay_until {
                expected.insert((d, Due::Delay(name.clone())));
            }
            for ((owner, session), h) in &lock.holders {
                if h.holds == 0 {
                    return Err(format!("{name}: held zero times"));
                }
                if h.token > self.revision {
                    return Err(format!("{name}: token from the future"));
                }
                if LockKind::of(h.mode) != lock.kind {
                    return Err(format!("{name}: holder mode does not match the kind"));
                }
                match (h.deadline, session) {
                    (Some(d), None) => {
                        expected.insert((d, Due::Lease(name.clone(), owner.clone())));
                    }
                    (None, Some(s)) => {
                        let sess = self
                            .sessions
                            .get(s)
                            .ok_or(format!("{name}: held by dead session {s}"))?;
                        if !sess.holds.contains(&(name.clone(), owner.clone())) {
                            return Err(format!("{name}: session {s} does not list it"));
                        }
                    }
                    other => return Err(format!("{name}: bad lease {other:?}")),
                }
            }
            for rid in &lock.queue {
                let w = self
                    .waiters
                    .get(rid)
                    .ok_or(format!("{name}: queued {rid:?} unknown"))?;
                if !w.names.contains(name) {
                    return Err(format!("{name}: queued {rid:?} does not ask for it"));
                }
                *queued.entry(*rid).or_default() += 1;
            }
            if let Some(rid) = lock.queue.front() {
                let w = &self.waiters[rid];
                let ready = w.names.iter().all(|n| {
                    self.locks
                        .get(n)
                        .is_some_and(|l| l.queue.front() == Some(rid) && l.admits(w.mode))
                });
                if ready {
                    return Err(format!("{name}: admissible waiter {rid:?} left queued"));
                }
            }
        }
        for (rid, w) in &self.waiters {
            if queued.get(rid) != Some(&w.names.len()) {
                return Err(format!("waiter {rid:?} not queued on each of its locks"));
            }
            // An etcd Lock's wait has no deadline (only its lease's end withdraws it).
            if w.until != Millis::MAX {
                expected.insert((w.until, Due::Wait(*rid)));
            } else if w.session.is_none() || !self.etcd_locks.waiting.contains_key(rid) {
                return Err(format!("waiter {rid:?} without a deadline is no etcd Lock"));
            }
            if let Some(s) = w.session {
                let sess = self
                    .sessions
                    .get(&s)
                    .ok_or(format!("waiter of dead session {s}"))?;
                if !sess.waiting.contains(rid) {
                    return Err(format!("session {s} does not list its waiter"));
                }
            }
        }
        for (id, _) in &self.session_owners {
            if !self.sessions.contains_key(id) {
                return Err(format!("session {id} has an owner but does not exist"));
            }
        }
        for (id, s) in &self.sessions {
            expected.insert((s.deadline, Due::Session(*id)));
            for (name, owner) in &s.holds {
                let held = self
                    .locks
                    .get(name)
                    .is_some_and(|l| l.holders.contains_key(&(owner.clone(), Some(*id))));
                if !held {
                    return Err(format!("session {id} lists {name} it does not hold"));
                }
            }
        }
        // Under Semantics::LEASES a session's end deletes its keys: no key outlives its lease.
        for lease in self.etcd.attached_leases() {
            let live =
                crate::etcd::lease_session(lease).is_some_and(|s| self.sessions.contains_key(&s));
            if !live {
                return Err(format!(
                    "etcd keys attached to lease {lease}, which is no session"
                ));
            }
        }
        for (name, lease) in self.etcd_locks.held.keys() {
            let key = (super::etcd_locks::lease_owner(*lease), Some(*lease));
            if !self
                .locks
                .get(name)
                .is_some_and(|l| l.holders.contains_key(&key))
            {
                return Err(format!("etcd lock {name} of lease {lease} is no grant"));
            }
        }
        for rid in self.etcd_locks.waiting.keys() {
            if !self.waiters.contains_key(rid) {
                return Err(format!("etcd lock wait {rid:?} is no waiter"));
            }
        }
        for (id, c) in &self.clients {
            expected.insert((c.last_seen + CLIENT_IDLE_MS, Due::ClientIdle(*id)));
        }
        if !expected.iter().eq(self.deadlines.iter()) {
            return Err(format!(
                "deadline index out of sync: expected {expected:?}, have {:?}",
                self.deadlines
            ));
        }
        Ok(())
    }
}
