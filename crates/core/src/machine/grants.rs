//! Ending and extending grants: release (one hold, or one multi-lock grant), force-unlock,
//! renew, and `end_grant`, which every ending (release, expiry, session end) goes through.

use std::collections::BTreeSet;

use super::expiry::Due;
use super::locks::{check_ttl, HolderKey};
use super::StateMachine;
use crate::command::*;
use crate::CoreError;

impl StateMachine {
    /// Drop one hold of grant `token` of `owner` on each of `names`.
    pub(super) fn release(
        &mut self,
        names: &[String],
        owner: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Response {
        if names.iter().collect::<BTreeSet<_>>().len() != names.len() {
            return Response::NotHeld;
        }
        let keys: Option<Vec<HolderKey>> = names
            .iter()
            .map(|n| self.holder_key(n, owner, token))
            .collect();
        let Some(keys) = keys.filter(|k| !k.is_empty()) else {
            return Response::NotHeld;
        };
        let mut remaining = 0;
        for (name, key) in names.iter().zip(&keys) {
            let Some(h) = self
                .locks
                .get_mut(name)
                .and_then(|l| l.holders.get_mut(key))
            else {
                continue;
            };
            h.holds -= 1;
            remaining = h.holds;
            if h.holds == 0 {
                self.end_grant(name, key, ReleaseReason::Released, events);
            }
        }
        Response::Released { holds: remaining }
    }

    pub(super) fn holder_key(&self, name: &str, owner: &str, token: Token) -> Option<HolderKey> {
        self.locks
            .get(name)?
            .holders
            .iter()
            .find(|((o, _), h)| o == owner && h.token == token)
            .map(|(k, _)| k.clone())
    }

    pub(super) fn force_unlock(&mut self, name: &str, events: &mut Vec<Event>) -> Response {
        let keys: Vec<HolderKey> = self
            .locks
            .get(name)
            .map(|l| l.holders.keys().cloned().collect())
            .unwrap_or_default();
        if keys.is_empty() {
            return Response::NotHeld;
        }
        for key in &keys {
            self.end_grant(name, key, ReleaseReason::ForceUnlocked, events);
        }
        Response::Released { holds: 0 }
    }

    pub(super) fn renew(
        &mut self,
        name: &str,
        owner: &str,
        token: Token,
        ttl_ms: Millis,
    ) -> Result<Response, CoreError> {
        check_ttl(ttl_ms)?;
        let now = self.now;
        let Some(key) = self.holder_key(name, owner, token) else {
            return Ok(Response::NotHeld);
        };
        let Some(h) = self
            .locks
            .get_mut(name)
            .and_then(|l| l.holders.get_mut(&key))
        else {
            return Ok(Response::NotHeld);
        };
        let Some(old) = h.deadline else {
            return Err(CoreError::LockBoundToSession(name.to_owned()));
        };
        let new = old.max(now + ttl_ms);
        h.deadline = Some(new);
        let due = |t| (t, Due::Lease(name.to_owned(), owner.to_owned()));
        self.deadlines.remove(&due(old));
        self.deadlines.insert(due(new));
        Ok(Response::Renewed { deadline_ms: new })
    }

    /// End one grant; the lock's queue is served when the entry is done. An *expired* grant
    /// with a lock-delay keeps the lock from being granted until the delay has passed.
    pub(super) fn end_grant(
        &mut self,
        name: &str,
        key: &HolderKey,
        reason: ReleaseReason,
        events: &mut Vec<Event>,
    ) {
        let now = self.now;
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        let Some(h) = lock.holders.remove(key) else {
            return;
        };
        let expired = matches!(
            reason,
            ReleaseReason::Expired | ReleaseReason::SessionExpired
        );
        let mut delay = None;
        if expired && h.lock_delay_ms > 0 {
            let until = lock.delay_until.unwrap_or(0).max(now + h.lock_delay_ms);
            if let Some(old) = lock.delay_until.replace(until) {
                self.deadlines.remove(&(old, Due::Delay(name.to_owned())));
            }
            delay = Some(until);
        }
        if let Some(d) = h.deadline {
            self.deadlines
                .remove(&(d, Due::Lease(name.to_owned(), key.0.clone())));
        }
        if let Some(s) = key.1.and_then(|s| self.sessions.get_mut(&s)) {
            s.holds.remove(&(name.to_owned(), key.0.clone()));
        }
        if let Some(until) = delay {
            self.deadlines.insert((until, Due::Delay(name.to_owned())));
        }
        self.project_end(name, key.1, events);
        events.push(Event::LockReleased {
            name: name.to_owned(),
            owner: key.0.clone(),
            session: key.1,
            token: h.token,
            reason,
        });
        self.dirty.insert(name.to_owned());
    }
}
