use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fenced_core::{Batch, Command, Event, Request, RequestId, Response};
use fenced_raft_types::{NodeId, TypeConfig};
use fenced_storage::{
    open, open_with, EventSink, Io, LegacyTypeConfig, LogStore, StateMachineStore, StoreError,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

struct Builder(Io);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let (log, sm) = open_with(dir.path(), no_events(), self.0.clone())
            .map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(Builder(Io::Threads))
}

/// The same suite with every piece of blocking work inline.
#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite_inline() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(Builder(Io::Inline))
}

/// The same suite with the flusher and recorder as tasks, each sync delayed ([`Io::Tasks`],
/// the simulator's default). A new store per test: one seed each.
#[allow(clippy::result_large_err)]
#[test]
fn openraft_storage_suite_tasks() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(Builder(Io::Tasks(fenced_storage::TaskIo::new(7))))
}

fn no_events() -> EventSink {
    Arc::new(|_: &[Event]| {})
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn membership(term: u64, index: u64) -> Entry<TypeConfig> {
    let voters: BTreeSet<NodeId> = [1].into_iter().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
    }
}

fn normal(term: u64, index: u64, time_ms: u64, seq: u64, cmd: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Batch::one(Request {
            time_ms,
            client: Some(RequestId { client_id: 7, seq }),
            cmd,
        })),
    }
}

fn acquire(name: &str, owner: &str, wait_ms: u64) -> Command {
    Command::Acquire {
        name: name.into(),
        owner: owner.into(),
        ttl_ms: 10_000,
        session: None,
        wait_ms,
    }
}

/// 1 blank, 2 membership, 3 acquire a/o (revision 1), 4 acquire a/p (waits; 2), 5 release a/o
/// (3; hands a to p), 6 acquire b/o (4).
fn history() -> Vec<Entry<TypeConfig>> {
    vec![
        blank(1, 1),
        membership(1, 2),
        normal(1, 3, 100, 1, acquire("a", "o", 0)),
        normal(1, 4, 110, 2, acquire("a", "p", 5_000)),
        normal(
            1,
            5,
            120,
            3,
            Command::Release {
                name: "a".into(),
                owner: "o".into(),
                token: 1,
            },
        ),
        normal(1, 6, 130, 4, acquire("b", "o", 0)),
    ]
}

#[tokio::test]
async fn state_survives_restart() {
    state_survives_restart_with(Io::Threads).await;
}

#[tokio::test]
async fn state_survives_restart_inline() {
    state_survives_restart_with(Io::Inline).await;
}

async fn state_survives_restart_with(io: Io) {
    let dir = TempDir::new().unwrap();
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink: EventSink = {
        let seen = seen.clone();
        Arc::new(move |evs: &[Event]| seen.lock().unwrap().extend_from_slice(evs))
    };
    let entries = history();
    let vote = Vote::new(1, 1);

    let expected_state = {
        let (mut log, mut sm) = open_with(dir.path(), sink, io.clone()).unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_vote(&vote).await.unwrap();
        log.save_committed(Some(log_id(1, 6))).await.unwrap();

        let replies = sm.apply(entries[..4].to_vec()).await.unwrap();
        assert!(replies[0].is_empty() && replies[1].is_empty());
        assert!(matches!(
            replies[2][..],
            [Response::Granted {
                token: 1,
                holds: 1,
                ..
            }]
        ));
        assert_eq!(replies[3], vec![Response::Pending]);
        assert!(seen.lock().unwrap().is_empty());

        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 4)));
        assert!(snap.meta.snapshot_id.starts_with("1-4-"));

        let replies = sm.apply(entries[4..].to_vec()).await.unwrap();
        assert_eq!(replies[0], vec![Response::Released { holds: 0 }]);
        assert!(matches!(
            replies[1][..],
            [Response::Granted { token: 4, .. }]
        ));
        let events = seen.lock().unwrap().clone();
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::WaiterGranted { token: 3, .. })));
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::LockReleased { token: 1, .. })));

        let shared = sm.shared();
        assert_eq!(shared.last_applied(), Some(log_id(1, 6)));
        assert_eq!(
            shared.read(|m| m.lock_info("a").map(|l| (l.owner, l.token))),
            Some(("p".to_string(), 3))
        );
        log.purge(log_id(1, 1)).await.unwrap();
        shared.read(|m| m.clone())
    };

    // Reopen the same directory.
    let (mut log, mut sm) = open_with(dir.path(), no_events(), io).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 6)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(1, 6)));
    assert_eq!(log.try_get_log_entries(2..).await.unwrap(), entries[1..]);
    assert!(log.try_get_log_entries(..2).await.unwrap().is_empty());
    assert!(log.try_get_log_entries(5..5).await.unwrap().is_empty());
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = 6..3;
    assert!(log.try_get_log_entries(inverted).await.unwrap().is_empty());
    assert_eq!(log.try_get_log_entries(4..=5).await.unwrap(), entries[3..5]);

    let snap = sm.get_current_snapshot().await.unwrap().expect("snapshot");
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 4)));
    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 4)));
    assert_eq!(mem.log_id(), &Some(log_id(1, 2)));

    // The state machine is the snapshot's: lock a held by o, no lock b yet.
    let shared = sm.shared();
    assert_eq!(shared.read(|m| m.lock_info("a").map(|l| l.token)), Some(1));
    assert!(shared.read(|m| m.lock_info("b").is_none()));

    // Re-applying the committed tail (what openraft does on start) gives the same state.
    sm.apply(entries[4..].to_vec()).await.unwrap();
    assert_eq!(shared.read(|m| m.clone()), expected_state);
    assert_eq!(shared.last_applied(), Some(log_id(1, 6)));
}

