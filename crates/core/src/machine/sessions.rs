//! Sessions: a lease that many grants and waits share, kept alive by one keep-alive and
//! ended (releasing its grants and withdrawing its waits) by a close or its expiry. A session
//! is also an etcd lease (its id the lease id): under [`Semantics::LEASES`] etcd keys may be
//! attached to it, and its end deletes them at the revision of the command that ended it.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::expiry::Due;
use super::locks::check_ttl;
use super::StateMachine;
use crate::command::*;
use crate::etcd::MAX_LEASE_TTL_S;
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
        self.insert_session(id, ttl_ms)
    }

    /// A session opened as an etcd lease (`Command::OpenLease`): etcd's TTL limit rather
    /// than the sessions' one-day cap.
    pub(super) fn open_lease(
        &mut self,
        id: SessionId,
        ttl_ms: Millis,
    ) -> Result<Response, CoreError> {
        let max = MAX_LEASE_TTL_S as u64 * 1000;
        if ttl_ms == 0 || ttl_ms > max {
            return Err(CoreError::InvalidTtl { ttl_ms, max });
        }
        self.insert_session(id, ttl_ms)
    }

    /// The id a session (or lease) opened at `revision` gets: the revision itself; under
    /// [`Semantics::CHOSEN_LEASES`] the smallest id at or above it that no live session has
    /// (a lease id a client chose may be ahead of the revisions). Deterministic: it depends
    /// only on the replicated session table. Bounded: at most one step per live session.
    pub(super) fn session_id_for(&self, revision: Revision, semantics: Semantics) -> SessionId {
        if !semantics.chosen_leases() {
            return revision;
        }
        let mut id = revision;
        for (taken, _) in self.sessions.range(revision..) {
            if *taken != id {
                break;
            }
            id = id.saturating_add(1);
        }
        id
    }

    /// etcd's `LeaseGrant` without an id ([`Command::OpenLease`]) at `revision`: under
    /// [`Semantics::CHOSEN_LEASES`] refused by `NOSPACE` and given a free id
    /// ([`session_id_for`](Self::session_id_for)); before, as session `revision`.
    pub(super) fn open_lease_at(
        &mut self,
        revision: Revision,
        ttl_ms: Millis,
        semantics: Semantics,
    ) -> Result<Response, CoreError> {
        if semantics.chosen_leases() {
            self.lease_space()?;
        }
        let id = self.session_id_for(revision, semantics);
        self.open_lease(id, ttl_ms)
    }

    /// etcd's `LeaseGrant` with the client's `id` ([`Command::GrantLease`], rules
    /// [`Semantics::CHOSEN_LEASES`]): "lease already exists" while a session `id` is live.
    pub(super) fn grant_lease(
        &mut self,
        id: SessionId,
        ttl_ms: Millis,
    ) -> Result<Response, CoreError> {
        if id == 0 || self.sessions.contains_key(&id) {
            return Err(CoreError::Etcd(crate::etcd::EtcdError::LeaseExists {
                lease: i64::try_from(id).unwrap_or(i64::MAX),
            }));
        }
        self.lease_space()?;
        self.open_lease(id, ttl_ms)
    }

    /// `LeaseGrant` under [`Semantics::CHOSEN_LEASES`]: refused with `NOSPACE` while the etcd
    /// keyspace's space alarm is raised, as etcd's capped applier refuses it.
    pub(super) fn lease_space(&self) -> Result<(), CoreError> {
        if self.etcd_quota.nospace {
            return Err(CoreError::Etcd(crate::etcd::EtcdError::NoSpace));
        }
        Ok(())
    }

    fn insert_session(&mut self, id: SessionId, ttl_ms: Millis) -> Result<Response, CoreError> {
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(CoreError::LimitReached {
                what: "sessions".into(),
                max: MAX_SESSIONS,
            });
        }
        let deadline = self.now.saturating_add(ttl_ms);
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
        s.deadline = old.max(now.saturating_add(s.ttl_ms));
        let new = s.deadline;
        self.deadlines.remove(&(old, Due::Session(id)));
        self.deadlines.insert((new, Due::Session(id)));
        Response::SessionAlive { deadline_ms: new }
    }

    /// Keep each of `ids` alive (`Command::KeepAliveMany`): one answer per id, in order.
    pub(super) fn keep_alive_many(&mut self, ids: &[SessionId]) -> Response {
        let alive = ids.iter().map(|id| self.keep_alive_life(*id)).collect();
        Response::SessionsAlive { alive }
    }

    /// Keep `id` alive: its life now, `None` if it does not exist.
    pub(super) fn keep_alive_life(&mut self, id: SessionId) -> Option<SessionLife> {
        match self.keep_alive(id) {
            Response::SessionAlive { deadline_ms } => Some(SessionLife {
                deadline_ms,
                ttl_ms: self.sessions.get(&id).map_or(0, |s| s.ttl_ms),
            }),
            _ => None,
        }
    }

    /// End session `id`: its waits withdrawn, its grants ended, and under
    /// [`Semantics::LEASES`] every etcd key attached to it deleted at the current revision
    /// (the command's, or the expiry step's), with an [`Event::EtcdChanged`].
    pub(super) fn close_session(
        &mut self,
        id: SessionId,
        reason: ReleaseReason,
        semantics: Semantics,
        events: &mut Vec<Event>,
    ) -> Response {
        let Some(s) = self.sessions.remove(&id) else {
            return Response::NoSuchSession;
        };
        self.forget_owner(id);
        if semantics.leases() {
            self.delete_lease_keys(id, events);
        }
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
