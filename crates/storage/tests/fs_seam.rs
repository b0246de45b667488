//! Every file of the store goes through the `fenced_fs::Fs` it was opened with: the store is
//! opened at a path that exists only for that `Fs` (it maps `/fenced-virtual/…` into a
//! temporary dir, and refuses every other path), so any file I/O that bypassed it fails.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::{DirEntry, File, Fs, Mode, OsFs};
use fenced_raft_types::{NodeId, TypeConfig};
use fenced_storage::{datadir, open_with, Env, EventSink, Io, LogStore, StateMachineStore};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

const VIRTUAL: &str = "/fenced-virtual";

/// The real file system under `root`, seen at [`VIRTUAL`].
#[derive(Debug)]
struct Rooted {
    root: PathBuf,
}

impl Rooted {
    fn real(&self, path: &Path) -> io::Result<PathBuf> {
        match path.strip_prefix(VIRTUAL) {
            Ok(rest) => Ok(self.root.join(rest)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is outside {VIRTUAL}", path.display()),
            )),
        }
    }
}

impl Fs for Rooted {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn File>> {
        OsFs.open(&self.real(path)?, mode)
    }
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        OsFs.read_dir(&self.real(dir)?)
    }
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        OsFs.create_dir(&self.real(dir)?)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        OsFs.create_dir_all(&self.real(dir)?)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        OsFs.remove_file(&self.real(path)?)
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        OsFs.remove_dir(&self.real(dir)?)
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        OsFs.remove_dir_all(&self.real(dir)?)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsFs.rename(&self.real(from)?, &self.real(to)?)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        OsFs.sync_dir(&self.real(dir)?)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        Fs::len(&OsFs, &self.real(path)?)
    }
    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        OsFs.is_dir(&self.real(path)?)
    }
}

fn no_events() -> EventSink {
    Arc::new(|_: &[fenced_core::Event]| {})
}

/// Stores in sub-dirs of one root, each seen at `/fenced-virtual/<name>` (the suite hands
/// one store's snapshot file to another).
struct Builder {
    root: TempDir,
    fs: Arc<dyn Fs>,
    io: Io,
}

impl Builder {
    fn new(io: Io) -> Builder {
        let root = TempDir::new().expect("tempdir");
        let fs: Arc<dyn Fs> = Arc::new(Rooted {
            root: root.path().to_owned(),
        });
        Builder { root, fs, io }
    }
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = TempDir::new_in(self.root.path()).map_err(|e| StorageIOError::write(&e))?;
        let name = dir.path().file_name().expect("a name").to_owned();
        let seen = Path::new(VIRTUAL).join(name);
        let (log, sm) = open_with(
            &seen,
            no_events(),
            Env::new(self.fs.clone(), self.io.clone()),
        )
        .map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite_through_the_fs() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(Builder::new(Io::Threads))
}

#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite_inline_through_the_fs() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(Builder::new(Io::Inline))
}

/// A data dir's rules (the identity file included) go through the fs too.
#[test]
fn a_data_dir_is_created_and_opened_again_through_the_fs() {
    let b = Builder::new(Io::Inline);
    let dir = Path::new(VIRTUAL).join("node-1");
    let plan = datadir::Plan {
        member_id: 1,
        cluster_id: 7,
        may_bootstrap: true,
        join: None,
    };
    let env = Env::new(b.fs.clone(), Io::Inline);
    let opened = datadir::open_with(&dir, &plan, no_events(), env.clone()).expect("create");
    assert!(opened.bootstrap);
    opened
        .identity
        .learn(2, 99)
        .expect("a pin is stored through the fs");
    let incarnation = opened.identity.incarnation();
    drop(opened);
    assert!(b.root.path().join("node-1/identity").exists());
    let again = datadir::open_with(&dir, &plan, no_events(), env).expect("reopen");
    assert_eq!(again.identity.incarnation(), incarnation);
    assert_eq!(again.identity.pinned(2), Some(99));
}

