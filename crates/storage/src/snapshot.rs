//! State machine snapshots as files, written and read as streams.
//!
//! `<data dir>/snapshots/current.snap` is the snapshot of this member; a new one is written
//! to a temporary file in the same directory, fsynced, and renamed over it (then the
//! directory is fsynced), unless the current one is newer. A snapshot received from the
//! leader arrives in such a temporary file too, and is checked before it replaces anything.
//!
//! ```text
//! layout 1: "FNCDSNP\0" | 1: u32 LE | record format: u8 | meta length: u32 LE | meta | body
//!           | crc32 of everything before it: u32 LE
//! layout 2: "FNCDSNP\0" | 2: u32 LE | record format: u8 | body version: u32 LE
//!           | meta length: u32 LE | meta | body | crc32: u32 LE
//! ```
//! `meta` is the bincode `openraft::SnapshotMeta`, `body` the state machine's snapshot body
//! ([`fenced_core::StateMachine::write_body`]). The record-format byte is the one WAL records
//! and meta values share ([`frame::VERSION`]); the body has a version of its own, which layout
//! 1 does not name: it is body version 1 (the state before the etcd keyspace). A state whose
//! etcd keyspace was never touched has body version 1 and is written in layout 1, byte for
//! byte as before — so a member not yet upgraded can install it; any other is written in
//! layout 2 with its body version. [`load`] dispatches on both.
//!
//! The state is serialized straight into the file (no copy of it in memory), and a file is
//! read twice: once to check its checksum, then to decode — a damaged length inside can then
//! never make the decoder allocate more than the file holds. The same bytes are what
//! openraft streams to a follower that needs the snapshot (through
//! [`fenced_raft_types::SnapshotFile`], the `SnapshotData` of the type configuration).

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bincode::Options;
use fenced_fs::{Cursor, Fs, Mode};
use fenced_raft_types::{NodeId, SnapshotFile};
use openraft::{BasicNode, LogId, SnapshotMeta};

use crate::{frame, StoreError};

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Directory of the snapshots inside the data dir.
pub const DIR: &str = "snapshots";
const CURRENT: &str = "current.snap";
const MAGIC: &[u8; 8] = b"FNCDSNP\0";
/// Version of the file layout: 2 names the body version, 1 (still written for body version
/// 1) does not.
const LAYOUT: u32 = 2;
/// The layout without a body version.
const LAYOUT_1: u32 = 1;
/// The shortest header (layout 1).
const HEADER: usize = 8 + 4 + 1 + 4;

/// bincode with the options of `bincode::serialize` (fixed-width integers), bounded.
fn codec(limit: u64) -> impl Options + Clone {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit)
}

fn damaged(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Checksum {
        what: "state machine snapshot",
        detail: format!("{}: {}", path.display(), detail.into()),
    }
}

/// A writer that keeps the crc32 of what went through it.
struct Crc<W> {
    inner: W,
    hasher: crc32fast::Hasher,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The snapshot files of one data dir.
pub struct SnapshotStore {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    /// Held while the current snapshot is compared and replaced.
    replacing: Mutex<()>,
    next_tmp: AtomicU64,
    /// What the current snapshot covers, durably, and whether an install failed since
    /// ([`SnapshotStore::covering`]).
    covered: tokio::sync::watch::Sender<Covered>,
    /// Files a snapshot from the leader is being received into ([`SnapshotStore::receiving`]);
    /// one still there is an install that may come.
    received: Mutex<Vec<PathBuf>>,
}

/// What [`SnapshotStore::covering`] waits on.
#[derive(Clone, Debug, Default)]
struct Covered {
    /// The last log id the current snapshot covers, durably.
    upto: Option<LogId<NodeId>>,
    /// Why an install of a received snapshot failed, since the last one that succeeded.
    failed: Option<String>,
}

impl SnapshotStore {
    /// [`SnapshotStore::open_on`] on the real file system.
    pub fn open(data_dir: &Path) -> Result<SnapshotStore, StoreError> {
        SnapshotStore::open_on(&fenced_fs::os(), data_dir)
    }

