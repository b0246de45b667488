//! The etcd v3 keyspace inside the state machine: its commands ([`Command::Etcd`]) and the
//! reads the read path serves on a state clone.
//!
//! # Revisions
//! An etcd command is a command like any other: it takes the next store revision whether it
//! writes, writes nothing (a delete that matched no key, a txn whose branch only read, a
//! compaction) or is refused — as a refused lock request or a `Tick` does today (every
//! applied command takes the next revision, design.md "Tokens"). Its writes carry that
//! revision, so an etcd key's `mod_revision` is a fencing token like any other. The etcd
//! keyspace therefore sees strictly increasing, non-contiguous revisions (module docs of
//! [`crate::etcd`]); `header.revision` of an answer is the command's revision (the store
//! revision after it), of a read the state's [`revision`](StateMachine::revision).
//!
//! # Compaction
//! A `Compact` moves the compact revision at once (reads and watches below it fail from
//! that command on) and removes up to [`COMPACT_STEP_BUDGET`] units of superseded history;
//! every later command applied under [`Semantics::ETCD`] removes another step while some
//! remains — at the same points on every replica, so apply never stalls on a large
//! compaction (~1 s per 800,000 versions at once).
//!
//! # Quota
//! Under [`Semantics::QUOTA`], a `Put` or a `Txn` that may put is judged against the
//! replicated quota before it runs ([`crate::etcd::Quota`]'s docs): refused with `NoSpace`,
//! raising the alarm, when its cost would take the stored history above the quota, and
//! refused while the alarm is raised. The quota itself is set, and the alarm raised or
//! cleared, by logged commands ([`EtcdCommand::Quota`], [`EtcdCommand::Alarm`]).

use super::StateMachine;
use crate::command::*;
use crate::etcd::{
    lease_session, put_cost, txn_cost, Bytes, EtcdError, EtcdStore, Events, KeyRange, LeaseId,
    Quota, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};

/// Work units of compaction done per command while a compaction is pending
/// ([`EtcdStore::compact_step`]): about 1–2 ms (release build).
pub const COMPACT_STEP_BUDGET: usize = 2_000;

/// Before [`Semantics::LEASES`]: a put naming a lease is refused as "requested lease not
/// found".
fn no_lease(_: LeaseId) -> bool {
    false
}

impl StateMachine {
    /// The etcd keyspace, for reads on a state clone.
    pub fn etcd(&self) -> &EtcdStore {
        &self.etcd
    }

    /// The etcd keyspace's space quota and `NOSPACE` alarm.
    pub fn etcd_quota(&self) -> Quota {
        self.etcd_quota
    }

    /// Run an etcd command at `revision` (the command's own), by the rules of `semantics`
    /// (the entry's). A write or a compaction adds [`Event::EtcdChanged`] to `events`, the
    /// watches' wake-up.
    pub(super) fn apply_etcd(
        &mut self,
        revision: Revision,
        cmd: &EtcdCommand,
        semantics: Semantics,
        events: &mut Vec<Event>,
    ) -> Result<Response, EtcdError> {
        let (wrote, reply) = match cmd {
            EtcdCommand::Put(req) => {
                if semantics.quota() {
                    self.check_space(put_cost(req))?;
                }
                let out = if semantics.leases() {
                    let sessions = &self.sessions;
                    let live =
                        |l: LeaseId| lease_session(l).is_some_and(|s| sessions.contains_key(&s));
                    self.etcd.put(req, revision, &live)?
                } else {
                    self.etcd.put(req, revision, &no_lease)?
                };
                (out.wrote, EtcdReply::Put(out.response))
            }
            EtcdCommand::DeleteRange(req) => {
                let out = self.etcd.delete_range(req, revision)?;
                (out.wrote, EtcdReply::DeleteRange(out.response))
            }
            EtcdCommand::Txn(req) => {
                if semantics.quota() {
                    self.check_space(txn_cost(req))?;
                }
                let out = if semantics.leases() {
                    let sessions = &self.sessions;
                    let live =
                        |l: LeaseId| lease_session(l).is_some_and(|s| sessions.contains_key(&s));
                    self.etcd.txn(req, revision, &live)?
                } else {
                    self.etcd.txn(req, revision, &no_lease)?
                };
                (out.wrote, EtcdReply::Txn(out.response))
            }
            EtcdCommand::Compact { revision: at } => {
                // The store revision before this command is the newest one can compact at.
                self.etcd.begin_compact(*at, revision - 1)?;
                let stats = self.etcd.compact_step(COMPACT_STEP_BUDGET);
                (false, EtcdReply::Compact(stats))
            }
            EtcdCommand::Quota { bytes } => {
                let before = self.etcd_quota;
                self.etcd_quota.set(*bytes);
                (
                    false,
                    EtcdReply::Quota {
                        before,
                        after: self.etcd_quota,
                    },
                )
            }
            EtcdCommand::Alarm { activate } => {
                let before = self.etcd_quota;
                self.etcd_quota.nospace = *activate;
                (
                    false,
                    EtcdReply::Quota {
                        before,
                        after: self.etcd_quota,
                    },
                )
            }
        };
        if wrote || matches!(cmd, EtcdCommand::Compact { .. }) {
            events.push(Event::EtcdChanged { revision });
        }
        Ok(Response::Etcd {
            revision,
            wrote,
            reply,
        })
    }

