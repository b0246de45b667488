//! The lock state machine: exclusive, read-write and semaphore locks, atomic multi-locks,
//! leases, sessions, FIFO waiting, lock-delay, and the request dedup table.
//!
//! This file keeps the [`StateMachine`] itself (its fields, whose order is the snapshot
//! encoding), the apply order of an entry and its revisions, and the dispatch of a command.
//! Each concern has its own module:
//! * `locks` — what a lock is (kind, holders, queue, lock-delay), what it admits, and an
//!   acquire's validation;
//! * `acquire` — acquire (grant, reenter or queue) and `grant`;
//! * `grants` — release, force-unlock, renew, and `end_grant`, which every ending uses;
//! * `waiters` — queued acquires: withdrawing one, and `hand_over`, which serves the queues;
//! * `sessions` — open, keep-alive, close;
//! * `dedup` — the request dedup table;
//! * `expiry` — the deadline index (`Due`) and the expiry step;
//! * `views` — read-side views (`lock_info`, `session_info`, counts);
//! * `invariants` — `check_invariants`, for tests;
//! * `restore` — preparing a state for a new cluster;
//! * `etcd` — the etcd keyspace's commands and reads;
//! * `body` — the snapshot body encoding and its versions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::*;
use crate::cow::{CowMap, CowSet};
use crate::etcd::{EtcdStore, Quota};
use crate::kv::{FenceError, Keyspace, Stale, MAX_VALUE_LEN};
use crate::{CoreError, SnapshotError};

mod acquire;
mod body;
#[cfg(test)]
mod cluster_alarm_tests;
mod dedup;
mod etcd;
#[cfg(test)]
mod etcd_lock_tests;
mod etcd_locks;
#[cfg(test)]
mod etcd_tests;
mod expiry;
mod grants;
mod invariants;
#[cfg(test)]
mod keyspace_lock_tests;
#[cfg(test)]
mod lease_tests;
mod locks;
mod owners;
#[cfg(test)]
mod owners_tests;
#[cfg(test)]
mod quota_tests;
mod restore;
mod sessions;
mod views;
mod waiters;
#[cfg(test)]
mod withdraw_tests;

pub use body::BODY_VERSION;
use dedup::ClientRecord;
pub use etcd::COMPACT_STEP_BUDGET;
use etcd_locks::EtcdLocks;
pub use etcd_locks::{lease_owner, lock_key};
use expiry::Due;
use locks::Lock;
pub use locks::LockKind;
pub use restore::{RestoreError, Restored};
use sessions::Session;
pub use views::{HolderInfo, LockInfo, SessionInfo};
use waiters::Waiter;

/// The replicated state. Apply entries in log order with [`StateMachine::apply_batch`]; the
/// same entries always produce the same state, responses and events.
///
/// bincode is positional: the order of these fields is the snapshot's encoding (and the
/// digest's). Never reorder or insert; append at the end only. The etcd keyspace and its
/// quota are not fields of that encoding: they follow it, in snapshot bodies of version 2
/// and 3 (see `body`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct StateMachine {
    now: Millis,
    last_index: Index,
    /// The store revision: advanced by one by every applied command (and by every expiry
    /// step that found something due). A grant's token, a session's id and a key's
    /// `create_revision`/`mod_revision` are the revision of the command that made them.
    revision: Revision,
    // Copy-on-write tables: a snapshot clones the state in O(1) (see `crate::cow`).
    locks: CowMap<String, Lock>,
    waiters: CowMap<RequestId, Waiter>,
    sessions: CowMap<SessionId, Session>,
    clients: CowMap<u64, ClientRecord>,
    deadlines: CowSet<(Millis, Due)>,
    /// Locks whose holders, queue or delay changed in the entry being applied; their queues
    /// are served when the entry is done. Empty between entries.
    #[serde(skip)]
    dirty: BTreeSet<String>,
    /// The RESP keyspace.
    kv: Keyspace,
    /// The etcd v3 keyspace, separate from the RESP one (`FLUSHALL` and Redis expiry never
    /// touch it). Encoded after the fields above, in body version 2 only (`body`).
    #[serde(skip)]
    etcd: EtcdStore,
    /// The etcd keyspace's space quota and `NOSPACE` alarm. Encoded after the etcd keyspace,
    /// in body version 3 only, and only once it differs from the default (`body`).
    #[serde(skip)]
    etcd_quota: Quota,
    /// The grants and waits of etcd's `Lock` and `Election` calls, which project keys into
    /// the etcd keyspace (`etcd_locks`). Encoded after the quota, in body version 4 only,
    /// and only while not empty (`body`).
    #[serde(skip)]
    etcd_locks: EtcdLocks,
    /// The user each session was opened by, for sessions opened in a [`Command::AsUser`]
    /// (`owners`). Encoded after etcd's locks, in body version 5 only, and only while not
    /// empty (`body`).
    #[serde(skip)]
    session_owners: CowMap<SessionId, String>,
    /// The cluster-wide `CORRUPT` alarm ([`Command::ClusterAlarm`]). Encoded after the
    /// sessions' owners, in body version 6 only, and only while raised (`body`).
    #[serde(skip)]
    cluster_alarm: Option<crate::CorruptAlarm>,
    /// By client and seq, a digest of the command of each request whose response the dedup
    /// table keeps, for requests applied under [`Semantics::REQUEST_DIGESTS`] (`dedup`).
    /// Encoded after the cluster alarm, in body version 7 only, and only while not empty
    /// (`body`).
    #[serde(skip)]
    request_digests: CowMap<u64, BTreeMap<u64, u64>>,
}

