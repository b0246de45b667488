//! Preparing a state machine for a new cluster made from it: `fenced snapshot restore` and
//! `fenced serve --force-new-cluster`.
//!
//! The old cluster may have gone on granting after the state was taken (a backup is older
//! than the cluster's end; a lone survivor of a lost quorum may lack entries a majority
//! acknowledged). Its tokens, session ids and revisions past this state are unknown, and the
//! new cluster must never issue one of them again. So:
//! * the revision jumps by `bump` (etcdutl's `--bump-revision`): the new cluster's first
//!   token is above every token the old one issued, unless it applied more than `bump`
//!   commands after the state was taken;
//! * every lock, waiter and session is dropped: the grants of the state may have been
//!   released since, and grants made since are unknown, so no holder's lease is honoured
//!   across the restore. Holders learn it at their next keep-alive (the session is unknown),
//!   and any write they still make carries a token below every new one, which fenced
//!   storage rejects once a new holder has written;
//! * the request dedup table is dropped (its clients' later requests are unknown too);
//! * the keyspace stays as it was: values, expiry times (in log time) and every key's fence
//!   mark (`FENCE.SET`'s highest token);
//! * the etcd keyspace keeps its live keys, and its history is compacted at the bumped
//!   revision (`etcdutl snapshot restore --mark-compacted`): a watch or a read at an older
//!   revision gets "required revision has been compacted" and starts over from the current
//!   state, instead of resuming across revisions the old cluster may have used differently.
//!   (Done at once, not in steps: a restore is offline.) Keys attached to a lease (a
//!   session) are deleted at the bumped revision first, since their sessions are dropped.

use super::StateMachine;
use crate::Revision;

/// What [`StateMachine::prepare_restore`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub revision_before: Revision,
    pub revision_after: Revision,
    pub locks_dropped: usize,
    pub sessions_dropped: usize,
    pub waiters_dropped: usize,
    /// Keys kept (live ones, at the state's log time).
    pub keys: usize,
    /// Live etcd keys kept.
    pub etcd_keys: usize,
    /// The etcd keyspace's compact revision after the restore (0: it was never touched, and
    /// stays so).
    pub etcd_compact_revision: Revision,
}

/// Why a state cannot be restored.
#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum RestoreError {
    #[error("revision {revision} + bump {bump} does not fit in 64 bits; choose a smaller bump")]
    Overflow { revision: Revision, bump: Revision },
}

impl StateMachine {
    /// Make this state the start of a new cluster (see the module docs). Pure; the new log
    /// starts again at index 0.
    pub fn prepare_restore(&mut self, bump: Revision) -> Result<Restored, RestoreError> {
        let revision_before = self.revision;
        let revision_after = revision_before
            .checked_add(bump)
            .ok_or(RestoreError::Overflow {
                revision: revision_before,
                bump,
            })?;
        let out = Restored {
            revision_before,
            revision_after,
            locks_dropped: self.locks.len(),
            sessions_dropped: self.sessions.len(),
            waiters_dropped: self.waiters.len(),
            keys: self.kv.len(self.now),
            etcd_keys: 0,
            etcd_compact_revision: 0,
        };
        let mut out = out;
        // Every session is dropped, so every key attached to one goes (at the new revision,
        // which the compaction below then marks compacted).
        for lease in self.etcd.attached_leases() {
            let _ = self.etcd.delete_lease_keys(lease, revision_after);
        }
        out.etcd_keys = self.etcd.key_count();
        self.revision = revision_after;
        self.last_index = 0;
        self.locks.clear();
        self.waiters.clear();
        self.sessions.clear();
        self.etcd_locks = Default::default();
        self.session_owners.clear();
        self.clients.clear();
        self.request_digests.clear();
        // Every deadline belongs to a lease, session, wait, lock-delay or dedup record.
        self.deadlines.clear();
        self.dirty.clear();
        // Mark the etcd history compacted at the new revision. Refused only when the
        // compact revision is there already (a restore with a bump of 0 of a state restored
        // before, nothing written since): nothing to do then.
        if !self.etcd.is_untouched() {
            let _ = self.etcd.begin_compact(revision_after, revision_after);
            self.etcd.compact_step(usize::MAX);
            out.etcd_compact_revision = self.etcd.compact_revision();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::*;

    fn acquire(sm: &mut StateMachine, index: u64, name: &str, owner: &str) -> u64 {
        let req = Request {
            client: None,
            time_ms: 1_000 + index,
            cmd: Command::Acquire {
                name: name.into(),
                owner: owner.into(),
                ttl_ms: 60_000,
                session: None,
                wait_ms: 0,
            },
        };
        match sm.apply(index, &req).response {
            Response::Granted { token, .. } => token,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[test]
    fn restore_bumps_the_revision_frees_every_lock_and_keeps_the_keyspace() {
        let mut sm = StateMachine::new();
        let t1 = acquire(&mut sm, 1, "a", "x");
        let set = Request {
            client: None,
            time_ms: 1_010,
            cmd: Command::FencedPut {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                token: t1,
            },
        };
        sm.apply(2, &set);
        let before = sm.revision();
        let r = sm.prepare_restore(1_000).expect("fits");
        assert_eq!(r.revision_before, before);
        assert_eq!(r.revision_after, before + 1_000);
        assert_eq!((r.locks_dropped, r.keys), (1, 1));
        assert_eq!(sm.lock_count(), 0);
        assert_eq!(sm.kv().fence(b"k"), t1, "fence marks survive");
        sm.check_invariants().expect("consistent");
        // The lock is free, and its next token is above everything before the restore.
        let t2 = acquire(&mut sm, 1, "a", "y");
        assert!(t2 > before + 1_000, "{t2} after a restore from {before}");
    }

    #[test]
    fn a_bump_past_u64_is_refused_and_changes_nothing() {
        let mut sm = StateMachine::new();
        acquire(&mut sm, 1, "a", "x");
        let copy = sm.clone();
        assert!(matches!(
            sm.prepare_restore(u64::MAX),
            Err(RestoreError::Overflow { .. })
        ));
        assert_eq!(sm, copy);
    }
}
