//! The snapshot body: the encoding of a [`StateMachine`] inside a snapshot file, with a
//! version of its own (the file's record-format byte is shared with WAL records and meta
//! values, and does not move for this).
//!
//! * **Version 1**: the bincode encoding (fixed-width integers) of the struct's fields in
//!   their order — every snapshot written before the etcd keyspace.
//! * **Version 2**: version 1 followed by the etcd keyspace ([`EtcdStore`]'s encoding).
//! * **Version 3**: version 2 followed by the etcd keyspace's quota and alarm ([`Quota`]'s
//!   encoding), written only while they differ from the default (a quota was set, or the
//!   alarm raised: only by entries stamped [`Semantics::QUOTA`](crate::Semantics::QUOTA),
//!   i.e. once every member reads version 3).
//! * **Version 4**: version 3 followed by the grants and waits of etcd's `Lock` and
//!   `Election` (`EtcdLocks`' encoding), written only while there are some (made only by
//!   entries stamped [`Semantics::ELECTIONS`](crate::Semantics::ELECTIONS), i.e. once every
//!   member reads version 4). Version 4 always carries the quota, default or not.
//! * **Version 5**: version 4 followed by the owners of sessions (the user each was opened
//!   by, `session_owners`' encoding), written only while some session has one (recorded only
//!   by entries stamped [`Semantics::SESSION_OWNERS`](crate::Semantics::SESSION_OWNERS), i.e.
//!   once every member reads version 5). Version 5 always carries the quota and etcd's
//!   locks, empty or not.
//! * **Version 6**: version 5 followed by the cluster-wide `CORRUPT` alarm (an
//!   `Option<CorruptAlarm>`), written only while it is raised (only by entries stamped
//!   [`Semantics::CLUSTER_ALARM`](crate::Semantics::CLUSTER_ALARM), i.e. once every member
//!   reads version 6). Version 6 always carries the sessions' owners, empty or not.
//! * **Version 7**: version 6 followed by the digests of the dedup table's commands
//!   (`request_digests`' encoding), written only while some are kept (recorded only by
//!   entries stamped [`Semantics::REQUEST_DIGESTS`](crate::Semantics::REQUEST_DIGESTS), i.e.
//!   once every member reads version 7). Version 7 always carries the cluster alarm.
//!
//! A state whose etcd keyspace was never touched is written as version 1, byte for byte what
//! earlier builds wrote: a member that has not been upgraded yet can still install a
//! snapshot from an upgraded leader during a rolling upgrade, and the state digest of such a
//! state does not change with the upgrade (no false divergence alarm between old and new
//! members). The etcd keyspace can only be touched by entries stamped
//! [`Semantics::ETCD`](crate::Semantics::ETCD), i.e. once every member reads version 2, or
//! by a restore (a new cluster).

use std::io::{Read, Write};

use bincode::Options;

use super::etcd_locks::EtcdLocks;
use super::StateMachine;
use crate::etcd::{EtcdStore, Quota};
use crate::SnapshotError;

/// The newest snapshot body version this build reads and writes.
pub const BODY_VERSION: u32 = 7;

/// bincode as `bincode::serialize` and `bincode::deserialize` use it.
pub(super) fn options() -> impl Options + Clone {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
}

pub(super) fn from_bytes(bytes: &[u8]) -> Result<StateMachine, SnapshotError> {
    let mut r = bytes;
    let mut sm: StateMachine = options().deserialize_from(&mut r)?;
    if !r.is_empty() {
        sm.etcd = options().deserialize_from(&mut r)?;
    }
    if !r.is_empty() {
        sm.etcd_quota = options().deserialize_from(&mut r)?;
    }
    if !r.is_empty() {
        sm.etcd_locks = options().deserialize_from(&mut r)?;
    }
    if !r.is_empty() {
        sm.session_owners = options().deserialize_from(&mut r)?;
    }
    if !r.is_empty() {
        sm.cluster_alarm = options().deserialize_from(&mut r)?;
    }
    if !r.is_empty() {
        sm.request_digests = options().deserialize_from(&mut r)?;
    }
    Ok(sm)
}