    /// Open `<data_dir>/snapshots` on `fs` (created with the first snapshot), dropping
    /// temporary files of an earlier run.
    pub fn open_on(fs: &Arc<dyn Fs>, data_dir: &Path) -> Result<SnapshotStore, StoreError> {
        let dir = data_dir.join(DIR);
        let listing = match fs.read_dir(&dir) {
            Ok(l) => Some(l),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::file(&dir, e)),
        };
        if let Some(listing) = listing {
            for item in listing {
                let path = dir.join(&item.name);
                if path.extension().is_some_and(|e| e == "tmp") {
                    fs.remove_file(&path)
                        .map_err(|e| StoreError::file(&path, e))?;
                }
            }
            // The current snapshot's name may not be durable: a process whose install failed
            // on this directory's fsync left the rename in the cache only, and this one goes
            // on from it — purges the log it covers (found by fenced-sim, seed 1172 with
            // `--faults disk,flicker,…`: a power loss then took the rename back, and the
            // purged log had no snapshot covering it).
            crate::sync_dir(&**fs, &dir)?;
        }
        let store = SnapshotStore {
            fs: fs.clone(),
            dir,
            replacing: Mutex::new(()),
            next_tmp: AtomicU64::new(0),
            covered: tokio::sync::watch::Sender::new(Covered::default()),
            received: Mutex::new(Vec::new()),
        };
        if let Some((meta, _)) = store.current()? {
            store.covered.send_modify(|c| c.upto = meta.last_log_id);
        }
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file system the snapshots are on.
    pub fn fs(&self) -> &Arc<dyn Fs> {
        &self.fs
    }

    pub fn current_path(&self) -> PathBuf {
        self.dir.join(CURRENT)
    }

    /// A new temporary file name in the snapshot directory (created if missing): a counter of
    /// this store. (The process id was in it too, which made the names — and the simulator's
    /// trace, which shows them in errors — differ between runs of one seed; one data dir has
    /// one store, and every `*.tmp` of an earlier run is deleted when it opens.)
    fn tmp_path(&self) -> Result<PathBuf, StoreError> {
        crate::create_dir_all_durably(&*self.fs, &self.dir)?;
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        Ok(self.dir.join(format!("{n}.tmp")))
    }

    /// Write `meta` and `machine` into a new temporary file, synced; returns its path.
    /// Blocking (it writes the whole state).
    pub fn write(
        &self,
        meta: &Meta,
        machine: &fenced_core::StateMachine,
    ) -> Result<PathBuf, StoreError> {
        let path = self.tmp_path()?;
        write_file(&*self.fs, &path, meta, machine).map(|()| path)
    }

    /// Make the complete snapshot file at `path` (written by [`SnapshotStore::write`] or
    /// received) the current one, unless the current one is newer (then `path` is deleted).
    /// Durable on return.
    pub fn install(&self, path: &Path, meta: &Meta) -> Result<bool, StoreError> {
        let _one = self
            .replacing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.current_path();
        if self.fs.exists(&current) {
            let have = read_meta(&*self.fs, &current)?;
            if have.last_log_id > meta.last_log_id {
                self.fs
                    .remove_file(path)
                    .map_err(|e| StoreError::file(path, e))?;
                return Ok(false);
            }
        }
        self.fs
            .rename(path, &current)
            .map_err(|e| StoreError::file(path, e))?;
        crate::sync_dir(&*self.fs, &self.dir)?;
        self.covered.send_modify(|c| {
            c.upto = c.upto.max(meta.last_log_id);
            c.failed = None;
        });
        Ok(true)
    }

