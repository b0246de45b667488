//! Backup, restore and recovery (docs/operations.md, "Back up and restore"):
//! * [`snapshot_stream`] — the server side of `fenced snapshot save`: the applied state after
//!   a linearizable read barrier, streamed as a snapshot file while it is written;
//! * [`save`] — the client side: the stream into a file, checked before it is kept;
//! * [`restore`] — a new data dir of a new cluster from a snapshot file;
//! * [`force_new_cluster`] — a one-node cluster from a surviving member's data dir after a
//!   lost quorum.
//!
//! A restored state's revision jumps by [`RestoreOptions::bump_revision`] and its locks,
//! waiters and sessions are dropped ([`fenced_core::StateMachine::prepare_restore`]): tokens
//! the old cluster granted after the state was taken are never issued again.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use fenced_client::{Client, ClientError};
use fenced_core::machine::{RestoreError, Restored};
use fenced_core::StateMachine;
use fenced_proto::v1 as pb;
use fenced_raft_types::identity::MemberState;
use fenced_raft_types::NodeId;
use fenced_storage::{datadir, restore as store_restore, snapshot, StoreError};
use openraft::{BasicNode, SnapshotMeta};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tonic::Status;

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Default `--bump-revision`: 10^12. The new cluster's tokens start above every token the
/// old cluster issued unless it applied more than 10^12 commands after the state was taken
/// (over 3 years at 10,000 writes/s); tokens stay far below 2^53 (exact in a JavaScript
/// number) for thousands of restores.
pub const DEFAULT_BUMP_REVISION: u64 = 1_000_000_000_000;

/// Size of the pieces a snapshot is streamed in.
const CHUNK: usize = 256 * 1024;

#[derive(thiserror::Error, Debug)]
pub enum BackupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("the snapshot stream broke off: {0}")]
    Stream(Status),
    #[error("{0}")]
    Invalid(String),
}

fn file_err(path: &Path) -> impl FnOnce(io::Error) -> BackupError + '_ {
    move |source| BackupError::File {
        path: path.to_owned(),
        source,
    }
}

/// What a snapshot file holds (`fenced snapshot status`, and what save and restore print).
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotInfo {
    pub bytes: u64,
    pub sha256: String,
    pub snapshot_id: String,
    /// The last log index the state includes (0 if none).
    pub last_index: u64,
    pub revision: u64,
    pub locks: usize,
    pub sessions: usize,
    pub keys: usize,
    /// Log time of the state (ms since the Unix epoch, by the leader's clock).
    pub log_time_ms: u64,
}

/// A writer that sends what it is given through `tx` in pieces of [`CHUNK`] bytes; fails
/// once the receiver is gone (the client went away). For a blocking thread.
struct ChunkWriter {
    tx: mpsc::Sender<Result<pb::SnapshotChunk, Status>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(pb::SnapshotChunk { data }))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// The pieces of a snapshot file of `meta` and `machine`, written on a blocking thread as
/// the receiver takes them (at most a few pieces in memory). An error ends the stream.
pub fn snapshot_stream(
    meta: Meta,
    machine: StateMachine,
) -> mpsc::Receiver<Result<pb::SnapshotChunk, Status>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut w = ChunkWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        match snapshot::write_to(&mut w, &meta, &machine) {
            Ok(()) => tracing::info!(
                id = %meta.snapshot_id,
                revision = machine.revision(),
                ms = started.elapsed().as_millis() as u64,
                "snapshot sent"
            ),
            Err(e) => {
                tracing::warn!(id = %meta.snapshot_id, "snapshot not sent: {e}");
                let _ = tx.blocking_send(Err(Status::internal(format!("snapshot: {e}"))));
            }
        }
    });
    rx
}