#[tokio::test]
async fn install_snapshot_replaces_state() {
    let dir_a = TempDir::new().unwrap();
    let dir_b = TempDir::new().unwrap();
    let (_la, mut a) = open(dir_a.path(), no_events()).unwrap();
    let (_lb, mut b) = open(dir_b.path(), no_events()).unwrap();

    a.apply([normal(1, 1, 10, 1, acquire("a", "o", 0))])
        .await
        .unwrap();
    b.apply([
        normal(1, 1, 10, 1, acquire("x", "o", 0)),
        normal(1, 2, 10, 2, acquire("y", "o", 0)),
    ])
    .await
    .unwrap();

    let mut snap = a
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    // What openraft does with a leader's snapshot: stream it into a file the follower gives.
    let mut rx = b.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut snap.snapshot, &mut rx).await.unwrap();
    b.install_snapshot(&snap.meta, rx).await.unwrap();

    let shared = b.shared();
    assert!(shared.read(|m| m.lock_info("a").is_some()));
    assert!(shared.read(|m| m.lock_info("x").is_none() && m.lock_info("y").is_none()));
    assert_eq!(shared.last_applied(), Some(log_id(1, 1)));
    assert_eq!(
        b.get_current_snapshot().await.unwrap().unwrap().meta,
        snap.meta
    );

    // Garbage snapshot data, or a snapshot that is not the one announced, is refused and
    // leaves the state and the stored snapshot alone.
    let mut meta = snap.meta.clone();
    meta.last_log_id = Some(log_id(2, 9));
    let mut bad = b.begin_receiving_snapshot().await.unwrap();
    bad.write_all(&[0xff; 3]).await.unwrap();
    assert!(b.install_snapshot(&meta, bad).await.is_err());
    let mut other = b.begin_receiving_snapshot().await.unwrap();
    let mut again = a.get_current_snapshot().await.unwrap().unwrap();
    tokio::io::copy(&mut again.snapshot, &mut other)
        .await
        .unwrap();
    assert!(b.install_snapshot(&meta, other).await.is_err());
    assert!(shared.read(|m| m.lock_info("a").is_some()));
    assert_eq!(
        b.get_current_snapshot().await.unwrap().unwrap().meta,
        snap.meta
    );
    // Only the received files are left behind by nothing: the directory holds the current
    // snapshot alone.
    let files: Vec<_> = std::fs::read_dir(dir_b.path().join(fenced_storage::snapshot::DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, ["current.snap"]);
}

#[tokio::test]
async fn stale_snapshot_build_does_not_overwrite_newer() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = open(dir.path(), no_events()).unwrap();
    sm.apply([blank(1, 1)]).await.unwrap();
    let mut old = sm.get_snapshot_builder().await;
    sm.apply([blank(1, 2)]).await.unwrap();
    let new = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    old.build_snapshot().await.unwrap();
    let cur = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(cur.meta, new.meta);
}

/// The records of the write-ahead log of a closed store (one segment), by position.
fn log_records(dir: &Path) -> (std::path::PathBuf, Vec<Vec<u8>>) {
    let wal = dir.join(fenced_storage::wal::DIR);
    let mut segments: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let path = segments.pop().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut records = Vec::new();
    let mut at = 16;
    // Records end at a zero length (the zeros a segment grows by) or at the end of the file.
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        records.push(bytes[at + 4..at + 4 + len].to_vec());
        at += 4 + len;
    }
    (path, records)
}