impl StateMachine {
    /// The body version [`write_body`](Self::write_body) writes for this state: 7 while the
    /// dedup table keeps command digests, else 6 while the cluster's `CORRUPT` alarm is raised, else 5 while a
    /// session has an owner, 4 while etcd's Lock or Election holds or waits, else 3 once the etcd quota or alarm differs
    /// from the default, else 1 while the etcd keyspace is untouched, else 2 (module docs).
    pub fn body_version(&self) -> u32 {
        if !self.request_digests.is_empty() {
            7
        } else if self.cluster_alarm.is_some() {
            6
        } else if !self.session_owners.is_empty() {
            5
        } else if !self.etcd_locks.is_empty() {
            4
        } else if !self.etcd_quota.is_default() {
            3
        } else if self.etcd.is_untouched() {
            1
        } else {
            2
        }
    }

    /// Encode the state as a snapshot body of version [`body_version`](Self::body_version)
    /// into `w`, with bincode `opts` (fixed-width integers, as snapshot files use).
    pub fn write_body<O: Options + Clone>(
        &self,
        opts: O,
        mut w: impl Write,
    ) -> bincode::Result<()> {
        opts.clone().serialize_into(&mut w, self)?;
        let version = self.body_version();
        if version >= 2 {
            opts.clone().serialize_into(&mut w, &self.etcd)?;
        }
        if version >= 3 {
            opts.clone().serialize_into(&mut w, &self.etcd_quota)?;
        }
        if version >= 4 {
            opts.clone().serialize_into(&mut w, &self.etcd_locks)?;
        }
        if version >= 5 {
            opts.clone().serialize_into(&mut w, &self.session_owners)?;
        }
        if version >= 6 {
            opts.clone().serialize_into(&mut w, &self.cluster_alarm)?;
        }
        if version >= 7 {
            opts.serialize_into(&mut w, &self.request_digests)?;
        }
        Ok(())
    }

    /// Decode a snapshot body of `version` from `r` with bincode `opts` (the dispatch a
    /// snapshot file's reader calls; a version above [`BODY_VERSION`] is a decode error —
    /// the reader checks it first to say so).
    pub fn read_body<O: Options + Clone>(
        version: u32,
        opts: O,
        mut r: impl Read,
    ) -> Result<StateMachine, SnapshotError> {
        match version {
            1 => Ok(opts.deserialize_from(&mut r)?),
            2 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.deserialize_from::<_, EtcdStore>(&mut r)?;
                Ok(sm)
            }
            3 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.clone().deserialize_from::<_, EtcdStore>(&mut r)?;
                sm.etcd_quota = opts.deserialize_from::<_, Quota>(&mut r)?;
                Ok(sm)
            }
            4 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.clone().deserialize_from::<_, EtcdStore>(&mut r)?;
                sm.etcd_quota = opts.clone().deserialize_from::<_, Quota>(&mut r)?;
                sm.etcd_locks = opts.deserialize_from::<_, EtcdLocks>(&mut r)?;
                Ok(sm)
            }
            5 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.clone().deserialize_from::<_, EtcdStore>(&mut r)?;
                sm.etcd_quota = opts.clone().deserialize_from::<_, Quota>(&mut r)?;
                sm.etcd_locks = opts.clone().deserialize_from::<_, EtcdLocks>(&mut r)?;
                sm.session_owners = opts.deserialize_from(&mut r)?;
                Ok(sm)
            }
            6 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.clone().deserialize_from::<_, EtcdStore>(&mut r)?;
                sm.etcd_quota = opts.clone().deserialize_from::<_, Quota>(&mut r)?;
                sm.etcd_locks = opts.clone().deserialize_from::<_, EtcdLocks>(&mut r)?;
                sm.session_owners = opts.clone().deserialize_from(&mut r)?;
                sm.cluster_alarm = opts.deserialize_from(&mut r)?;
                Ok(sm)
            }
            7 => {
                let mut sm: StateMachine = opts.clone().deserialize_from(&mut r)?;
                sm.etcd = opts.clone().deserialize_from::<_, EtcdStore>(&mut r)?;
                sm.etcd_quota = opts.clone().deserialize_from::<_, Quota>(&mut r)?;
                sm.etcd_locks = opts.clone().deserialize_from::<_, EtcdLocks>(&mut r)?;
                sm.session_owners = opts.clone().deserialize_from(&mut r)?;
                sm.cluster_alarm = opts.clone().deserialize_from(&mut r)?;
                sm.request_digests = opts.deserialize_from(&mut r)?;
                Ok(sm)
            }
            found => Err(SnapshotError::Decode(Box::new(bincode::ErrorKind::Custom(
                format!(
                    "snapshot body version {found} is unknown to this build (it reads \
                     1..={BODY_VERSION})"
                ),
            )))),
        }
    }
}
