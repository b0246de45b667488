//! Read-side views of the state for front ends and tools: a lock's holders, a session, counts.
//! Nothing here changes the state.

use serde::{Deserialize, Serialize};

use super::locks::{Holder, LockKind};
use super::StateMachine;
use crate::command::*;

/// One grant of a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    pub owner: String,
    pub mode: Mode,
    pub token: Token,
    pub holds: u32,
    pub session: Option<SessionId>,
    /// Lease end in log time (the session's deadline for session-bound grants).
    pub deadline_ms: Millis,
}

/// What a reader sees of a held lock. `owner`, `token`, `holds`, `session` and `deadline_ms`
/// describe the newest grant (the only one for exclusive and write grants); `holders` lists
/// them all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub name: String,
    pub kind: LockKind,
    pub owner: String,
    pub token: Token,
    pub holds: u32,
    pub session: Option<SessionId>,
    pub deadline_ms: Millis,
    pub waiters: usize,
    pub holders: Vec<HolderInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: SessionId,
    pub ttl_ms: Millis,
    pub deadline_ms: Millis,
    pub locks: Vec<String>,
}

impl StateMachine {
    /// The holders of `name`; `None` if nobody holds it.
    pub fn lock_info(&self, name: &str) -> Option<LockInfo> {
        let lock = self.locks.get(name)?;
        let holders: Vec<HolderInfo> = lock
            .holders
            .iter()
            .map(|((owner, session), h)| HolderInfo {
                owner: owner.clone(),
                mode: h.mode,
                token: h.token,
                holds: h.holds,
                session: *session,
                deadline_ms: self.lease_end(h, *session),
            })
            .collect();
        let newest = holders.iter().max_by_key(|h| h.token)?.clone();
        Some(LockInfo {
            name: name.to_owned(),
            kind: lock.kind,
            owner: newest.owner,
            token: newest.token,
            holds: newest.holds,
            session: newest.session,
            deadline_ms: newest.deadline_ms,
            waiters: lock.queue.len(),
            holders,
        })
    }

    /// Queued acquires of `name` (also while nobody holds it, e.g. during a lock-delay).
    pub fn waiter_count(&self, name: &str) -> usize {
        self.locks.get(name).map_or(0, |l| l.queue.len())
    }

    /// Session `id` as of log time `now`: `None` if it does not exist or its deadline is at or
    /// before `now` (it expires at the next tick that reaches `now`). Reads pass the time they
    /// judge at (`read_timed`'s), never the applied state's alone: a session past its
    /// deadline on the leader's clock is still in an unticked state, and a read that asks
    /// only whether it is there would call it alive on every member until the next tick.
    pub fn session_info(&self, id: SessionId, now: Millis) -> Option<SessionInfo> {
        let s = self.sessions.get(&id).filter(|s| s.deadline > now)?;
        Some(SessionInfo {
            id,
            ttl_ms: s.ttl_ms,
            deadline_ms: s.deadline,
            locks: s.holds.iter().map(|(n, _)| n.clone()).collect(),
        })
    }

    /// Every held lock, in name order.
    pub fn locks(&self) -> impl Iterator<Item = LockInfo> + '_ {
        self.locks.keys().filter_map(|n| self.lock_info(n))
    }

    /// Locks with state (held, queued or delayed).
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub(super) fn lease_end(&self, h: &Holder, session: Option<SessionId>) -> Millis {
        match (h.deadline, session) {
            (Some(d), _) => d,
            (None, Some(s)) => self.sessions.get(&s).map_or(self.now, |s| s.deadline),
            (None, None) => self.now,
        }
    }
}