/// Rewrite the write-ahead log of a closed store after `edit` changed its records, keeping
/// the zeros after them.
fn poke_log(dir: &Path, edit: impl FnOnce(&mut Vec<Vec<u8>>)) {
    let (path, mut records) = log_records(dir);
    edit(&mut records);
    let old = std::fs::read(&path).unwrap();
    let mut bytes = old[..16].to_vec();
    for r in records {
        bytes.extend_from_slice(&(r.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&r);
    }
    bytes.resize(bytes.len().max(old.len()), 0);
    std::fs::write(&path, bytes).unwrap();
}

/// Write raw bytes right after the last record of the write-ahead log of a closed store (where
/// the next append would go).
fn append_raw(dir: &Path, raw: &[u8]) {
    use std::os::unix::fs::FileExt;
    let (path, records) = log_records(dir);
    let end: usize = 16 + records.iter().map(|r| 4 + r.len()).sum::<usize>();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(raw, end as u64).unwrap();
}

/// A data dir with the six entries of [`history`], closed.
async fn stored_history(dir: &Path) {
    let (mut log, _sm) = open(dir, no_events()).unwrap();
    log.blocking_append(history()).await.unwrap();
    log.save_vote(&Vote::new(1, 1)).await.unwrap();
}

/// `open` refuses the dir, for the reason `want` picks out.
fn assert_refused(dir: &Path, want: impl Fn(&StoreError) -> bool) {
    match open(dir, no_events()) {
        Err(StoreError::Unusable { dir: d, reason }) => {
            assert_eq!(d, dir);
            assert!(want(&reason), "refused for another reason: {reason}");
            let msg = StoreError::Unusable { dir: d, reason }.to_string();
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("opened a damaged data dir"),
    }
}

#[tokio::test]
async fn damaged_log_is_refused_at_open_never_truncated() {
    let entries = history();
    // Records by position: entry i + 1 at i.

    // A garbage value in the middle of the log.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    poke_log(dir.path(), |r| r[2] = vec![0xff, 0x00, 0x13]);
    assert_refused(dir.path(), |e| matches!(e, StoreError::Checksum { .. }));

    // One flipped bit inside a sealed entry.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    poke_log(dir.path(), |r| {
        let last = r[3].len() - 1;
        r[3][last] ^= 0x10;
    });
    assert_refused(dir.path(), |e| matches!(e, StoreError::Checksum { .. }));

    // The last acknowledged entry damaged: damage, not a torn write.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    poke_log(dir.path(), |r| r[5][7] ^= 0x01);
    assert_refused(dir.path(), |e| matches!(e, StoreError::Checksum { .. }));

    // A valid entry in the place of another.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    let misplaced = fenced_storage::frame::seal(&bincode::serialize(&entries[0]).unwrap());
    poke_log(dir.path(), |r| r[5] = misplaced);
    assert_refused(dir.path(), |e| {
        matches!(
            e,
            StoreError::MisplacedEntry {
                expected: 6,
                found: 1
            }
        )
    });

    // A hole.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    poke_log(dir.path(), |r| {
        r.remove(2);
    });
    assert_refused(dir.path(), |e| {
        matches!(e, StoreError::LogHole { after: 2, next: 4 })
    });

    // The tail is gone: the hard state notices.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    poke_log(dir.path(), |r| r.truncate(4));
    assert_refused(dir.path(), |e| {
        matches!(
            e,
            StoreError::LogEndsEarly {
                found: Some(4),
                recorded: 6
            }
        )
    });

    // An acknowledged record's length zeroed (it reads 0, as where the zeros ahead of the
    // records begin): records follow the zero, so this is no end of the log but a lost
    // write, and at an acknowledged index: damage.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    {
        use std::os::unix::fs::FileExt;
        let (path, records) = log_records(dir.path());
        let at = 16 + records[..4].iter().map(|r| 4 + r.len() as u64).sum::<u64>();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0; 4], at).unwrap();
    }
    assert_refused(
        dir.path(),
        |e| matches!(e, StoreError::Damaged { detail, .. } if detail.contains("zero record length")),
    );

    // The tail cut inside the last acknowledged record.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    {
        let (path, records) = log_records(dir.path());
        let end = 16 + records.iter().map(|r| 4 + r.len() as u64).sum::<u64>();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(end - 3).unwrap();
    }
    assert_refused(dir.path(), |e| {
        matches!(
            e,
            StoreError::LogEndsEarly {
                found: Some(5),
                recorded: 6
            }
        )
    });

    // Everything but the hard state is gone: the purged file is missing, and so is the log.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let p = f.unwrap().path();
        if p.file_name().unwrap() != "hardstate" {
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    assert_refused(
        dir.path(),
        |e| matches!(e, StoreError::Damaged { path, .. } if path.ends_with("purged")),
    );
    // Only the log is gone: the hard state notices.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    std::fs::remove_dir_all(dir.path().join(fenced_storage::wal::DIR)).unwrap();
    assert_refused(dir.path(), |e| {
        matches!(
            e,
            StoreError::LogEndsEarly {
                found: None,
                recorded: 6
            }
        )
    });

    // The hard-state file is gone.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    std::fs::remove_file(dir.path().join("hardstate")).unwrap();
    assert_refused(dir.path(), |e| matches!(e, StoreError::Damaged { .. }));

    // Its first copy unreadable while the rest is there: refused.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    std::fs::write(dir.path().join("hardstate"), b"FHS2 torn").unwrap();
    assert_refused(dir.path(), |e| matches!(e, StoreError::Damaged { .. }));

    // The same in a data dir whose creation a crash cut short (the hard state is its first
    // file; no purged record, no log yet): nothing was acknowledged, so it is written again.
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("hardstate"), b"FHS2 torn").unwrap();
    let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), None);
    drop(log);
    open(dir.path(), no_events()).unwrap();

    // Intact: opens, with the vote from the hard state and every entry.
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
}