    /// An install of a received snapshot failed (Raft stops on the error): a purge waiting
    /// for it ([`SnapshotStore::covering`]) fails too.
    pub fn install_failed(&self, why: &impl std::fmt::Display) {
        self.covered
            .send_modify(|c| c.failed = Some(why.to_string()));
    }

    /// Wait until the current snapshot, durably installed, covers `log_id`; an error if the
    /// install of a received snapshot failed first. A log is purged only up to what a
    /// snapshot on disk covers: openraft asks a follower to purge the log while the snapshot
    /// it received is still being installed, and a purge recorded before an install that
    /// then failed, or that a crash cut short, left a data dir whose log ended before its
    /// snapshot began — refused at the next start, for good (found by fenced-sim). Purging
    /// less instead is no cure: the entries appended next, after the snapshot's, would reach
    /// the disk before it, over a log that does not reach them. Waiting on an install that
    /// then fails must not last for good either: Raft waits on this purge, so it could not
    /// stop on the install's error (found by fenced-sim too).
    ///
    /// Without a snapshot being received (a file of [`SnapshotStore::receiving`] still there)
    /// or an install that failed, no install is coming, and it returns at once.
    pub async fn covering(&self, log_id: LogId<NodeId>) -> Result<(), StoreError> {
        let done = |c: &Covered| c.upto >= Some(log_id);
        let mut covered = self.covered.subscribe();
        let now = covered.borrow_and_update().clone();
        if done(&now) {
            return Ok(());
        }
        let incoming = {
            let mut received = self
                .received
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            received.retain(|p| self.fs.exists(p));
            !received.is_empty()
        };
        let now = match (now.failed.is_some(), incoming) {
            (false, false) => return Ok(()),
            (true, _) => now,
            (false, true) => match covered.wait_for(|c| done(c) || c.failed.is_some()).await {
                Ok(c) => c.clone(),
                // The sender is `self`'s: not while `self` is borrowed.
                Err(_) => now,
            },
        };
        match done(&now) {
            true => Ok(()),
            false => Err(StoreError::Refused(format!(
                "not purging the log up to {log_id}: the snapshot that would cover it failed \
                 to install: {}",
                now.failed.as_deref().unwrap_or("(no reason)")
            ))),
        }
    }

    /// The current snapshot's meta and path, if there is one (its meta checked, the rest
    /// not: see [`load`]).
    pub fn current(&self) -> Result<Option<(Meta, PathBuf)>, StoreError> {
        let path = self.current_path();
        if !self.fs.exists(&path) {
            return Ok(None);
        }
        Ok(Some((read_meta(&*self.fs, &path)?, path)))
    }