fn sha256_of(path: &Path) -> Result<(u64, String), BackupError> {
    let mut f = std::fs::File::open(path).map_err(file_err(path))?;
    let mut h = Sha256::new();
    let bytes = io::copy(&mut f, &mut h).map_err(file_err(path))?;
    Ok((bytes, hex(&h.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check the snapshot file at `path` (checksum, format version, decoding) and describe it.
/// Blocking.
pub fn inspect(path: &Path) -> Result<(SnapshotInfo, Meta, StateMachine), BackupError> {
    let (meta, machine) = store_restore::read_file(path)?;
    let (bytes, sha256) = sha256_of(path)?;
    let info = SnapshotInfo {
        bytes,
        sha256,
        snapshot_id: meta.snapshot_id.clone(),
        last_index: meta.last_log_id.map_or(0, |l| l.index),
        revision: machine.revision(),
        locks: machine.lock_count(),
        sessions: machine.session_count(),
        keys: machine.kv().len(machine.now()),
        log_time_ms: machine.now(),
    };
    Ok((info, meta, machine))
}

/// `fenced snapshot save FILE`: stream a backup from the cluster into `file` (through
/// `FILE.part`, synced, checked, then renamed). An existing `file` is not overwritten.
pub async fn save(client: &Client, file: &Path) -> Result<SnapshotInfo, BackupError> {
    if file.exists() {
        return Err(BackupError::Invalid(format!(
            "{} exists; fenced snapshot save does not overwrite a file",
            file.display()
        )));
    }
    let mut part = file.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let result = async {
        let mut stream = client.snapshot_save().await?;
        let mut out = std::fs::File::create(&part).map_err(file_err(&part))?;
        while let Some(chunk) = stream.message().await.map_err(BackupError::Stream)? {
            out.write_all(&chunk.data).map_err(file_err(&part))?;
        }
        out.sync_all().map_err(file_err(&part))?;
        drop(out);
        let checked = part.clone();
        let info = tokio::task::spawn_blocking(move || inspect(&checked).map(|(i, _, _)| i))
            .await
            .map_err(|e| BackupError::Invalid(e.to_string()))??;
        std::fs::rename(&part, file).map_err(file_err(file))?;
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(file_err(dir))?;
        }
        Ok(info)
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

/// `fenced snapshot restore`'s options (the flags).
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub snapshot: PathBuf,
    pub data_dir: PathBuf,
    pub member_id: NodeId,
    /// Every member of the new cluster (the same on every member's restore).
    pub members: BTreeMap<NodeId, String>,
    pub cluster_token: String,
    pub bump_revision: u64,
}

/// What a restore did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestoreReport {
    pub data_dir: PathBuf,
    pub member_id: NodeId,
    pub cluster_id: u64,
    pub snapshot_sha256: String,
    pub revision_before: u64,
    pub revision_after: u64,
    pub locks_dropped: usize,
    pub sessions_dropped: usize,
    pub waiters_dropped: usize,
    pub keys: usize,
    /// Live etcd keys kept.
    pub etcd_keys: usize,
    /// The etcd history is marked compacted at this revision (the new one; 0 if the state
    /// never had etcd keys).
    pub etcd_compact_revision: u64,
}

fn report(
    dir: &Path,
    member_id: NodeId,
    cluster_id: u64,
    sha: String,
    r: Restored,
) -> RestoreReport {
    RestoreReport {
        data_dir: dir.to_owned(),
        member_id,
        cluster_id,
        snapshot_sha256: sha,
        revision_before: r.revision_before,
        revision_after: r.revision_after,
        locks_dropped: r.locks_dropped,
        sessions_dropped: r.sessions_dropped,
        waiters_dropped: r.waiters_dropped,
        keys: r.keys,
        etcd_keys: r.etcd_keys,
        etcd_compact_revision: r.etcd_compact_revision,
    }
}

fn check_members(members: &BTreeMap<NodeId, String>, id: NodeId) -> Result<(), BackupError> {
    if !members.contains_key(&id) {
        return Err(BackupError::Invalid(format!(
            "--initial-cluster does not list --id {id}"
        )));
    }
    Ok(())
}

/// `fenced snapshot restore`: a new data dir for member `member_id` of a new cluster, from a
/// checked snapshot file. Run it for every member with the same file and flags (but `--id`
/// and `--data-dir`), then start each with `fenced serve` and the same `--initial-cluster`.
/// Nothing is created if anything is wrong. Blocking.
pub fn restore(opts: &RestoreOptions) -> Result<RestoreReport, BackupError> {
    restore_on(&fenced_storage::Env::default(), opts)
}

/// [`restore`], the new data dir made on `env`'s file system and opened with its I/O (the
/// backup file is read from the real one).
pub fn restore_on(
    env: &fenced_storage::Env,
    opts: &RestoreOptions,
) -> Result<RestoreReport, BackupError> {
    check_members(&opts.members, opts.member_id)?;
    let (info, _meta, mut machine) = inspect(&opts.snapshot)?;
    let restored = machine.prepare_restore(opts.bump_revision)?;
    let cluster_id = datadir::restored_cluster_id(
        &opts.cluster_token,
        &opts.members,
        info.sha256.as_bytes(),
        opts.bump_revision,
        &machine,
    );
    store_restore::create_dir_on(
        env,
        &opts.data_dir,
        cluster_id,
        opts.member_id,
        &machine,
        format!("restored-{}", &info.sha256[..16]),
    )?;
    Ok(report(
        &opts.data_dir,
        opts.member_id,
        cluster_id,
        info.sha256,
        restored,
    ))
}

/// `fenced serve --force-new-cluster`: the data dir of member `member_id` becomes the only
/// member of a new cluster (at `addr`). Its whole state — snapshot and every log entry — is
/// taken ([`fenced_storage::restore::state_of_dir`]), prepared as for a restore, and written
/// as a new data dir; the old one is kept beside it, renamed to
/// `<data dir>.before-force-new-cluster-<unix ms>`. Returns that path and the report;
/// `None` if there is nothing to do: the data dir is already of a cluster of this member
/// alone (a restart that kept the flag), or was just made by a recovery and has not started
/// yet.
pub async fn force_new_cluster(
    env: &fenced_storage::Env,
    dir: &Path,
    member_id: NodeId,
    addr: &str,
    cluster_token: &str,
    bump_revision: u64,
) -> Result<Option<(PathBuf, RestoreReport)>, BackupError> {
    let identity = fenced_raft_types::identity::load_on(&*env.fs, dir)
        .map_err(|e| BackupError::Invalid(format!("{}: {e}", dir.display())))?
        .ok_or_else(|| {
            BackupError::Invalid(format!(
                "{} holds no member's data: --force-new-cluster recovers a surviving \
                 member's data dir",
                dir.display()
            ))
        })?;
    match identity.state {
        MemberState::Bootstrapping => return Ok(None),
        MemberState::Retired { reason } => {
            return Err(BackupError::Invalid(format!(
                "{} belongs to a retired incarnation of member {member_id} ({reason}); it \
                 must not serve again, not even alone",
                dir.display()
            )))
        }
        MemberState::Ready => {}
    }
    let store_restore::DirState {
        last,
        members,
        mut machine,
    } = store_restore::state_of_dir_on(env, dir).await?;
    if members.len() == 1 && members.contains(&member_id) {
        return Ok(None);
    }
    let restored = machine.prepare_restore(bump_revision)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut aside = dir.as_os_str().to_owned();
    aside.push(format!(".before-force-new-cluster-{stamp}"));
    let aside = PathBuf::from(aside);
    // The salt: this member's last log id and the moment, so that two recoveries of the same
    // data dir never share a cluster id.
    let salt = format!("force-new-cluster {member_id} {last:?} {stamp}");
    let members = BTreeMap::from([(member_id, addr.to_owned())]);
    let cluster_id = datadir::restored_cluster_id(
        cluster_token,
        &members,
        salt.as_bytes(),
        bump_revision,
        &machine,
    );
    env.fs.rename(dir, &aside).map_err(file_err(dir))?;
    if let Err(e) = store_restore::create_dir_on(
        env,
        dir,
        cluster_id,
        member_id,
        &machine,
        format!("force-new-cluster-{stamp}"),
    ) {
        // Put the old data dir back: nothing changed.
        let _ = env.fs.rename(&aside, dir);
        return Err(e.into());
    }
    let sha = hex(&Sha256::digest(salt.as_bytes()));
    Ok(Some((
        aside,
        report(dir, member_id, cluster_id, sha, restored),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot file of a small state, in `dir`.
    fn backup_file(dir: &Path) -> PathBuf {
        let mut machine = StateMachine::new();
        machine.apply_batch(
            1,
            &fenced_core::Batch::one(fenced_core::Request {
                time_ms: 1_000,
                client: None,
                cmd: fenced_core::Command::Acquire {
                    name: "a".into(),
                    owner: "o".into(),
                    ttl_ms: 10_000,
                    session: None,
                    wait_ms: 0,
                },
            }),
        );
        let meta = Meta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "test".into(),
        };
        let path = dir.join("backup.snap");
        let file = std::fs::File::create(&path).expect("create");
        snapshot::write_to(file, &meta, &machine).expect("write");
        path
    }

    fn restore_with(dir: &Path, file: &Path, id: NodeId, bump: u64) -> RestoreReport {
        restore(&RestoreOptions {
            snapshot: file.to_owned(),
            data_dir: dir.join(format!("member-{id}-bump-{bump}")),
            member_id: id,
            members: (1..=3).map(|i| (i, format!("127.0.0.1:{i}"))).collect(),
            cluster_token: "fenced-cluster".into(),
            bump_revision: bump,
        })
        .expect("restore")
    }

    /// Members restored from one file with different `--bump-revision`s hold different states
    /// (their tokens differ for the same command): they must not form one cluster.
    #[test]
    fn members_restored_with_different_bumps_get_different_cluster_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = backup_file(dir.path());
        let one = restore_with(dir.path(), &file, 1, DEFAULT_BUMP_REVISION);
        let two = restore_with(dir.path(), &file, 2, DEFAULT_BUMP_REVISION);
        let three = restore_with(dir.path(), &file, 3, DEFAULT_BUMP_REVISION + 1);
        assert_eq!(
            one.cluster_id, two.cluster_id,
            "same file, same flags: one cluster"
        );
        assert_ne!(
            one.revision_after, three.revision_after,
            "the bumps differ, so do the states"
        );
        assert_ne!(
            one.cluster_id,
            three.cluster_id,
            "members restored with bumps {DEFAULT_BUMP_REVISION} and {} share cluster id {}",
            DEFAULT_BUMP_REVISION + 1,
            one.cluster_id
        );
    }

    /// `etcdutl snapshot restore --mark-compacted`: the etcd history of the restored state is
    /// compacted at the bumped revision; live keys stay.
    #[test]
    fn a_restore_marks_the_etcd_history_compacted_at_the_new_revision() {
        use fenced_core::etcd::PutRequest;
        use fenced_core::{Batch, Command, EtcdCommand, Request};
        let dir = tempfile::tempdir().expect("tempdir");
        let mut machine = StateMachine::new();
        for (i, v) in ["1", "2"].into_iter().enumerate() {
            machine.apply_batch(
                i as u64 + 1,
                &Batch::one(Request {
                    time_ms: 1_000,
                    client: None,
                    cmd: Command::Etcd(EtcdCommand::Put(PutRequest::new("k", v))),
                }),
            );
        }
        let meta = Meta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "etcd".into(),
        };
        let file = dir.path().join("etcd.snap");
        snapshot::write_to(
            std::fs::File::create(&file).expect("create"),
            &meta,
            &machine,
        )
        .expect("write");
        let r = restore_with(dir.path(), &file, 1, 1_000);
        assert_eq!((r.revision_before, r.revision_after), (2, 1_002));
        assert_eq!(r.etcd_keys, 1);
        assert_eq!(r.etcd_compact_revision, 1_002);
    }
}
