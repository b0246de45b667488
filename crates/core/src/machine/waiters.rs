//! Waiters: queued acquires, FIFO per lock. A waiter leaves its queues when it is granted
//! (`hand_over`, run last in every step), when its wait runs out or when its session ends.

use serde::{Deserialize, Serialize};

use super::expiry::Due;
use super::locks::Lock;
use super::StateMachine;
use crate::command::*;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Waiter {
    pub(super) names: Vec<String>,
    pub(super) owner: String,
    pub(super) mode: Mode,
    pub(super) session: Option<SessionId>,
    pub(super) ttl_ms: Millis,
    pub(super) lock_delay_ms: Millis,
    /// When the wait runs out (log time).
    pub(super) until: Millis,
}

impl StateMachine {
    /// Withdraw a queued acquire and resolve it as `NotGranted`.
    pub(super) fn remove_waiter(&mut self, rid: RequestId, events: &mut Vec<Event>) {
        let Some(w) = self.waiters.remove(&rid) else {
            return;
        };
        self.etcd_locks.waiting.remove(&rid);
        self.deadlines.remove(&(w.until, Due::Wait(rid)));
        if let Some(s) = w.session.and_then(|s| self.sessions.get_mut(&s)) {
            s.waiting.remove(&rid);
        }
        for name in &w.names {
            if let Some(lock) = self.locks.get_mut(name) {
                lock.queue.retain(|r| *r != rid);
            }
            // The next waiter may be admissible now.
            self.dirty.insert(name.clone());
        }
        self.dedup_resolve(rid, Response::NotGranted);
        events.push(Event::WaiterGaveUp {
            request: rid,
            name: w.names[0].clone(),
        });
    }

    /// [`Command::Withdraw`]: take back waiting acquire `request` of `names` for `owner`
    /// whose client went away (or, with `grant`, the one hold it was granted).
    pub(super) fn withdraw(
        &mut self,
        request: RequestId,
        names: &[String],
        owner: &str,
        grant: bool,
        events: &mut Vec<Event>,
    ) -> Response {
        match self.dedup_lookup(request) {
            // Not applied yet: it never will act (its record answers it).
            None => {
                self.dedup_store(request, Response::NotGranted);
                Response::NotHeld
            }
            Some(Response::Pending) => {
                let theirs = self
                    .waiters
                    .get(&request)
                    .is_some_and(|w| w.names == names && w.owner == owner);
                if !theirs {
                    return Response::NotHeld;
                }
                self.remove_waiter(request, events);
                Response::Released { holds: 0 }
            }
            Some(Response::Granted { token, .. }) if grant => {
                let released = self.release(names, owner, token, events);
                if matches!(released, Response::Released { .. }) {
                    self.dedup_resolve(request, Response::NotGranted);
                    Response::Released { holds: 0 }
                } else {
                    released
                }
            }
            Some(_) => Response::NotHeld,
        }
    }

    /// Serve the queues of every lock that changed in this step, in FIFO order: the first
    /// waiter of a queue is granted (token `revision`) when it is first in the queue of every
    /// lock it asks for and every one of them admits it; consecutive readers or permits are
    /// admitted together. Running last in a step means a grant made here is never ended at
    /// the same revision, so grants of a lock made at different revisions never share a token.
    pub(super) fn hand_over(&mut self, revision: Revision, events: &mut Vec<Event>) {
        while let Some(name) = self.dirty.pop_first() {
            while let Some(rid) = self.locks.get(&name).and_then(|l| l.queue.front().copied()) {
                let Some(w) = self.waiters.get(&rid) else {
                    // Cannot happen (queues and waiters change together); drop the stray id.
                    if let Some(l) = self.locks.get_mut(&name) {
                        l.queue.pop_front();
                    }
                    continue;
                };
                let ready = w.names.iter().all(|n| {
                    self.locks
                        .get(n)
                        .is_some_and(|l| l.queue.front() == Some(&rid) && l.admits(w.mode))
                });
                if !ready {
                    break;
                }
                let Some(w) = self.waiters.remove(&rid) else {
                    break;
                };
                self.deadlines.remove(&(w.until, Due::Wait(rid)));
                for n in &w.names {
                    if let Some(l) = self.locks.get_mut(n) {
                        l.queue.pop_front();
                    }
                    if *n != name {
                        self.dirty.insert(n.clone());
                    }
                }
                if let Some(s) = w.session.and_then(|s| self.sessions.get_mut(&s)) {
                    s.waiting.remove(&rid);
                }
                let key = (w.owner.clone(), w.session);
                let (token, deadline) =
                    self.grant(revision, &w.names, &key, w.mode, w.ttl_ms, w.lock_delay_ms);
                self.project_waiter_grant(rid, &name, w.session, events);
                self.dedup_resolve(
                    rid,
                    Response::Granted {
                        token,
                        holds: 1,
                        deadline_ms: deadline,
                    },
                );
                events.push(Event::WaiterGranted {
                    request: rid,
                    name: w.names[0].clone(),
                    token,
                    deadline_ms: deadline,
                });
            }
            if self.locks.get(&name).is_some_and(Lock::is_idle) {
                self.locks.remove(&name);
            }
        }
    }
}