/// What a crash leaves after the last acknowledged entry — a record cut short, or whole but
/// failing its checksum — was never acknowledged: it is dropped, durably, and the log goes on.
#[tokio::test]
async fn unacknowledged_torn_tail_is_dropped() {
    let next = normal(1, 7, 140, 5, acquire("c", "o", 0));
    let sealed = fenced_storage::frame::seal(&bincode::serialize(&next).unwrap());
    let mut whole = (sealed.len() as u32).to_le_bytes().to_vec();
    whole.extend_from_slice(&sealed);
    let mut flipped = whole.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    for raw in [
        whole[..whole.len() / 2].to_vec(),
        whole[..3].to_vec(),
        flipped,
    ] {
        let dir = TempDir::new().unwrap();
        stored_history(dir.path()).await;
        let before = log_records(dir.path()).1;
        append_raw(dir.path(), &raw);
        {
            let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
            assert_eq!(log.try_get_log_entries(..).await.unwrap(), history());
            log.blocking_append([next.clone()]).await.unwrap();
        }
        // The cut was made before the next append: the log reads back whole.
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        let mut want = history();
        want.push(next.clone());
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), want);
        assert_eq!(log_records(dir.path()).1.len(), before.len() + 1);
    }
}

#[tokio::test]
async fn truncate_lowers_the_recorded_end_so_a_restart_is_not_refused() {
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        log.truncate(log_id(1, 4)).await.unwrap();
    }
    let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, 3)));
    // Appending again raises it.
    log.blocking_append([blank(2, 4)]).await.unwrap();
    drop(log);
    drop(_sm);
    let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(log_id(2, 4))
    );
}

/// A crash can leave the hard state's record of the log's end behind the log (the recorder
/// writes it about one sync after the acknowledgement). Opening rewrites the entries past it,
/// and must raise the record before serving: an idle node would otherwise keep the trailing
/// record across restarts, and damage to entries it acknowledged would read as a torn tail,
/// cut instead of refused.
#[tokio::test]
async fn open_raises_a_trailing_record_of_the_log_end() {
    use fenced_storage::hardstate::HardState;
    let dir = TempDir::new().unwrap();
    stored_history(dir.path()).await;
    let fs = fenced_fs::os();
    {
        let mut hard = HardState::open_on(&*fs, dir.path()).unwrap().unwrap();
        let mut value = hard.value().clone();
        assert_eq!(value.last_log_id, Some(log_id(1, 6)));
        value.last_log_id = Some(log_id(1, 3));
        hard.write(value).unwrap();
    }
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), history());
        // Before any append: the record names the log's end.
        let recorded = HardState::read_on(&*fs, dir.path()).unwrap().unwrap();
        assert_eq!(recorded.last_log_id, Some(log_id(1, 6)), "{recorded:?}");
    }
    // An idle restart later, entry 5's record is damaged: refused, not cut as a torn tail.
    poke_log(dir.path(), |records| {
        let last = records[4].len() - 1;
        records[4][last] ^= 0x40;
    });
    assert_refused(dir.path(), |_| true);
}