/// The openraft suite on the simulated disk (fenced-fs's `SimFs`), inline as the simulator
/// runs it.
struct SimBuilder {
    fs: fenced_fs::SimFs,
    next: std::sync::atomic::AtomicU64,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, ()> for SimBuilder {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError<NodeId>> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = Path::new(VIRTUAL).join(format!("store-{n}"));
        let fs: Arc<dyn Fs> = Arc::new(self.fs.clone());
        fs.create_dir_all(&dir)
            .map_err(|e| StorageIOError::write(&e))?;
        let (log, sm) = open_with(&dir, no_events(), Env::new(fs, Io::Inline))
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(((), log, sm))
    }
}

#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite_on_the_simulated_disk() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(SimBuilder {
        fs: fenced_fs::SimFs::new(VIRTUAL, 1),
        next: Default::default(),
    })
}

/// A power loss right after a data dir was created keeps it: the dir's own name is synced
/// into its parent. (Found by fenced-sim: every node losing power at once lost its whole
/// data dir — the `mkdir` was never synced — and with it every acknowledged write.)
#[test]
fn a_new_data_dir_survives_a_power_loss() {
    for seed in 0..20 {
        let disk = fenced_fs::SimFs::new(VIRTUAL, seed);
        let fs: Arc<dyn Fs> = Arc::new(disk.clone());
        let dir = Path::new(VIRTUAL).join("deep/node-1");
        let plan = datadir::Plan {
            member_id: 1,
            cluster_id: 7,
            may_bootstrap: true,
            join: None,
        };
        let env = Env::new(fs, Io::Inline);
        let opened = datadir::open_with(&dir, &plan, no_events(), env.clone()).expect("create");
        let incarnation = opened.identity.incarnation();
        drop(opened);
        let lost = disk.power_loss();
        assert!(lost.names_lost.is_empty(), "seed {seed}: {lost:?}");
        let again = datadir::open_with(&dir, &plan, no_events(), env).expect("reopen");
        assert_eq!(again.identity.incarnation(), incarnation, "seed {seed}");
    }
}

/// A simulated disk (seed `seed`) with an empty node dir on it, and the store environment over
/// it with I/O as `io` says.
fn simulated_disk(seed: u64, io: Io) -> (fenced_fs::SimFs, PathBuf, Env) {
    let disk = fenced_fs::SimFs::new(VIRTUAL, seed);
    let fs: Arc<dyn Fs> = Arc::new(disk.clone());
    let dir = Path::new(VIRTUAL).join("node-1");
    fs.create_dir_all(&dir).expect("mkdir");
    fs.sync_dir(Path::new(VIRTUAL)).expect("sync");
    (disk, dir, Env::new(fs, io))
}

/// A blank log entry of term 1 at `index`.
fn blank(index: u64) -> openraft::Entry<TypeConfig> {
    openraft::Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Blank,
    }
}

/// A log segment whose name a failed directory fsync left unsure survives a power loss after
/// the next process appended to it: opening the log syncs its directory. (Found by fenced-sim:
/// a new learner's first segment vanished in a power loss, and with it 76 entries it had
/// acknowledged.)
#[tokio::test]
async fn a_segment_named_before_a_failed_sync_is_durable_once_the_log_is_opened() {
    use openraft::storage::{RaftLogReader, RaftLogStorageExt};
    for seed in 0..20 {
        let (disk, dir, env) = simulated_disk(seed, Io::Inline);
        let (mut log, _sm) = open_with(&dir, no_events(), env.clone()).expect("open");
        // The first append creates the first segment; its syncs fail.
        disk.change_faults(|f| f.fsync_error = 1.0);
        assert!(
            log.blocking_append([blank(1)]).await.is_err(),
            "seed {seed}"
        );
        disk.change_faults(|f| f.fsync_error = 0.0);
        drop(log);
        // The process starts again (the same kernel cache) and acknowledges entries.
        let (mut log, _sm) = open_with(&dir, no_events(), env.clone()).expect("reopen");
        log.blocking_append((1..=3).map(blank))
            .await
            .expect("append");
        drop(log);
        let lost = disk.power_loss();
        let (mut log, _sm) = open_with(&dir, no_events(), env)
            .unwrap_or_else(|e| panic!("seed {seed}: {e} after {lost:?}"));
        let found = log.try_get_log_entries(1..4).await.expect("read");
        assert_eq!(found.len(), 3, "seed {seed}: entries lost after {lost:?}");
    }
}