    /// A new temporary file to receive a snapshot into (`inline`: its I/O done when polled,
    /// [`SnapshotFile::new_inline`]).
    pub fn receiving(&self, inline: bool) -> Result<SnapshotFile, StoreError> {
        let path = self.tmp_path()?;
        // Never someone else's file (the name is new to this process).
        let file = self
            .fs
            .open(&path, Mode::CreateNew)
            .map_err(|e| StoreError::file(&path, e))?;
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(path.clone());
        match inline {
            true => Ok(SnapshotFile::new_inline(file, path)),
            false => SnapshotFile::new(file, path.clone()).map_err(|e| StoreError::file(&path, e)),
        }
    }
}

/// Write a snapshot file (layout in the module docs) of `meta` and `machine` into `w`,
/// which should be buffered. Blocking. The state is serialized straight into `w`.
pub fn write_to(
    w: impl Write,
    meta: &Meta,
    machine: &fenced_core::StateMachine,
) -> Result<(), StoreError> {
    let io_err = |e: io::Error| StoreError::File {
        path: PathBuf::from("(snapshot stream)"),
        error: e,
    };
    let mut w = Crc {
        inner: w,
        hasher: crc32fast::Hasher::new(),
    };
    let meta_bytes = bincode::serialize(meta).map_err(|source| StoreError::Encode {
        what: "snapshot meta",
        source,
    })?;
    let meta_len = u32::try_from(meta_bytes.len()).map_err(|_| StoreError::Encode {
        what: "snapshot meta",
        source: Box::new(bincode::ErrorKind::SizeLimit),
    })?;
    let body = machine.body_version();
    let layout = if body == 1 { LAYOUT_1 } else { LAYOUT };
    w.write_all(MAGIC)
        .and_then(|()| w.write_all(&layout.to_le_bytes()))
        .and_then(|()| w.write_all(&[frame::VERSION]))
        .and_then(|()| match layout {
            LAYOUT_1 => Ok(()),
            _ => w.write_all(&body.to_le_bytes()),
        })
        .and_then(|()| w.write_all(&meta_len.to_le_bytes()))
        .and_then(|()| w.write_all(&meta_bytes))
        .map_err(io_err)?;
    machine
        .write_body(codec(u64::MAX), &mut w)
        .map_err(|source| match *source {
            bincode::ErrorKind::Io(e) => io_err(e),
            _ => StoreError::Encode {
                what: "state machine",
                source,
            },
        })?;
    let crc = w.hasher.clone().finalize();
    let mut inner = w.inner;
    inner
        .write_all(&crc.to_le_bytes())
        .and_then(|()| inner.flush())
        .map_err(io_err)
}

/// Write a snapshot file of `meta` and `machine` at `path` on `fs` (created), synced;
/// removed again if anything fails. Blocking.
pub fn write_file(
    fs: &dyn Fs,
    path: &Path,
    meta: &Meta,
    machine: &fenced_core::StateMachine,
) -> Result<(), StoreError> {
    let result = (|| {
        let file = fs
            .open(path, Mode::Truncate)
            .map_err(|e| StoreError::file(path, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, Cursor::new(&*file));
        write_to(&mut w, meta, machine).map_err(|e| match e {
            StoreError::File { error, .. } => StoreError::file(path, error),
            e => e,
        })?;
        drop(w);
        file.sync_all().map_err(|e| StoreError::file(path, e))
    })();
    if result.is_err() {
        let _ = fs.remove_file(path);
    }
    result
}

/// What a snapshot file's header says.
struct Header {
    body: u32,
    meta: Meta,
}

/// The header and meta of a snapshot file, either layout.
fn read_header(path: &Path, r: &mut impl Read) -> Result<Header, StoreError> {
    let mut head = [0u8; 8 + 4 + 1];
    r.read_exact(&mut head)
        .map_err(|_| damaged(path, "shorter than its header"))?;
    if &head[..8] != MAGIC {
        return Err(damaged(path, "not a snapshot file (bad magic)"));
    }
    let layout = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let format = head[12];
    let unknown = |what, found, supported| StoreError::UnknownFormat {
        what,
        found,
        supported,
    };
    if !(LAYOUT_1..=LAYOUT).contains(&layout) {
        return Err(unknown("snapshot file", layout, LAYOUT));
    }
    if !(2..=frame::VERSION).contains(&format) {
        return Err(unknown(
            "snapshot file",
            u32::from(format),
            u32::from(frame::VERSION),
        ));
    }
    let mut word = [0u8; 4];
    let mut read_u32 = |r: &mut dyn Read| {
        r.read_exact(&mut word)
            .map_err(|_| damaged(path, "shorter than its header"))
            .map(|()| u32::from_le_bytes(word))
    };
    let body = match layout {
        LAYOUT_1 => 1,
        _ => read_u32(r)?,
    };
    if !(1..=fenced_core::machine::BODY_VERSION).contains(&body) {
        return Err(unknown(
            "snapshot body",
            body,
            fenced_core::machine::BODY_VERSION,
        ));
    }
    let meta_len = read_u32(r)?;
    let meta = codec(u64::from(meta_len))
        .deserialize_from(r.take(u64::from(meta_len)))
        .map_err(|e| damaged(path, format!("meta: {e}")))?;
    Ok(Header { body, meta })
}

/// The meta of the snapshot file at `path` on `fs`.
pub fn read_meta(fs: &dyn Fs, path: &Path) -> Result<Meta, StoreError> {
    let file = fs
        .open(path, Mode::Read)
        .map_err(|e| StoreError::file(path, e))?;
    let mut f = BufReader::new(Cursor::new(&*file));
    read_header(path, &mut f).map(|h| h.meta)
}

/// Check the whole file at `path` on `fs` against its checksum, then decode it. Blocking.
pub fn load(fs: &dyn Fs, path: &Path) -> Result<(Meta, fenced_core::StateMachine), StoreError> {
    let f = fs
        .open(path, Mode::Read)
        .map_err(|e| StoreError::file(path, e))?;
    let len = f.len().map_err(|e| StoreError::file(path, e))?;
    if len < (HEADER + 4) as u64 {
        return Err(damaged(path, format!("{len} bytes is too short")));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut r = BufReader::with_capacity(1 << 20, Cursor::new(&*f)).take(len - 4);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r.read(&mut buf).map_err(|e| StoreError::file(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let mut stored = [0u8; 4];
    f.read_exact_at(&mut stored, len - 4)
        .map_err(|e| StoreError::file(path, e))?;
    let (stored, actual) = (u32::from_le_bytes(stored), hasher.finalize());
    if stored != actual {
        return Err(damaged(
            path,
            format!("stored crc32 {stored:08x}, computed {actual:08x}"),
        ));
    }
    let mut r = BufReader::with_capacity(1 << 20, Cursor::new(&*f)).take(len - 4);
    let Header { body, meta } = read_header(path, &mut r)?;
    let machine = fenced_core::StateMachine::read_body(body, codec(len), &mut r)
        .map_err(|e| damaged(path, format!("state machine (body version {body}): {e}")))?;
    if r.limit() != 0 {
        return Err(damaged(path, "bytes after the state machine"));
    }
    Ok((meta, machine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, StoredMembership};
    use std::time::Duration;

    fn id(i: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), i)
    }

    fn meta(i: u64) -> Meta {
        Meta {
            last_log_id: Some(id(i)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("s{i}"),
        }
    }

    /// A store with a snapshot file of `meta(i)` written (not installed), and a file being
    /// received.
    fn receiving(i: u64) -> (tempfile::TempDir, SnapshotStore, PathBuf) {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let store = SnapshotStore::open(dir.path()).expect("open");
        let written = store
            .write(&meta(i), &fenced_core::StateMachine::default())
            .expect("write");
        let _incoming = store.receiving(true).expect("receiving");
        (dir, store, written)
    }

    async fn waits(store: &SnapshotStore, i: u64) -> bool {
        tokio::time::timeout(Duration::from_secs(5), store.covering(id(i)))
            .await
            .is_err()
    }

    #[tokio::test(start_paused = true)]
    async fn a_purge_goes_ahead_when_no_snapshot_is_coming() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let store = SnapshotStore::open(dir.path()).expect("open");
        store.covering(id(9)).await.expect("nothing to wait for");
    }

    #[tokio::test(start_paused = true)]
    async fn a_purge_waits_for_the_install_of_a_received_snapshot() {
        let (_dir, store, written) = receiving(5);
        assert!(
            waits(&store, 5).await,
            "it must wait while the install is to come"
        );
        let (waited, installed) = tokio::join!(store.covering(id(5)), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            store.install(&written, &meta(5))
        });
        assert!(installed.expect("install"));
        waited.expect("covered by the install");
        // Below what is covered: at once.
        store.covering(id(3)).await.expect("covered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_purge_waiting_for_an_install_that_fails_fails_too() {
        let (_dir, store, _) = receiving(5);
        let purge = tokio::time::timeout(Duration::from_secs(5), store.covering(id(5)));
        let (waited, ()) = tokio::join!(purge, async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            store.install_failed(&"disk on fire");
        });
        let e = waited
            .expect("the purge must not wait for good")
            .expect_err("the install failed");
        assert!(e.to_string().contains("disk on fire"), "{e}");
        // A purge asked after the failure fails at once (Raft is stopping), and an install
        // that succeeds clears the failure.
        assert!(store.covering(id(5)).await.is_err());
        let written = store
            .write(&meta(6), &fenced_core::StateMachine::default())
            .expect("write");
        store.install(&written, &meta(6)).expect("install");
        store.covering(id(6)).await.expect("covered");
    }

    /// A state with an etcd key (applied under the etcd rules).
    fn with_etcd() -> fenced_core::StateMachine {
        use fenced_core::etcd::PutRequest;
        use fenced_core::{Batch, Command, EtcdCommand, Request};
        let mut sm = fenced_core::StateMachine::new();
        sm.apply_batch(
            1,
            &Batch::one(Request {
                time_ms: 1_000,
                client: None,
                cmd: Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v"))),
            }),
        );
        assert_eq!(sm.body_version(), 2);
        sm
    }

    fn file_of(machine: &fenced_core::StateMachine) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("s.snap");
        let mut bytes = Vec::new();
        write_to(&mut bytes, &meta(3), machine).expect("write");
        std::fs::write(&path, &bytes).expect("write file");
        (dir, path, bytes)
    }

    #[test]
    fn a_state_without_etcd_keys_is_written_in_layout_1_byte_for_byte() {
        let mut sm = fenced_core::StateMachine::new();
        sm.apply_batch(
            1,
            &fenced_core::Batch::one(fenced_core::Request {
                time_ms: 5,
                client: None,
                cmd: fenced_core::Command::OpenSession { ttl_ms: 1_000 },
            }),
        );
        let (_dir, path, bytes) = file_of(&sm);
        // The layout every earlier build wrote, built by hand.
        let meta_bytes = bincode::serialize(&meta(3)).expect("meta");
        let mut old = MAGIC.to_vec();
        old.extend_from_slice(&1u32.to_le_bytes());
        old.push(frame::VERSION);
        old.extend_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
        old.extend_from_slice(&meta_bytes);
        old.extend_from_slice(&bincode::serialize(&sm).expect("state"));
        old.extend_from_slice(&crc32fast::hash(&old).to_le_bytes());
        assert!(bytes == old, "layout 1 changed");
        let (m, back) = load(&fenced_fs::OsFs, &path).expect("load");
        assert_eq!((m, back), (meta(3), sm));
    }

    #[test]
    fn a_state_with_etcd_keys_is_written_in_layout_2_and_loads_back() {
        let sm = with_etcd();
        let (_dir, path, bytes) = file_of(&sm);
        assert_eq!(&bytes[8..12], &2u32.to_le_bytes(), "layout");
        assert_eq!(bytes[12], frame::VERSION, "record format");
        assert_eq!(&bytes[13..17], &2u32.to_le_bytes(), "body version");
        let (m, back) = load(&fenced_fs::OsFs, &path).expect("load");
        assert_eq!(m, meta(3));
        assert_eq!(back.digest(), sm.digest());
        assert_eq!(back, sm);
        assert_eq!(read_meta(&fenced_fs::OsFs, &path).expect("meta"), meta(3));
    }

    #[test]
    fn an_unknown_body_version_is_named() {
        let (_dir, path, mut bytes) = file_of(&with_etcd());
        let newer = fenced_core::machine::BODY_VERSION + 1;
        bytes[13..17].copy_from_slice(&newer.to_le_bytes());
        let n = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        match load(&fenced_fs::OsFs, &path) {
            Err(StoreError::UnknownFormat {
                what: "snapshot body",
                found,
                supported,
            }) if found == newer && supported == fenced_core::machine::BODY_VERSION => {}
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