/// [`history`] as fenced wrote it before revisions (log format 1): one request per entry,
/// tokens are log indexes (the release names token 3).
fn legacy_history() -> Vec<Entry<LegacyTypeConfig>> {
    history()
        .into_iter()
        .map(|e| Entry {
            log_id: e.log_id,
            payload: match e.payload {
                EntryPayload::Blank => EntryPayload::Blank,
                EntryPayload::Membership(m) => EntryPayload::Membership(m),
                EntryPayload::Normal(mut b) => {
                    let mut req = b.requests.remove(0);
                    if let Command::Release { token, .. } = &mut req.cmd {
                        *token = 3;
                    }
                    EntryPayload::Normal(req)
                }
            },
        })
        .collect()
}

/// How [`legacy_history`] reads now.
fn legacy_history_upgraded() -> Vec<Entry<TypeConfig>> {
    legacy_history()
        .into_iter()
        .map(|e| Entry {
            log_id: e.log_id,
            payload: match e.payload {
                EntryPayload::Blank => EntryPayload::Blank,
                EntryPayload::Membership(m) => EntryPayload::Membership(m),
                EntryPayload::Normal(req) => EntryPayload::Normal(Batch::legacy(req)),
            },
        })
        .collect()
}

/// A record sealed in format 1: version byte 1, crc32 of the payload only.
fn seal_v1(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![1];
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The hard state an upgraded data dir of the tests below had: voted for 1 in term 1, log
/// durable up to index 6.
fn record_old_hard_state(dir: &Path) {
    fenced_storage::hardstate::HardState::create(
        dir,
        fenced_storage::hardstate::HardStateValue {
            vote: Some(Vote::new(1, 1)),
            last_log_id: Some(log_id(1, 6)),
            committed: None,
        },
    )
    .unwrap();
}

#[tokio::test]
async fn format_one_data_dir_keeps_its_tokens_and_continues_above_them() {
    let dir = TempDir::new().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        let log = db.open_tree("log").unwrap();
        for e in legacy_history() {
            let bytes = seal_v1(&bincode::serialize(&e).unwrap());
            log.insert(e.log_id.index.to_be_bytes(), bytes).unwrap();
        }
        let meta = db.open_tree("meta").unwrap();
        meta.insert("format", &[1u8][..]).unwrap();
        db.flush().unwrap();
        record_old_hard_state(dir.path());
    }
    let (mut log, mut sm) = open(dir.path(), no_events()).unwrap();
    let entries = log.try_get_log_entries(..).await.unwrap();
    assert_eq!(entries, legacy_history_upgraded());
    let replies = sm.apply(entries).await.unwrap();
    assert!(matches!(
        replies[2][..],
        [Response::Granted { token: 3, .. }]
    ));
    assert_eq!(replies[4], vec![Response::Released { holds: 0 }]);
    assert!(matches!(
        replies[5][..],
        [Response::Granted { token: 6, .. }]
    ));
    let shared = sm.shared();
    assert_eq!(shared.read(|m| m.lock_info("a").map(|l| l.token)), Some(5));
    // The first command after the upgrade takes a revision above every index token.
    let replies = sm
        .apply([normal(1, 7, 140, 5, acquire("c", "o", 0))])
        .await
        .unwrap();
    assert!(matches!(
        replies[0][..],
        [Response::Granted { token: 7, .. }]
    ));
    // A snapshot of that state is written in the new format and reads back the same.
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let state = shared.read(|m| m.clone());
    drop((log, sm));
    let (_log, sm) = open(dir.path(), no_events()).unwrap();
    assert_eq!(sm.shared().read(|m| m.clone()), state);
    assert_eq!(state.revision(), 7);
}

#[tokio::test]
async fn data_dir_from_before_checksums_is_upgraded() {
    let dir = TempDir::new().unwrap();
    let vote = Vote::new(1, 1);
    {
        let db = sled::open(dir.path()).unwrap();
        let log = db.open_tree("log").unwrap();
        for e in &legacy_history() {
            log.insert(e.log_id.index.to_be_bytes(), bincode::serialize(e).unwrap())
                .unwrap();
        }
        let meta = db.open_tree("meta").unwrap();
        meta.insert("vote", bincode::serialize(&vote).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(
            log.try_get_log_entries(..).await.unwrap(),
            legacy_history_upgraded()
        );
    }
    // Upgraded for good: a second open reads the sealed records.
    let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
    assert_eq!(
        log.try_get_log_entries(..).await.unwrap(),
        legacy_history_upgraded()
    );
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(log_id(1, 6))
    );
}

