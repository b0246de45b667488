//! New clusters from old state: the data dir of `fenced snapshot restore`, and the whole
//! state of a data dir for `fenced serve --force-new-cluster`.
//!
//! A restored data dir holds an identity in [`MemberState::Bootstrapping`] with the new
//! cluster's id, no Raft log and no vote, and a snapshot of the prepared state machine
//! ([`fenced_core::StateMachine::prepare_restore`]) that covers no log entry
//! (`last_log_id: None`). Its first start bootstraps Raft with the members it is given, like
//! a new cluster's member, and every member starts from the same state; the new log then
//! applies on top of it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_raft_types::identity::{self, Identity, MemberState};
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};
use openraft::{BasicNode, LogId, SnapshotMeta, StoredMembership};

use crate::snapshot::{self, SnapshotStore};
use crate::{Env, StoreError};

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Create the data dir `dir` of member `member_id` of the new cluster `cluster_id`, holding
/// `machine` (already prepared for the restore). `dir` must not exist, or be empty; it is
/// built under a temporary name beside it and renamed into place when complete, so a
/// failure leaves nothing behind. Blocking. On the real file system.
pub fn create_dir(
    dir: &Path,
    cluster_id: u64,
    member_id: NodeId,
    machine: &fenced_core::StateMachine,
    snapshot_id: String,
) -> Result<(), StoreError> {
    create_dir_on(
        &Env::default(),
        dir,
        cluster_id,
        member_id,
        machine,
        snapshot_id,
    )
}

/// [`create_dir`] on `env`'s file system; the check that the new dir reads back opens it
/// with `env`'s I/O.
pub fn create_dir_on(
    env: &Env,
    dir: &Path,
    cluster_id: u64,
    member_id: NodeId,
    machine: &fenced_core::StateMachine,
    snapshot_id: String,
) -> Result<(), StoreError> {
    let fs = &env.fs;
    match fs.read_dir(dir).map(|entries| entries.is_empty()) {
        Ok(false) => {
            return Err(StoreError::Refused(format!(
                "{} is not empty: a restore creates a new data dir and changes no existing one",
                dir.display()
            )))
        }
        Ok(true) => fs.remove_dir(dir).map_err(|e| StoreError::file(dir, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::file(dir, e)),
    }
    let name = dir
        .file_name()
        .ok_or_else(|| StoreError::Refused(format!("{} names no directory", dir.display())))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    crate::create_dir_all_durably(&**fs, &parent)?;
    // One restore into a dir at a time (the operator's); a leftover from an interrupted one
    // is removed first.
    let staging = parent.join(format!(".{}.restoring", name.to_string_lossy()));
    if fs.exists(&staging) {
        fs.remove_dir_all(&staging)
            .map_err(|e| StoreError::file(&staging, e))?;
    }
    fs.create_dir(&staging)
        .map_err(|e| StoreError::file(&staging, e))?;
    let result = fill(env, &staging, cluster_id, member_id, machine, snapshot_id)
        .and_then(|()| {
            fs.rename(&staging, dir)
                .map_err(|e| StoreError::file(dir, e))
        })
        .and_then(|()| crate::sync_dir(&**fs, &parent));
    if result.is_err() {
        let _ = fs.remove_dir_all(&staging);
    }
    result
}

fn fill(
    env: &Env,
    dir: &Path,
    cluster_id: u64,
    member_id: NodeId,
    machine: &fenced_core::StateMachine,
    snapshot_id: String,
) -> Result<(), StoreError> {
    let fs = &env.fs;
    identity::store_on(
        &**fs,
        dir,
        &Identity::new(cluster_id, member_id, MemberState::Bootstrapping),
    )?;
    let snapshots = SnapshotStore::open_on(fs, dir)?;
    let meta = Meta {
        last_log_id: None,
        last_membership: StoredMembership::default(),
        snapshot_id,
    };
    let path = snapshots.write(&meta, machine)?;
    snapshots.install(&path, &meta)?;
    // The rest of the store (an empty log, no vote), and a check that it reads back.
    let (log, state_machine) =
        crate::open_with(dir, Arc::new(|_: &[fenced_core::Event]| {}), env.clone())?;
    let back = state_machine.shared().read(|m| m.revision());
    if back != machine.revision() || log.holds_state() {
        return Err(StoreError::Damaged {
            path: dir.to_owned(),
            detail: format!(
                "the new data dir reads back revision {back}, not {}",
                machine.revision()
            ),
        });
    }
    crate::sync_dir(&**fs, dir)
}

/// The whole state of the data dir `dir` as far as its log reaches: its snapshot, then every
/// entry of its log applied on top — committed or not, as etcd's `--force-new-cluster` keeps
/// every entry of the survivor (an entry a majority acknowledged may be in its log without
/// this member having learnt that it committed). Returns the last log id applied. The
/// data dir is opened with every check of [`crate::open`] and not changed. On the real file
/// system.
pub async fn state_of_dir(dir: &Path) -> Result<DirState, StoreError> {
    state_of_dir_on(&Env::default(), dir).await
}

/// [`state_of_dir`] of `dir`, opened on `env`'s file system and I/O.
pub async fn state_of_dir_on(env: &Env, dir: &Path) -> Result<DirState, StoreError> {
    let (mut log, mut sm) =
        crate::open_with(dir, Arc::new(|_: &[fenced_core::Event]| {}), env.clone())?;
    let membership = match log.last_membership()? {
        Some(m) => m,
        None => sm.shared().membership().membership().clone(),
    };
    let members = membership.nodes().map(|(id, _)| *id).collect();
    let storage = |e: openraft::StorageError<NodeId>| StoreError::Damaged {
        path: dir.to_owned(),
        detail: e.to_string(),
    };
    let (mut applied, _) = sm.applied_state().await.map_err(storage)?;
    let last = RaftLogStorage::<TypeConfig>::get_log_state(&mut log)
        .await
        .map_err(storage)?
        .last_log_id;
    const STEP: u64 = 1024;
    let mut next = applied.map_or(0, |l| l.index + 1);
    let end = last.map_or(0, |l| l.index + 1);
    while next < end {
        let upto = (next + STEP).min(end);
        let entries = log.try_get_log_entries(next..upto).await.map_err(storage)?;
        if entries.len() as u64 != upto - next {
            return Err(StoreError::Damaged {
                path: dir.to_owned(),
                detail: format!(
                    "the log should hold entries {next}..{upto}, it returned {}",
                    entries.len()
                ),
            });
        }
        sm.apply(entries).await.map_err(storage)?;
        next = upto;
    }
    if let Some(l) = last {
        applied = applied.max(Some(l));
    }
    Ok(DirState {
        last: applied,
        members,
        machine: sm.shared().read(|m| m.clone()),
    })
}

/// What [`state_of_dir`] found.
pub struct DirState {
    /// The last log id applied.
    pub last: Option<LogId<NodeId>>,
    /// Every member (voter or learner) of the last membership in the data dir.
    pub members: BTreeSet<NodeId>,
    pub machine: fenced_core::StateMachine,
}

/// Check and decode a snapshot file made by `fenced snapshot save` (or a member's own
/// `snapshots/current.snap`) on the real file system (an offline tool's). Blocking.
pub fn read_file(path: &Path) -> Result<(Meta, fenced_core::StateMachine), StoreError> {
    snapshot::load(&fenced_fs::OsFs, path)
}