/// With the group commit on threads, the hard state's record of the log's end trails the
/// acknowledgement (the flusher's recorder writes it after the round's sync): a power loss that
/// takes the record of the last acknowledged append with it loses no acknowledged entry, and
/// the data dir opens — the entry past the record is kept, not taken for a torn tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_append_survives_a_power_loss_that_took_its_record() {
    use openraft::storage::{RaftLogReader, RaftLogStorageExt};
    for seed in 0..10 {
        let (disk, dir, env) = simulated_disk(seed, Io::Threads);
        let (mut log, _sm) = open_with(&dir, no_events(), env.clone()).expect("open");
        log.blocking_append((1..=4).map(blank))
            .await
            .expect("append");
        // Let the recorder record entry 4; then the power goes at the second sync from now:
        // the next append's segment sync succeeds (it is acknowledged), the recorder's
        // hard-state sync for it fails with the machine.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        disk.lose_power_at_sync(2);
        log.blocking_append([blank(5)])
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: the append was not acknowledged: {e}"));
        for _ in 0..100 {
            if disk.is_dead() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(disk.is_dead(), "seed {seed}: the recorder never synced");
        let lost = disk.power_loss();
        drop(log);
        drop(_sm);
        let (mut log, _sm) = open_with(&dir, no_events(), env.clone())
            .unwrap_or_else(|e| panic!("seed {seed}: {e} after {lost:?}"));
        let found = log.try_get_log_entries(1..6).await.expect("read");
        assert_eq!(found.len(), 5, "seed {seed}: entries lost after {lost:?}");
        // And the log goes on, the record catching up.
        log.blocking_append([blank(6)]).await.expect("append 6");
        drop(log);
        drop(_sm);
        let (mut log, _sm) = open_with(&dir, no_events(), env).expect("reopen");
        assert_eq!(log.try_get_log_entries(1..7).await.expect("read").len(), 6);
    }
}

/// A learner that has received nothing yet, restarted while `--join`'s lookup had no answer
/// (no cluster id in its plan), waits for the leader's log instead of being refused; with
/// its store's files gone it is refused, as any member that lost its Raft state. (Found by
/// fenced-sim, seed 1000170: every node lost power before a new learner got anything.)
#[test]
fn a_learner_that_received_nothing_restarts_without_the_clusters_answer() {
    let disk = fenced_fs::SimFs::new(VIRTUAL, 1);
    let fs: Arc<dyn Fs> = Arc::new(disk);
    let dir = Path::new(VIRTUAL).join("node-4");
    let env = Env::new(fs.clone(), Io::Inline);
    let plan = |join| datadir::Plan {
        member_id: 4,
        cluster_id: 7,
        may_bootstrap: false,
        join,
    };
    let opened = datadir::open_with(&dir, &plan(Some(7)), no_events(), env.clone()).expect("join");
    assert!(!opened.bootstrap);
    drop(opened);
    datadir::open_with(&dir, &plan(None), no_events(), env.clone())
        .expect("a learner with nothing yet restarts without the cluster's answer");
    fs.remove_dir_all(&dir.join("wal")).expect("rm");
    fs.remove_file(&dir.join("purged")).expect("rm");
    let refused = datadir::open_with(&dir, &plan(None), no_events(), env)
        .err()
        .expect("its store gone: refused");
    assert!(
        refused.to_string().contains("holds no Raft state"),
        "{refused}"
    );
}

