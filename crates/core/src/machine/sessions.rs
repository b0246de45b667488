//! Sessions: a lease that many grants and waits share, kept alive by one keep-alive and
//! ended (releasing its grants and withdrawing its waits) by a close or its expiry.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::expiry::Due;
use super::locks::check_ttl;
use super::StateMachine;
use crate::command::*;
use crate::limits::*;
use crate::CoreError;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Session {
    pub(super) ttl_ms: Millis,
    pub(super) deadline: Millis,
    /// Grants held under this session: (lock name, owner).
    pub(super) holds: BTreeSet<(String, String)>,
    /// Its queued acquires.
    pub(super) waiting: BTreeSet<RequestId>,
}

impl StateMachine {
    pub(super) fn open_session(
        &mut self,
        id: SessionId,
        ttl_ms: Millis,
    ) -> Result<Response, CoreError> {
        check_ttl(ttl_ms)?;
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(CoreError::LimitReached {
                what: "sessions".into(),
                max: MAX_SESSIONS,
            });
        }
        let deadline = self.now + ttl_ms;
        self.sessions.insert(
            id,
            Session {
                ttl_ms,
                deadline,
                holds: BTreeSet::new(),
                waiting: BTreeSet::new(),
            },
        );
        self.deadlines.insert((deadline, Due::Session(id)));
        Ok(Response::SessionOpened {
            session: id,
            deadline_ms: deadline,
        })
    }

    pub(super) fn keep_alive(&mut self, id: SessionId) -> Response {
        let now = self.now;
        let Some(s) = self.sessions.get_mut(&id) else {
            return Response::NoSuchSession;
        };
        let old = s.deadline;
        s.deadline = old.max(now + s.ttl_ms);
        let new = s.deadline;
        self.deadlines.remove(&(old, Due::Session(id)));
        self.deadlines.insert((new, Due::Session(id)));
        Response::SessionAlive { deadline_ms: new }
    }

    pub(super) fn close_session(
        &mut self,
        id: SessionId,
        reason: ReleaseReason,
        events: &mut Vec<Event>,
    ) -> Response {
        let Some(s) = self.sessions.remove(&id) else {
            return Response::NoSuchSession;
        };
        self.deadlines.remove(&(s.deadline, Due::Session(id)));
        for rid in &s.waiting {
            self.remove_waiter(*rid, events);
        }
        for (name, owner) in &s.holds {
            self.end_grant(name, &(owner.clone(), Some(id)), reason, events);
        }
        Response::SessionClosed
    }
}
