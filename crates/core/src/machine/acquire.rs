//! Acquiring: a new grant (one or many names, any lock kind), a reentrant hold of an existing
//! grant, or a queued wait; and `grant`, which installs a grant for an acquire and for a
//! waiter served by `hand_over`.

use super::expiry::Due;
use super::locks::{Holder, HolderKey, Lock, LockKind};
use super::waiters::Waiter;
use super::StateMachine;
use crate::command::*;
use crate::limits::*;
use crate::CoreError;

impl StateMachine {
    pub(super) fn acquire(
        &mut self,
        revision: Revision,
        rid: Option<RequestId>,
        spec: &AcquireSpec,
    ) -> Result<Response, CoreError> {
        self.validate(spec)?;
        let until = self.now + spec.wait_ms;
        self.acquire_valid(revision, rid, spec, Some(until))
    }

    /// [`acquire`](Self::acquire) of a validated `spec`. A wait runs out at `until`, or, with
    /// `None`, only when its session ends or it is withdrawn (etcd's `Lock`, which waits as
    /// long as its lease lives: no deadline, and its waiter's `until` is `Millis::MAX`).
    pub(super) fn acquire_valid(
        &mut self,
        revision: Revision,
        rid: Option<RequestId>,
        spec: &AcquireSpec,
        until: Option<Millis>,
    ) -> Result<Response, CoreError> {
        let key: HolderKey = (spec.owner.clone(), spec.session);

        // Reentrant: the same owner (and session) already holds every name with one grant.
        let held: Vec<&Holder> = spec
            .names
            .iter()
            .filter_map(|n| self.locks.get(n).and_then(|l| l.holders.get(&key)))
            .collect();
        if !held.is_empty() {
            let token = held[0].token;
            if held.len() != spec.names.len() || held.iter().any(|h| h.token != token) {
                return Err(CoreError::PartiallyHeld {
                    owner: spec.owner.clone(),
                });
            }
            if held[0].mode == Mode::Read && spec.mode == Mode::Write {
                return Err(CoreError::UpgradeNotSupported {
                    name: spec.names[0].clone(),
                    owner: spec.owner.clone(),
                });
            }
            if held.iter().any(|h| h.holds >= MAX_HOLDS) {
                return Err(CoreError::TooManyHolds {
                    name: spec.names[0].clone(),
                    max: MAX_HOLDS,
                });
            }
            return Ok(self.reenter(spec, &key));
        }

        let free = spec.names.iter().all(|n| match self.locks.get(n) {
            None => true,
            Some(lock) => lock.queue.is_empty() && lock.admits(spec.mode),
        });
        if free {
            let new_locks = spec
                .names
                .iter()
                .filter(|n| !self.locks.contains_key(*n))
                .count();
            if self.locks.len() + new_locks > MAX_LOCKS {
                return Err(CoreError::LimitReached {
                    what: "locks".into(),
                    max: MAX_LOCKS,
                });
            }
            let (token, deadline) = self.grant(
                revision,
                &spec.names,
                &key,
                spec.mode,
                spec.ttl_ms,
                spec.lock_delay_ms,
            );
            return Ok(Response::Granted {
                token,
                holds: 1,
                deadline_ms: deadline,
            });
        }
        if spec.wait_ms == 0 {
            return Ok(Response::NotGranted);
        }
        let Some(request) = rid else {
            return Err(CoreError::WaitNeedsRequestId);
        };
        if self.waiters.len() >= MAX_WAITERS {
            return Err(CoreError::LimitReached {
                what: "waiters".into(),
                max: MAX_WAITERS,
            });
        }
        for name in &spec.names {
            if self.locks.get(name).map_or(0, |l| l.queue.len()) >= MAX_WAITERS_PER_LOCK {
                return Err(CoreError::TooManyWaiters {
                    name: name.clone(),
                    max: MAX_WAITERS_PER_LOCK,
                });
            }
        }
        let kind = LockKind::of(spec.mode);
        for name in &spec.names {
            self.locks
                .get_or_insert_with(name.clone(), || Lock::new(kind))
                .queue
                .push_back(request);
        }
        self.waiters.insert(
            request,
            Waiter {
                names: spec.names.clone(),
                owner: spec.owner.clone(),
                mode: spec.mode,
                session: spec.session,
                ttl_ms: spec.ttl_ms,
                lock_delay_ms: spec.lock_delay_ms,
                until: until.unwrap_or(Millis::MAX),
            },
        );
        if let Some(until) = until {
            self.deadlines.insert((until, Due::Wait(request)));
        }
        if let Some(s) = spec.session.and_then(|s| self.sessions.get_mut(&s)) {
            s.waiting.insert(request);
        }
        Ok(Response::Pending)
    }

    /// One more hold on an existing grant; a lease is extended to at least `now + ttl`.
    pub(super) fn reenter(&mut self, spec: &AcquireSpec, key: &HolderKey) -> Response {
        let now = self.now;
        let mut out = Response::NotGranted;
        for name in &spec.names {
            let Some(h) = self
                .locks
                .get_mut(name)
                .and_then(|l| l.holders.get_mut(key))
            else {
                continue;
            };
            h.holds += 1;
            if let Some(old) = h.deadline {
                let new = old.max(now + spec.ttl_ms);
                h.deadline = Some(new);
                let due = |t| (t, Due::Lease(name.clone(), key.0.clone()));
                self.deadlines.remove(&due(old));
                self.deadlines.insert(due(new));
            }
            out = Response::Granted {
                token: h.token,
                holds: h.holds,
                deadline_ms: h.deadline,
            };
        }
        out
    }

    /// Install a grant of every name in `names` to `key` with token `revision`. A name `key`
    /// already holds (a second queued acquire of the same owner) gets one more hold of its
    /// grant instead. Returns the token and lease deadline (`None` for session-bound grants)
    /// of the first name.
    pub(super) fn grant(
        &mut self,
        revision: Revision,
        names: &[String],
        key: &HolderKey,
        mode: Mode,
        ttl_ms: Millis,
        lock_delay_ms: Millis,
    ) -> (Token, Option<Millis>) {
        let now = self.now;
        let mut first = None;
        for name in names {
            let lock = self
                .locks
                .get_or_insert_with(name.clone(), || Lock::new(LockKind::of(mode)));
            let lease_due = |t| (t, Due::Lease(name.clone(), key.0.clone()));
            if let Some(h) = lock.holders.get_mut(key) {
                h.holds = h.holds.saturating_add(1);
                if let Some(old) = h.deadline {
                    let new = old.max(now + ttl_ms);
                    h.deadline = Some(new);
                    self.deadlines.remove(&lease_due(old));
                    self.deadlines.insert(lease_due(new));
                }
                first.get_or_insert((h.token, h.deadline));
                continue;
            }
            let deadline = key.1.is_none().then_some(now + ttl_ms);
            lock.holders.insert(
                key.clone(),
                Holder {
                    mode,
                    token: revision,
                    holds: 1,
                    deadline,
                    lock_delay_ms,
                },
            );
            match (deadline, key.1.and_then(|s| self.sessions.get_mut(&s))) {
                (Some(d), _) => {
                    self.deadlines.insert(lease_due(d));
                }
                (None, Some(s)) => {
                    s.holds.insert((name.clone(), key.0.clone()));
                }
                (None, None) => {}
            }
            first.get_or_insert((revision, deadline));
        }
        first.unwrap_or((revision, None))
    }
}