    /// Delete the etcd keys attached to session `id` (its lease ended) at the current
    /// revision, waking watches if there were any. Apply's revisions only grow, so this
    /// cannot be refused; should it be, nothing is deleted and the keys stay attached to a
    /// lease that no longer exists (replicas still agree).
    pub(super) fn delete_lease_keys(&mut self, id: SessionId, events: &mut Vec<Event>) {
        let Ok(lease) = LeaseId::try_from(id) else {
            return;
        };
        let revision = self.revision;
        if let Ok(n) = self.etcd.delete_lease_keys(lease, revision) {
            if n > 0 && !events.contains(&Event::EtcdChanged { revision }) {
                events.push(Event::EtcdChanged { revision });
            }
        }
    }

    /// The live etcd keys attached to lease (session) `id`, in key order.
    pub fn lease_keys(&self, id: SessionId) -> Vec<Bytes> {
        LeaseId::try_from(id)
            .map(|l| self.etcd.lease_keys(l).cloned().collect())
            .unwrap_or_default()
    }

    /// Every live session's id (every etcd lease), ascending.
    pub fn session_ids(&self) -> Vec<SessionId> {
        self.sessions.keys().copied().collect()
    }

    /// May a write that adds up to `cost` bytes to the stored history run? Not while the
    /// alarm is raised; not if it would take the history above the quota, which raises the
    /// alarm (a state change of this refused command, on every replica alike). A write that
    /// cannot put (`cost` 0: a txn of ranges and deletes) always may.
    fn check_space(&mut self, cost: u64) -> Result<(), EtcdError> {
        if cost == 0 {
            return Ok(());
        }
        if !self.etcd_quota.nospace
            && self.etcd.history_bytes().saturating_add(cost) <= self.etcd_quota.limit()
        {
            return Ok(());
        }
        self.etcd_quota.nospace = true;
        Err(EtcdError::NoSpace)
    }

    /// One step of a pending compaction (after each command of an [`Semantics::ETCD`]
    /// entry; module docs).
    pub(super) fn etcd_compaction_step(&mut self) {
        if self.etcd.compaction_pending() {
            self.etcd.compact_step(COMPACT_STEP_BUDGET);
        }
    }

    /// etcd's `Range` at this state (serve it on a clone of a committed state, as every read;
    /// `header.revision` = [`revision`](Self::revision)).
    pub fn etcd_range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.etcd.range(req, self.revision)
    }

    /// A read-only `Txn` ([`TxnRequest::is_read_only`]) at this state. The caller sends any
    /// other txn through the log: one that writes is answered here as if it had run, and
    /// nothing is kept.
    pub fn etcd_txn_read_only(&self, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.etcd.txn_read_only(req, self.revision)
    }

    /// The etcd keyspace's changes to `range` after revision `after`, for a watch catching up
    /// ([`EtcdStore::events_since`]).
    pub fn etcd_events_since(
        &self,
        after: Revision,
        range: &KeyRange,
        limit: usize,
        prev_kv: bool,
    ) -> Result<Events, EtcdError> {
        self.etcd.events_since(after, range, limit, prev_kv)
    }

    /// Where a synced watcher at `after` reads on from ([`EtcdStore::synced_position`]).
    pub fn etcd_synced_position(&self, after: Revision) -> Revision {
        self.etcd.synced_position(after)
    }
}