#[tokio::test]
async fn corrupt_snapshot_fails_open() {
    let dir = TempDir::new().unwrap();
    {
        let (_log, mut sm) = open(dir.path(), no_events()).unwrap();
        sm.apply([blank(1, 1)]).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let file = dir
        .path()
        .join(fenced_storage::snapshot::DIR)
        .join("current.snap");
    let good = std::fs::read(&file).unwrap();
    for at in [0, 20, good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x08;
        std::fs::write(&file, &bad).unwrap();
        assert_refused(dir.path(), |e| matches!(e, StoreError::Checksum { .. }));
    }
    std::fs::write(&file, &good[..good.len() - 7]).unwrap();
    assert_refused(dir.path(), |e| matches!(e, StoreError::Checksum { .. }));
    // The snapshot gone while the log was purged past it: nothing can rebuild the state.
    std::fs::write(&file, &good).unwrap();
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        log.blocking_append([blank(1, 1), blank(1, 2)])
            .await
            .unwrap();
        log.purge(log_id(1, 1)).await.unwrap();
    }
    std::fs::remove_file(&file).unwrap();
    assert_refused(dir.path(), |e| matches!(e, StoreError::Damaged { .. }));
}

/// A data dir of layout 2 kept its snapshot in sled: opened, it moves into a file (once),
/// with the same state.
#[tokio::test]
async fn sled_snapshot_moves_into_a_file() {
    let dir = TempDir::new().unwrap();
    let state = {
        let mut sm = fenced_core::StateMachine::default();
        for e in history() {
            if let EntryPayload::Normal(b) = e.payload {
                sm.apply_batch(e.log_id.index, &b);
            }
        }
        sm
    };
    let meta = openraft::SnapshotMeta::<NodeId, openraft::BasicNode> {
        last_log_id: Some(log_id(1, 6)),
        last_membership: StoredMembership::default(),
        snapshot_id: "1-6-1".into(),
    };
    {
        let db = sled::open(dir.path()).unwrap();
        let snap = db.open_tree("snapshot").unwrap();
        let seal = |b: Vec<u8>| fenced_storage::frame::seal(&b);
        snap.insert("meta", seal(bincode::serialize(&meta).unwrap()))
            .unwrap();
        snap.insert("data", seal(state.to_bytes())).unwrap();
        let m = db.open_tree("meta").unwrap();
        m.insert("format", &[2u8][..]).unwrap();
        m.insert(
            "last_purged",
            seal(bincode::serialize(&log_id(1, 6)).unwrap()),
        )
        .unwrap();
        db.flush().unwrap();
        record_old_hard_state(dir.path());
    }
    for _ in 0..2 {
        let (mut log, mut sm) = open(dir.path(), no_events()).unwrap();
        assert_eq!(sm.shared().read(|m| m.clone()), state);
        let cur = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(cur.meta, meta);
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 6)));
        assert_no_sled(dir.path());
    }
}

/// sled's files (or what a crash left of them) in `dir`.
fn sled_files(dir: &Path) -> Vec<String> {
    listing(dir)
        .into_iter()
        .filter(|n| ["db", "conf", "blobs"].contains(&n.as_str()) || n.starts_with("snap."))
        .collect()
}

fn assert_no_sled(dir: &Path) {
    assert_eq!(
        sled_files(dir),
        Vec::<String>::new(),
        "sled's files are left"
    );
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A new data dir never has sled's files; the last purged log id is in the `purged` file,
/// read back after a restart; a damaged or missing `purged` file refuses the data dir.
#[tokio::test]
async fn a_new_data_dir_keeps_last_purged_in_its_own_file_and_refuses_it_damaged() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, mut sm) = open(dir.path(), no_events()).unwrap();
        log.blocking_append(history()).await.unwrap();
        sm.apply(history()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log.purge(log_id(1, 5)).await.unwrap();
    }
    assert_eq!(
        listing(dir.path()),
        ["hardstate", "purged", "snapshots", "wal"]
    );
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(st.last_log_id, Some(log_id(1, 6)));
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), history()[5..]);
    }
    let path = dir.path().join(fenced_storage::purged::FILE_NAME);
    let good = std::fs::read(&path).unwrap();
    let is_purged =
        |e: &StoreError| matches!(e, StoreError::Damaged { path, .. } if path.ends_with("purged"));
    for at in [0, 9, 13, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x04;
        std::fs::write(&path, &bad).unwrap();
        assert_refused(dir.path(), is_purged);
    }
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    assert_refused(dir.path(), is_purged);
    std::fs::remove_file(&path).unwrap();
    assert_refused(dir.path(), is_purged);
    assert_no_sled(dir.path());
    std::fs::write(&path, &good).unwrap();
    open(dir.path(), no_events()).unwrap();
}