/// Opening a store makes the names in its data dir and its snapshot dir durable: a process
/// whose directory fsync failed left them in the cache only (the purged record's rename, a
/// snapshot install's rename), and the next one goes on from them. (Found by fenced-sim: seed
/// 1206996, the purged record's rename was lost in a power loss after the log had gone on past
/// the purge point, and the log had a hole; seed 1172 with `--faults
/// disk,flicker,crashes,partitions,noise --clients 32`, the current snapshot's rename was lost
/// after the next process had purged the log it covers.)
#[test]
fn opening_a_store_makes_its_dirs_names_durable() {
    for sub in [None, Some("snapshots")] {
        for seed in 0..20 {
            let (disk, dir, env) = simulated_disk(seed, Io::Inline);
            let fs: Arc<dyn Fs> = Arc::new(disk.clone());
            drop(open_with(&dir, no_events(), env.clone()).expect("open"));
            let in_dir = match sub {
                Some(sub) => {
                    let d = dir.join(sub);
                    fs.create_dir_all(&d).expect("mkdir");
                    fs.sync_dir(&dir).expect("sync");
                    d
                }
                None => dir.clone(),
            };
            // A name the last process made and could not sync into the directory.
            let left = in_dir.join("left-by-a-failed-sync");
            let f = fs.open(&left, Mode::CreateNew).expect("create");
            f.sync_data().expect("sync");
            drop(open_with(&dir, no_events(), env).expect("reopen"));
            let lost = disk.power_loss();
            assert!(fs.exists(&left), "{sub:?}, seed {seed}: {lost:?}");
        }
    }
}

/// [`Io::Tasks`] (the simulator's): on a paused current-thread runtime the flusher and its
/// recorder are tasks, an append is acknowledged only after a drawn sync latency (the clock
/// moves by it, nothing else moves it), and a power loss right after the acknowledgement —
/// before the recorder's pass, which waits a latency of its own — loses no acknowledged
/// entry: the entry past the record is kept, not cut as a torn tail.
#[tokio::test(start_paused = true)]
async fn tasks_acknowledge_after_a_sync_latency_and_a_power_loss_before_the_record_keeps_the_entry()
{
    use fenced_storage::TaskIo;
    use openraft::storage::{RaftLogReader, RaftLogStorageExt};
    for seed in 0..10 {
        let tasks = TaskIo::new(seed);
        let (disk, dir, env) = simulated_disk(seed, Io::Tasks(tasks.clone()));
        let (mut log, sm) = open_with(&dir, no_events(), env).expect("open");
        let t0 = tokio::time::Instant::now();
        log.blocking_append((1..=4).map(blank))
            .await
            .expect("append");
        assert!(
            t0.elapsed() >= std::time::Duration::from_micros(20),
            "seed {seed}: acknowledged without a sync latency"
        );
        // Let the recorder record entry 4.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        log.blocking_append([blank(5)]).await.expect("append 5");
        // The machine dies at once: the recorder's pass for 5 is still waiting.
        tasks.kill();
        let lost = disk.power_loss();
        drop(log);
        drop(sm);
        let env = Env::new(Arc::new(disk.clone()), Io::Tasks(TaskIo::new(seed + 100)));
        let (mut log, _sm) = open_with(&dir, no_events(), env)
            .unwrap_or_else(|e| panic!("seed {seed}: {e} after {lost:?}"));
        let found = log.try_get_log_entries(1..6).await.expect("read");
        assert_eq!(found.len(), 5, "seed {seed}: entries lost after {lost:?}");
    }
}

/// A failed hard-state record fails every later append (`Flusher`'s rule), with the recorder
/// as a task: the record's sync fails, the disk works again, and the next append is still
/// refused.
#[tokio::test(start_paused = true)]
async fn tasks_a_failed_record_fails_later_appends() {
    use fenced_storage::TaskIo;
    use openraft::storage::RaftLogStorageExt;
    for seed in 0..5 {
        let (disk, dir, env) = simulated_disk(seed, Io::Tasks(TaskIo::new(seed)));
        let (mut log, _sm) = open_with(&dir, no_events(), env).expect("open");
        log.blocking_append((1..=4).map(blank))
            .await
            .expect("append");
        // Before the recorder's pass (it waits a latency): its sync fails.
        disk.change_faults(|f| f.fsync_error = 1.0);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        disk.change_faults(|f| f.fsync_error = 0.0);
        let later = log.blocking_append([blank(5)]).await;
        assert!(
            later.is_err(),
            "seed {seed}: an append after a failed record was acknowledged"
        );
    }
}
