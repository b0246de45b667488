//! etcd's space quota (`--quota-backend-bytes`) and its `NOSPACE` alarm, as replicated state.
//!
//! etcd judges its quota per member, at apply, against its own flag and file size, and raises
//! the alarm through a logged request. fenced keeps both the quota and the alarm in the
//! replicated state instead, so every replica refuses exactly the same writes:
//! * the quota is set by a logged command ([`crate::EtcdCommand::Quota`]) that the leader
//!   proposes when its own `--quota-backend-bytes` differs from the replicated one (until
//!   then, etcd's default [`DEFAULT_QUOTA_BYTES`]);
//! * a `Put`, or a `Txn` that may put, whose [cost](put_cost) would take the stored history
//!   ([`super::EtcdStore::history_bytes`]) above the quota is refused with
//!   [`super::EtcdError::NoSpace`] and raises the alarm, in the same command;
//! * while the alarm is raised, every `Put` and every `Txn` that may put is refused; ranges,
//!   deletes and compactions are served (etcd's "capped" applier);
//! * the alarm is cleared by a logged command ([`crate::EtcdCommand::Alarm`], etcd's
//!   `Maintenance.Alarm` DEACTIVATE): after a compaction has freed space, else the next write
//!   over the quota raises it again.
//!
//! All of it only in entries stamped [`crate::Semantics::QUOTA`] or newer: an older entry
//! replays as it applied.

use serde::{Deserialize, Serialize};

use super::{PutRequest, RequestOp, TxnRequest, VERSION_OVERHEAD};

/// etcd's default `--quota-backend-bytes`: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The quota and the alarm. Encoded (snapshot body version 3) as `{ bytes: u64, nospace:
/// bool }`; the default (no quota set, no alarm) is not written at all.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Quota {
    /// The quota set by [`crate::EtcdCommand::Quota`]; 0 = [`DEFAULT_QUOTA_BYTES`].
    pub bytes: u64,
    /// etcd's `NOSPACE` alarm is raised: writes that may put are refused.
    pub nospace: bool,
}

impl Quota {
    /// The quota in force, in bytes of stored history.
    pub fn limit(&self) -> u64 {
        effective(self.bytes)
    }

    /// Nothing set and no alarm: what a state that never saw a quota command has.
    pub fn is_default(&self) -> bool {
        *self == Quota::default()
    }

    /// A quota of `bytes` (0 or etcd's default are both stored as 0, the default).
    pub(crate) fn set(&mut self, bytes: u64) {
        self.bytes = if effective(bytes) == DEFAULT_QUOTA_BYTES {
            0
        } else {
            bytes
        };
    }
}

/// `--quota-backend-bytes` as enforced: 0 means etcd's default.
pub fn effective(bytes: u64) -> u64 {
    if bytes == 0 {
        DEFAULT_QUOTA_BYTES
    } else {
        bytes
    }
}

/// Bytes a put may add to the stored history (etcd's quota cost of a put: its key and value
/// plus the per-version overhead; a put with `ignore_value` counts its empty value, as
/// etcd's does).
pub fn put_cost(req: &PutRequest) -> u64 {
    (req.key.len() + req.value.len()) as u64 + VERSION_OVERHEAD
}

/// Bytes a txn may add (etcd's cost of a txn): the larger of its two branches, each the sum
/// of its puts (and of its nested txns' costs). Ranges and deletes cost nothing, so a txn of
/// those is served under the alarm.
pub fn txn_cost(req: &TxnRequest) -> u64 {
    let branch = |ops: &[RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => put_cost(p),
                RequestOp::Txn(t) => txn_cost(t),
                RequestOp::Range(_) | RequestOp::DeleteRange(_) => 0,
            })
            .fold(0u64, u64::saturating_add)
    };
    branch(&req.success).max(branch(&req.failure))
}