/// A data dir as the previous layout (3) left it: entries 4..=6 in the write-ahead log, 1..=3
/// purged (sled's `meta` tree says so) and covered by a snapshot file.
fn layout_three_dir(dir: &Path) {
    let mut machine = fenced_core::StateMachine::default();
    for e in &history()[..3] {
        if let EntryPayload::Normal(b) = &e.payload {
            machine.apply_batch(e.log_id.index, b);
        }
    }
    let meta = openraft::SnapshotMeta::<NodeId, openraft::BasicNode> {
        last_log_id: Some(log_id(1, 3)),
        last_membership: StoredMembership::default(),
        snapshot_id: "1-3-1".into(),
    };
    let snapshots = fenced_storage::snapshot::SnapshotStore::open(dir).unwrap();
    let file = snapshots.write(&meta, &machine).unwrap();
    snapshots.install(&file, &meta).unwrap();
    fenced_storage::wal::Wal::create_from(dir, history()[3..].to_vec(), Some(3)).unwrap();
    record_old_hard_state(dir);
    let db = sled::open(dir).unwrap();
    let m = db.open_tree("meta").unwrap();
    m.insert("format", &[3u8][..]).unwrap();
    let sealed = fenced_storage::frame::seal(&bincode::serialize(&log_id(1, 3)).unwrap());
    m.insert("last_purged", sealed).unwrap();
    db.flush().unwrap();
}

/// Opened, a layout-3 data dir moves its last purged log id into the `purged` file and loses
/// sled's files; later opens never look for them.
#[tokio::test]
async fn layout_three_data_dir_moves_last_purged_out_of_sled() {
    let dir = TempDir::new().unwrap();
    layout_three_dir(dir.path());
    assert!(!sled_files(dir.path()).is_empty());
    for _ in 0..2 {
        let (mut log, sm) = open(dir.path(), no_events()).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 3)));
        assert_eq!(st.last_log_id, Some(log_id(1, 6)));
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), history()[3..]);
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
        assert_eq!(sm.shared().last_applied(), Some(log_id(1, 3)));
        assert_no_sled(dir.path());
        assert!(dir.path().join(fenced_storage::purged::FILE_NAME).exists());
    }
}

/// A crash after the `purged` file was written but before sled's files were gone: they are
/// removed at the next open and the file wins (sled's stale value is not read). sled's own
/// layout record then says 4, which an older build refuses; with the file lost as well the
/// data dir is refused.
#[tokio::test]
async fn sled_files_left_by_an_interrupted_upgrade_are_removed_and_never_read() {
    let dir = TempDir::new().unwrap();
    layout_three_dir(dir.path());
    drop(open(dir.path(), no_events()).unwrap());
    let leftovers = |format: u8| {
        let db = sled::open(dir.path()).unwrap();
        let m = db.open_tree("meta").unwrap();
        m.insert("format", &[format][..]).unwrap();
        let stale = fenced_storage::frame::seal(&bincode::serialize(&log_id(1, 1)).unwrap());
        m.insert("last_purged", stale).unwrap();
        db.flush().unwrap();
    };
    leftovers(fenced_storage::DATA_DIR_FORMAT);
    {
        let (mut log, _sm) = open(dir.path(), no_events()).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 3)));
        assert_no_sled(dir.path());
    }
    leftovers(fenced_storage::DATA_DIR_FORMAT);
    std::fs::remove_file(dir.path().join(fenced_storage::purged::FILE_NAME)).unwrap();
    assert_refused(
        dir.path(),
        |e| matches!(e, StoreError::Damaged { path, .. } if path.ends_with("purged")),
    );
}