/// The snapshot layout written before tokens were revisions (format 1): [`StateMachine`]
/// without `revision`. Read by [`StateMachine::from_legacy_bytes`] only.
#[derive(Deserialize)]
struct LegacyStateMachine {
    now: Millis,
    last_index: Index,
    locks: CowMap<String, Lock>,
    waiters: CowMap<RequestId, Waiter>,
    sessions: CowMap<SessionId, Session>,
    clients: CowMap<u64, ClientRecord>,
    deadlines: CowSet<(Millis, Due)>,
    kv: Keyspace,
}

impl StateMachine {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cluster-wide `CORRUPT` alarm, if raised ([`Command::ClusterAlarm`]).
    pub fn cluster_alarm(&self) -> Option<&crate::CorruptAlarm> {
        self.cluster_alarm.as_ref()
    }

    /// Log time of the last applied entry.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Index of the last applied entry (0 before any).
    pub fn last_index(&self) -> Index {
        self.last_index
    }

    /// The store revision: the revision of the last applied command (0 before any). Every
    /// token, session id and key revision issued so far is at most this.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The keyspace, for reads.
    pub fn kv(&self) -> &Keyspace {
        &self.kv
    }

    /// Serialize the whole state: the snapshot body of version
    /// [`body_version`](Self::body_version) (the snapshot file records which).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Serializing plain maps and integers into a Vec cannot fail.
        let _ = self.write_body(body::options(), &mut out);
        out
    }

    /// Decode [`to_bytes`](Self::to_bytes)' output of any body version: version 2 is
    /// version 1 followed by the etcd keyspace, so bytes left after the first part are it.
    /// (Snapshot files name their body version: `read_body`.)
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        body::from_bytes(bytes)
    }

    /// Decode a snapshot written before tokens were revisions (format 1): the same fields
    /// without the revision, whose tokens were log indexes. The revision starts at the last
    /// applied index, above every token that state issued.
    pub fn from_legacy_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let old: LegacyStateMachine = bincode::deserialize(bytes)?;
        Ok(StateMachine {
            now: old.now,
            last_index: old.last_index,
            revision: old.last_index,
            locks: old.locks,
            waiters: old.waiters,
            sessions: old.sessions,
            clients: old.clients,
            deadlines: old.deadlines,
            dirty: BTreeSet::new(),
            kv: old.kv,
            etcd: EtcdStore::default(),
            etcd_quota: Quota::default(),
            etcd_locks: EtcdLocks::default(),
            session_owners: Default::default(),
            cluster_alarm: None,
            request_digests: Default::default(),
        })
    }

    /// Apply the entry at `index`: its requests in order, each one command taking the next
    /// revision ([`StateMachine::apply_request`]). One response per request.
    pub fn apply_batch(&mut self, index: Index, batch: &Batch) -> AppliedBatch {
        self.last_index = self.last_index.max(index);
        let mut events = Vec::new();
        let responses = batch
            .requests
            .iter()
            .map(|req| {
                if batch.semantics.index_tokens() {
                    self.apply_legacy(index, req, &mut events)
                } else {
                    self.apply_request(req, batch.semantics, &mut events)
                }
            })
            .collect();
        AppliedBatch { responses, events }
    }

    /// Apply the entry at `index` as a no-op, because the operator quarantined it (`fenced
    /// debug quarantine`: its apply hung or panicked on every replica). A pure function of
    /// the index and the batch, so every member that quarantined the index applies the same
    /// replacement: the index is recorded as applied; time, the revision, locks, sessions,
    /// deadlines and the keyspaces do not change; each request is answered
    /// [`CoreError::Quarantined`], and a request with an id that was not seen before has
    /// that answer stored in the dedup table, so a retry learns it instead of running the
    /// command again (a request seen before gets its first outcome, as in
    /// [`apply_batch`](Self::apply_batch)). Nothing of the batch's commands is looked at.
    pub fn apply_quarantined(&mut self, index: Index, batch: &Batch) -> AppliedBatch {
        self.last_index = self.last_index.max(index);
        let rejected = Response::Rejected(CoreError::Quarantined { index });
        let responses = batch
            .requests
            .iter()
            .map(|req| match req.client {
                None => rejected.clone(),
                Some(rid) => match self.dedup_lookup(rid) {
                    Some(previous) => previous,
                    None => {
                        self.dedup_store(rid, rejected.clone());
                        rejected.clone()
                    }
                },
            })
            .collect();
        AppliedBatch {
            responses,
            events: Vec::new(),
        }
    }

    /// Apply one request as the only command of the entry at `index` (tests and tools; the
    /// log carries [`Batch`]es).
    pub fn apply(&mut self, index: Index, req: &Request) -> Applied {
        let mut out = self.apply_batch(index, &Batch::one(req.clone()));
        Applied {
            response: out.responses.pop().unwrap_or(Response::Ticked),
            events: out.events,
        }
    }

    /// One command. Time first advances to the request's time; if a deadline has passed, the
    /// expiry step takes a revision of its own: whatever is due expires and freed locks pass
    /// to their waiters (tokens of that revision). Then, unless its request id was seen
    /// before (the first outcome is returned again, and nothing happens), the command takes
    /// the next revision, runs, and locks it freed pass to their waiters at that revision.
    fn apply_request(
        &mut self,
        req: &Request,
        semantics: Semantics,
        events: &mut Vec<Event>,
    ) -> Response {
        // Under ALARM_HOLDS_LEASES the replicated clock stands still while the cluster's
        // CORRUPT alarm is raised (nothing expires: no client can keep alive), and the
        // disarm moves every deadline by the time it held them (`hold_deadlines`).
        let held = semantics.alarm_holds_leases() && self.cluster_alarm.is_some();
        if !held {
            self.now = self.now.max(req.time_ms);
        }
        if !held && self.next_deadline().is_some_and(|t| t <= self.now) {
            self.revision += 1;
            self.expire_due(semantics, events);
            self.kv.expire_due(self.now);
            self.hand_over(self.revision, events);
        }
        // Under REQUEST_DIGESTS, a request id is bound to its command's digest.
        let digest = match req.client {
            Some(_) if semantics.request_digests() => Some(dedup::command_digest(&req.cmd)),
            _ => None,
        };
        if let Some(previous) = req
            .client
            .and_then(|rid| self.dedup_lookup_for(rid, digest))
        {
            return previous;
        }
        self.revision += 1;
        if semantics.keyspace_locks() && !self.etcd_locks.is_empty() {
            self.migrate_etcd_locks(events);
        }
        let response = self.execute(req.client, &req.cmd, semantics, events);
        if held && self.cluster_alarm.is_none() {
            self.hold_deadlines(req.time_ms.saturating_sub(self.now));
            self.now = self.now.max(req.time_ms);
        }
        if let Some(rid) = req.client {
            self.dedup_store(rid, response.clone());
            if let Some(d) = digest {
                self.dedup_note_digest(rid, d);
            }
        }
        self.hand_over(self.revision, events);
        if semantics.etcd() {
            self.etcd_compaction_step();
        }
        response
    }

    /// An entry written before revisions ([`Semantics::INDEX_TOKENS`]), applied exactly as then:
    /// one revision for the expiry, the command and the hand-over, equal to the log index
    /// (or the next revision, should the revision already have passed it).
    fn apply_legacy(&mut self, index: Index, req: &Request, events: &mut Vec<Event>) -> Response {
        self.revision = if index > self.revision {
            index
        } else {
            self.revision + 1
        };
        self.now = self.now.max(req.time_ms);
        self.expire_due(Semantics::INDEX_TOKENS, events);
        self.kv.expire_due(self.now);
        let response = match req.client {
            None => self.execute(None, &req.cmd, Semantics::INDEX_TOKENS, events),
            Some(rid) => match self.dedup_lookup(rid) {
                Some(previous) => previous,
                None => {
                    let response =
                        self.execute(Some(rid), &req.cmd, Semantics::INDEX_TOKENS, events);
                    self.dedup_store(rid, response.clone());
                    response
                }
            },
        };
        self.hand_over(self.revision, events);
        response
    }

    // -----------------------------------------------------------------------------------
    // Commands

    /// Run `cmd` at the current revision, by the rules of `semantics` (the entry's).
    fn execute(
        &mut self,
        rid: Option<RequestId>,
        cmd: &Command,
        semantics: Semantics,
        events: &mut Vec<Event>,
    ) -> Response {
        let revision = self.revision;
        let result = match cmd {
            Command::Acquire {
                name,
                owner,
                ttl_ms,
                session,
                wait_ms,
            } => self.acquire(
                revision,
                rid,
                &AcquireSpec {
                    names: vec![name.clone()],
                    owner: owner.clone(),
                    mode: Mode::Exclusive,
                    ttl_ms: *ttl_ms,
                    session: *session,
                    wait_ms: *wait_ms,
                    lock_delay_ms: 0,
                },
            ),
            Command::AcquireWith(spec) => self.acquire(revision, rid, spec),
            Command::Release { name, owner, token } => {
                Ok(self.release(std::slice::from_ref(name), owner, *token, events))
            }
            Command::ReleaseAll {
                names,
                owner,
                token,
            } => Ok(self.release(names, owner, *token, events)),
            Command::ForceUnlock { name } => Ok(self.force_unlock(name, events)),
            Command::Renew {
                name,
                owner,
                token,
                ttl_ms,
            } => self.renew(name, owner, *token, *ttl_ms),
            Command::OpenSession { ttl_ms } => {
                let id = self.session_id_for(revision, semantics);
                self.open_session(id, *ttl_ms)
            }
            Command::KeepAlive { session } => Ok(self.keep_alive(*session)),
            Command::CloseSession { session } => {
                Ok(self.close_session(*session, ReleaseReason::SessionClosed, semantics, events))
            }
            Command::OpenLease { .. } | Command::KeepAliveMany { .. } if !semantics.leases() => {
                Err(crate::gate::refused_by_entry(cmd, semantics).unwrap_or(
                    CoreError::NotUpgraded {
                        needs: Semantics::LEASES.0,
                        detail: "a lease command in an older entry".into(),
                    },
                ))
            }
            Command::OpenLease { ttl_ms } => self.open_lease_at(revision, *ttl_ms, semantics),
            Command::GrantLease { .. } if !semantics.chosen_leases() => Err(
                crate::gate::refused_by_entry(cmd, semantics).unwrap_or(CoreError::NotUpgraded {
                    needs: Semantics::CHOSEN_LEASES.0,
                    detail: "a lease with a chosen id in an older entry".into(),
                }),
            ),
            Command::GrantLease { id, ttl_ms } => self.grant_lease(*id, *ttl_ms),
            Command::EtcdLock { .. } | Command::EtcdUnlock { .. } | Command::EtcdCancel { .. }
                if !semantics.elections() =>
            {
                Err(crate::gate::refused_by_entry(cmd, semantics).unwrap_or(
                    CoreError::NotUpgraded {
                        needs: Semantics::ELECTIONS.0,
                        detail: "an etcd lock command in an older entry".into(),
                    },
                ))
            }
            Command::EtcdLock { .. } | Command::EtcdUnlock { .. } | Command::EtcdCancel { .. }
                if semantics.keyspace_locks() =>
            {
                Err(CoreError::Retired {
                    since: Semantics::KEYSPACE_LOCKS.0,
                    detail: format!(
                        "{} of the lock table: etcd's locks and elections are on the keyspace",
                        cmd.kind()
                    ),
                })
            }
            Command::EtcdLock { name, lease, value } => {
                self.etcd_lock(revision, rid, name, *lease, value, events)
            }
            Command::EtcdUnlock { name, lease, token } => {
                Ok(self.etcd_unlock(name, *lease, *token, events))
            }
            Command::EtcdCancel {
                name,
                lease,
                request,
            } => Ok(self.etcd_cancel(name, *lease, *request, events)),
            Command::KeepAliveMany { sessions } => Ok(self.keep_alive_many(sessions)),
            Command::Withdraw { .. } if !semantics.withdrawals() => Err(
                crate::gate::refused_by_entry(cmd, semantics).unwrap_or(CoreError::NotUpgraded {
                    needs: Semantics::WITHDRAWALS.0,
                    detail: "a withdrawal in an older entry".into(),
                }),
            ),
            Command::Withdraw {
                request,
                names,
                owner,
                grant,
            } => Ok(self.withdraw(*request, names, owner, *grant, events)),
            Command::AsUser { .. } if !semantics.session_owners() => Err(
                crate::gate::refused_by_entry(cmd, semantics).unwrap_or(CoreError::NotUpgraded {
                    needs: Semantics::SESSION_OWNERS.0,
                    detail: "a user's command in an older entry".into(),
                }),
            ),
            Command::AsUser { user, admin, cmd } => {
                Ok(self.as_user(rid, user, *admin, cmd, semantics, events))
            }
            Command::ClusterAlarm { .. } if !semantics.cluster_alarm() => Err(
                crate::gate::refused_by_entry(cmd, semantics).unwrap_or(CoreError::NotUpgraded {
                    needs: Semantics::CLUSTER_ALARM.0,
                    detail: "a cluster alarm in an older entry".into(),
                }),
            ),
            Command::ClusterAlarm { raise } => {
                let before = self.cluster_alarm.clone();
                match raise {
                    Some(a) if before.is_none() => self.cluster_alarm = Some(a.clone()),
                    Some(_) => {}
                    None => self.cluster_alarm = None,
                }
                Ok(Response::ClusterAlarm {
                    before,
                    after: self.cluster_alarm.clone(),
                })
            }
            Command::Tick => Ok(Response::Ticked),
            Command::Kv(cmd) => {
                // A pipeline (`KvCommand::Batch`) takes one more revision per command after
                // its first, except in an entry from before revisions.
                let mut rev = revision;
                let mut kv_events = Vec::new();
                let reply = self
                    .kv
                    .apply(&mut rev, semantics, self.now, cmd, &mut kv_events);
                events.extend(kv_events.into_iter().map(Event::Kv));
                self.revision = rev;
                Ok(Response::Kv(reply))
            }
            Command::FencedPut { key, value, token } => {
                match self.kv.fence_set(revision, key, value, *token) {
                    Ok(()) => Ok(Response::Fenced {
                        accepted: true,
                        highest: *token,
                    }),
                    Err(FenceError::Stale(Stale { highest, .. })) => Ok(Response::Fenced {
                        accepted: false,
                        highest,
                    }),
                    Err(FenceError::TooLarge) => Err(CoreError::ValueTooLarge {
                        len: value.len(),
                        max: MAX_VALUE_LEN,
                    }),
                }
            }
            Command::Limit {
                key,
                policy,
                quantity,
                mode,
            } => self
                .kv
                .limit(revision, self.now, key, policy, *quantity, *mode)
                .map(Response::Limited)
                .map_err(CoreError::Limit),
            Command::Etcd(etcd) => match crate::gate::refused_by_entry(cmd, semantics) {
                Some(refused) => Err(refused),
                None => self
                    .apply_etcd(revision, etcd, semantics, events)
                    .map_err(CoreError::Etcd),
            },
        };
        result.unwrap_or_else(Response::Rejected)
    }
}