/// [`Io::Inline`]: nothing waits on another thread. On this current-thread runtime with paused
/// time, the ticker below would run (time auto-advances) only if the runtime went idle
/// waiting for something outside it, such as a flusher thread or `spawn_blocking`; it never
/// does, and the paused clock never moves.
#[tokio::test(start_paused = true)]
async fn inline_io_never_leaves_the_task() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let started = tokio::time::Instant::now();
    let dir = TempDir::new().unwrap();
    let entries = history();
    {
        let (mut log, mut sm) = open_with(dir.path(), no_events(), Io::Inline).unwrap();
        sm.digest_every(2);
        log.blocking_append(entries[..4].to_vec()).await.unwrap();
        log.save_vote(&Vote::new(1, 1)).await.unwrap();
        sm.apply(entries[..4].to_vec()).await.unwrap();
        // Digests are taken during apply.
        let at: Vec<u64> = sm.digests().recent().iter().map(|(i, _)| *i).collect();
        assert_eq!(at, [2, 4]);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
        log.blocking_append(entries[4..].to_vec()).await.unwrap();
        log.truncate(log_id(1, 6)).await.unwrap();
        log.save_committed(Some(log_id(1, 5))).await.unwrap();
        log.blocking_append([blank(2, 6)]).await.unwrap();
    }
    assert_eq!(ticks.load(Ordering::Relaxed), 0, "the runtime waited");
    assert_eq!(tokio::time::Instant::now(), started);
    ticker.abort();
    let (mut log, sm) = open_with(dir.path(), no_events(), Io::Inline).unwrap();
    let st = log.get_log_state().await.unwrap();
    assert_eq!(st.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(st.last_log_id, Some(log_id(2, 6)));
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 5)));
    assert_eq!(sm.shared().last_applied(), Some(log_id(1, 4)));
}

#[test]
fn stored_membership_roundtrips_through_bincode() {
    // StoredMembership must survive bincode (used for snapshot meta).
    let m = StoredMembership::new(
        Some(log_id(3, 7)),
        Membership::new(vec![[1u64, 2, 3].into_iter().collect()], None),
    );
    let bytes = bincode::serialize(&m).unwrap();
    let back: StoredMembership<NodeId, openraft::BasicNode> = bincode::deserialize(&bytes).unwrap();
    assert_eq!(back, m);
}

/// What [`fenced_storage::StorageObserver`] was told.
#[derive(Default)]
struct Timings {
    fsyncs: Mutex<Vec<std::time::Duration>>,
    appends: Mutex<Vec<std::time::Duration>>,
    snapshots: Mutex<Vec<(u64, std::time::Duration)>>,
}

impl fenced_storage::StorageObserver for Timings {
    fn wal_fsync(&self, took: std::time::Duration) {
        self.fsyncs.lock().unwrap().push(took);
    }
    fn wal_append(&self, took: std::time::Duration) {
        self.appends.lock().unwrap().push(took);
    }
    fn snapshot_built(&self, bytes: u64, took: std::time::Duration) {
        self.snapshots.lock().unwrap().push((bytes, took));
    }
}

#[tokio::test]
async fn the_observer_sees_every_append_its_fsyncs_and_snapshots_built() {
    let dir = TempDir::new().unwrap();
    let (mut log, mut sm) = open(dir.path(), no_events()).unwrap();
    let timings = Arc::new(Timings::default());
    assert!(log.observe(timings.clone()));
    assert!(
        !log.clone().observe(Arc::new(Timings::default())),
        "one observer per data dir"
    );
    let entries = history();
    for e in &entries {
        log.blocking_append([e.clone()]).await.unwrap();
    }
    let appends = timings.appends.lock().unwrap().len();
    assert_eq!(appends, entries.len(), "one timing per acknowledged append");
    let fsyncs = timings.fsyncs.lock().unwrap().len();
    // Appended one at a time and waited for: one group-commit round (one fsync) each.
    assert_eq!(fsyncs, entries.len());
    assert!(timings.snapshots.lock().unwrap().is_empty());

    sm.apply(entries.clone()).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let snapshots = timings.snapshots.lock().unwrap().clone();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(snapshots[0].0 > 0, "snapshot size {snapshots:?}");
}

/// Replication's read never skips purged entries: from a purged start it returns nothing (the
/// leader then sends a heartbeat, and next its snapshot), never the entries after the purge
/// point, which openraft 0.9 sent after the requested start's predecessor (found by
/// fenced-sim, seed 1008664: a follower appended them and its log had a hole).
#[tokio::test]
async fn replication_reads_nothing_from_a_purged_start() {
    let dir = TempDir::new().unwrap();
    let (mut log, mut sm) = open(dir.path(), no_events()).unwrap();
    let entries: Vec<_> = (1..=10).map(|i| blank(1, i)).collect();
    log.blocking_append(entries.clone()).await.unwrap();
    sm.apply(entries).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    log.purge(log_id(1, 6)).await.unwrap();
    assert!(log.limited_get_log_entries(3, 11).await.unwrap().is_empty());
    let from_7: Vec<u64> = log
        .limited_get_log_entries(7, 11)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(from_7, vec![7, 8, 9, 10]);
}
