//! Raft storage of fenced: log and state machine in one sled `Db`, the vote and the last
//! appended log id in the [`hardstate`] file beside it, the member's identity in
//! [`identity`].
//!
//! * tree `log`: key = log index (big-endian `u64`) → sealed bincode [`openraft::Entry`];
//! * tree `meta`: `format`, `last_purged`, `committed` (sealed bincode);
//! * tree `snapshot`: `meta` (sealed bincode [`SnapshotMeta`]) and `data` (sealed bincode
//!   [`fenced_core::StateMachine`]), always written together in one transaction.
//!
//! Every stored value is sealed by [`frame`]: a format version and a CRC, checked on every
//! read. [`open`] reads and checks everything once (every log entry, the snapshot, the hard
//! state) and refuses a data dir whose log has a hole or ends before the last log id recorded
//! in the hard-state file — sled recovers from a damaged file by silently dropping its tail,
//! which would otherwise let this node vote from a log shorter than what it acknowledged.
//!
//! The state machine lives in memory (see [`SharedState`]) and is rebuilt on [`open`] from the
//! stored snapshot; openraft re-applies the committed log entries after it.
//!
//! Durability: `append` is acknowledged after sled is flushed *and* the hard state records its
//! last log id; `save_vote` writes the hard state; `truncate`, `purge`, `build_snapshot` and
//! `install_snapshot` flush the `Db` before they report success. `save_committed` does not flush
//! (openraft does not need it durable; the next flush carries it). Unreadable bytes on disk
//! become a [`StorageError`], never a panic, and openraft then stops the node.

pub mod datadir;
pub mod frame;
pub mod hardstate;
pub mod identity;

use std::fmt;
use std::io::{self, Cursor};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionError};

openraft::declare_raft_types!(
    /// openraft type configuration of fenced: an entry carries a batch of commands and
    /// answers with one response per command.
    pub TypeConfig:
        D = fenced_core::Batch,
        R = Vec<fenced_core::Response>,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

openraft::declare_raft_types!(
    /// The log entry layout of format 1 (one request per entry, token = log index): only
    /// decoded, and converted on read ([`fenced_core::Batch::legacy`]). Public for tests that
    /// write data dirs of that format.
    pub LegacyTypeConfig:
        D = fenced_core::Request,
        R = fenced_core::Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<LegacyTypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;

/// Called after each applied normal entry with the events it produced (never with an empty
/// slice). It runs on openraft's state machine task: keep it short and non-blocking (e.g. send
/// into a channel).
pub type EventSink = Arc<dyn Fn(&[fenced_core::Event]) + Send + Sync>;

/// sled page cache size. sled's default (1 GiB) is far more than a lock service needs.
pub const CACHE_CAPACITY: u64 = 64 * 1024 * 1024;

/// Legacy (unsealed) location of the vote; moved to the hard-state file on upgrade.
const KEY_VOTE: &[u8] = b"vote";
/// [`frame::VERSION`] of the values in this `Db`; absent in a new or a pre-checksum `Db`.
const KEY_FORMAT: &[u8] = b"format";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_SNAPSHOT_META: &[u8] = b"meta";
const KEY_SNAPSHOT_DATA: &[u8] = b"data";

type StorageResult<T> = Result<T, StorageError<NodeId>>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Errors of this crate, before they are wrapped into openraft's [`StorageError`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt {what} in the data directory: {source}")]
    Corrupt {
        what: &'static str,
        #[source]
        source: bincode::Error,
    },
    #[error("corrupt log: key {key:?} holds an entry with index {index}")]
    LogKeyMismatch { key: Vec<u8>, index: u64 },
    #[error("corrupt {what}: {detail}")]
    Checksum { what: &'static str, detail: String },
    #[error(
        "{what} has format version {found}, this build reads version {supported}: it was \
         written by another version of fenced (not corrupt; run that version, or a newer one)"
    )]
    UnknownFormat {
        what: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("{}: {error}", path.display())]
    File { path: PathBuf, error: io::Error },
    #[error("{} is damaged: {detail}", path.display())]
    Damaged { path: PathBuf, detail: String },
    #[error(
        "the Raft log ends at index {found:?}, but this node recorded appending up to index \
         {recorded} (hard-state file): entries it acknowledged are missing"
    )]
    LogEndsEarly { found: Option<u64>, recorded: u64 },
    #[error("the Raft log has a hole: index {after} is followed by {next}")]
    LogHole { after: u64, next: u64 },
    /// A check of [`open`] failed: the data dir must not be used to vote.
    #[error(
        "refusing the data dir {}: {reason}. This node must not vote from it; see the \
         README, 'Losing a disk', for how to replace the member",
        dir.display()
    )]
    Unusable {
        dir: PathBuf,
        reason: Box<StoreError>,
    },
    /// The data dir cannot be used as it stands (see [`datadir`]).
    #[error("{0}")]
    Refused(String),
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: bincode::Error,
    },
    #[error("state machine lock poisoned (a previous apply panicked)")]
    Poisoned,
}

impl From<TransactionError<StoreError>> for StoreError {
    fn from(e: TransactionError<StoreError>) -> Self {
        match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => StoreError::Sled(e),
        }
    }
}

/// bincode, sealed ([`frame::seal`]).
fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    bincode::serialize(value)
        .map(|b| frame::seal(&b))
        .map_err(|source| StoreError::Encode { what, source })
}

/// The inverse of [`encode`]: check the seal, then decode.
fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    decode_raw(what, frame::unseal(what, bytes)?)
}

fn decode_raw<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    bincode::deserialize(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

/// Decode a sealed log entry of any format this build reads.
fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
    const WHAT: &str = "log entry";
    match frame::unseal_versioned(WHAT, bytes)? {
        (1, payload) => Ok(upgrade_entry(decode_raw(WHAT, payload)?)),
        (_, payload) => decode_raw(WHAT, payload),
    }
}

/// A format-1 entry as the entry it is now: one request whose tokens are its log index.
fn upgrade_entry(old: Entry<LegacyTypeConfig>) -> Entry<TypeConfig> {
    Entry {
        log_id: old.log_id,
        payload: match old.payload {
            EntryPayload::Blank => EntryPayload::Blank,
            EntryPayload::Normal(req) => EntryPayload::Normal(fenced_core::Batch::legacy(req)),
            EntryPayload::Membership(m) => EntryPayload::Membership(m),
        },
    }
}

/// Decode a sealed state machine snapshot of any format this build reads.
fn decode_machine(
    what: &'static str,
    bytes: &[u8],
) -> Result<fenced_core::StateMachine, StoreError> {
    let (version, payload) = frame::unseal_versioned(what, bytes)?;
    let decoded = if version == 1 {
        fenced_core::StateMachine::from_legacy_bytes(payload)
    } else {
        fenced_core::StateMachine::from_bytes(payload)
    };
    decoded
        .map_err(|fenced_core::SnapshotError::Decode(source)| StoreError::Corrupt { what, source })
}

/// fsync a directory, so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|error| StoreError::File {
            path: dir.to_owned(),
            error,
        })
}

/// One fsync at a time: concurrent `flush_async` calls on one sled `Db` were seen to hang
/// (64 concurrent callers in a probe never finished), and the group commit, votes, truncation
/// and snapshots all flush. Process-wide, which also covers several nodes in one test process.
static FLUSH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn flush_db(db: &sled::Db) -> Result<usize, sled::Error> {
    let _one_at_a_time = FLUSH.lock().await;
    db.flush_async().await
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_bound(b: Bound<&u64>) -> Bound<[u8; 8]> {
    match b {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Decode one `log` tree record, checking that the key matches the entry's index.
fn decode_log_record(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
    let entry = decode_entry(value)?;
    if key != index_key(entry.log_id.index) {
        return Err(StoreError::LogKeyMismatch {
            key: key.to_vec(),
            index: entry.log_id.index,
        });
    }
    Ok(entry)
}

/// Open (or create) the store in `dir`: check every stored record (log entries, snapshot,
/// hard state), upgrade a data dir written before records were sealed, and restore the state
/// machine from the stored snapshot.
///
/// A damaged data dir — a record that fails its checksum, a hole in the log, a log that ends
/// before the last log id the hard state recorded, a missing hard-state file — is refused with
/// [`StoreError::Unusable`], never truncated or repaired: a node that votes from it could elect
/// a leader that lacks entries this node acknowledged.
pub fn open(dir: &Path, events: EventSink) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_checked(dir, events).map_err(|e| match e {
        StoreError::Corrupt { .. }
        | StoreError::Checksum { .. }
        | StoreError::LogKeyMismatch { .. }
        | StoreError::Damaged { .. }
        | StoreError::LogEndsEarly { .. }
        | StoreError::LogHole { .. }
        | StoreError::Sled(_) => StoreError::Unusable {
            dir: dir.to_owned(),
            reason: Box::new(e),
        },
        other => other,
    })
}

fn open_sled(dir: &Path) -> Result<sled::Db, StoreError> {
    // sled may panic on some damaged files instead of returning an error.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_CAPACITY)
            .open()
    }))
    .unwrap_or_else(|_| Err(sled::Error::Corruption { at: None, bt: () }))
    .map_err(|e| match e {
        sled::Error::Io(error) => StoreError::File {
            path: dir.to_owned(),
            error,
        },
        e => StoreError::Damaged {
            path: dir.join("db"),
            detail: format!("sled cannot read it ({e})"),
        },
    })
}

fn open_checked(
    dir: &Path,
    events: EventSink,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let db = open_sled(dir)?;
    let log = db.open_tree("log")?;
    let meta = db.open_tree("meta")?;
    let snapshot = db.open_tree("snapshot")?;

    let format = meta.get(KEY_FORMAT)?;
    let sealed = match &format {
        None => false,
        Some(v) if v.len() == 1 && (frame::OLDEST..=frame::VERSION).contains(&v[0]) => true,
        Some(v) => {
            return Err(StoreError::UnknownFormat {
                what: "data dir",
                found: v.first().copied().map_or(0, u32::from),
                supported: u32::from(frame::VERSION),
            })
        }
    };
    let legacy_vote = if sealed {
        None
    } else {
        upgrade_unsealed(&db, &log, &meta, &snapshot)?
    };
    let (last_purged, last_in_log) = check_log(&log, &meta)?;
    let last_index = last_in_log
        .map(|l| l.index)
        .max(last_purged.map(|l| l.index));
    let hard = match hardstate::HardState::open(dir)? {
        Some(h) => h,
        None if sealed => {
            return Err(StoreError::Damaged {
                path: hardstate::HardState::path_in(dir),
                detail: "the file is missing (it holds the vote and the last appended log id)"
                    .into(),
            })
        }
        None => hardstate::HardState::create(
            dir,
            hardstate::HardStateValue {
                vote: legacy_vote,
                last_log_id: last_in_log.max(last_purged),
            },
        )?,
    };
    if let Some(recorded) = hard.value().last_log_id {
        if last_index.is_none_or(|i| i < recorded.index) {
            return Err(StoreError::LogEndsEarly {
                found: last_index,
                recorded: recorded.index,
            });
        }
    }
    if !sealed {
        meta.insert(KEY_FORMAT, &[frame::VERSION])?;
        meta.remove(KEY_VOTE)?;
        db.flush()?;
    } else if format.as_deref() != Some(&[frame::VERSION][..]) {
        // Records of the older format stay and are converted when read; the marker tells an
        // older build that this Db may now hold records it cannot read.
        meta.insert(KEY_FORMAT, &[frame::VERSION])?;
        db.flush()?;
    }
    if let Some(v) = meta.get(KEY_COMMITTED)? {
        decode::<Option<LogId<NodeId>>>("committed log id", &v)?;
    }

    let state = match read_snapshot(&snapshot)? {
        Some((meta, data)) => SmState {
            last_applied: meta.last_log_id,
            membership: meta.last_membership,
            machine: decode_machine("state machine snapshot", &data)?,
        },
        None => SmState::default(),
    };

    let log_store = LogStore {
        db: db.clone(),
        log,
        meta,
        hard: Arc::new(Mutex::new(hard)),
        flusher: Arc::new(std::sync::OnceLock::new()),
    };
    let sm_store = StateMachineStore {
        db,
        snapshot,
        state: Arc::new(RwLock::new(state)),
        events,
        snapshot_seq: 0,
    };
    Ok((log_store, sm_store))
}

/// Read every log record once: each must pass its checksum, sit under its own index, and
/// follow the previous one without a gap. Returns the last purged and the last stored log id.
#[allow(clippy::type_complexity)]
fn check_log(
    log: &sled::Tree,
    meta: &sled::Tree,
) -> Result<(Option<LogId<NodeId>>, Option<LogId<NodeId>>), StoreError> {
    let last_purged: Option<LogId<NodeId>> = match meta.get(KEY_LAST_PURGED)? {
        Some(v) => Some(decode("last purged log id", &v)?),
        None => None,
    };
    let mut last: Option<LogId<NodeId>> = None;
    for record in log.iter() {
        let (k, v) = record?;
        let entry = decode_log_record(&k, &v)?;
        if let Some(prev) = last {
            if entry.log_id.index != prev.index + 1 {
                return Err(StoreError::LogHole {
                    after: prev.index,
                    next: entry.log_id.index,
                });
            }
        }
        last = Some(entry.log_id);
    }
    Ok((last_purged, last))
}

/// Seal the values of a data dir written before records carried a checksum (idempotent: a
/// value that already unseals is left alone). Returns the vote stored there, which moves to
/// the hard-state file.
fn upgrade_unsealed(
    db: &sled::Db,
    log: &sled::Tree,
    meta: &sled::Tree,
    snapshot: &sled::Tree,
) -> Result<Option<Vote<NodeId>>, StoreError> {
    fn reseal<T: Serialize + DeserializeOwned>(
        tree: &sled::Tree,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        let Some(v) = tree.get(key)? else {
            return Ok(None);
        };
        if let Ok(value) = decode::<T>(what, &v) {
            return Ok(Some(value));
        }
        let value: T = decode_raw(what, &v)?;
        tree.insert(key, encode(what, &value)?)?;
        Ok(Some(value))
    }
    let mut upgraded = 0usize;
    for item in log.iter() {
        let (key, value) = item?;
        if decode_entry(&value).is_err() {
            // Unsealed entries predate revisions: one request, token = log index.
            let old: Entry<LegacyTypeConfig> = decode_raw("log entry", &value)?;
            log.insert(key, encode("log entry", &upgrade_entry(old))?)?;
        }
        upgraded += 1;
    }
    reseal::<LogId<NodeId>>(meta, KEY_LAST_PURGED, "last purged log id")?;
    reseal::<Option<LogId<NodeId>>>(meta, KEY_COMMITTED, "committed log id")?;
    reseal::<Meta>(snapshot, KEY_SNAPSHOT_META, "snapshot meta")?;
    if let Some(v) = snapshot.get(KEY_SNAPSHOT_DATA)? {
        if decode_machine("state machine snapshot", &v).is_err() {
            let machine = fenced_core::StateMachine::from_legacy_bytes(&v).map_err(
                |fenced_core::SnapshotError::Decode(source)| StoreError::Corrupt {
                    what: "state machine snapshot",
                    source,
                },
            )?;
            snapshot.insert(KEY_SNAPSHOT_DATA, encode("state machine", &machine)?)?;
        }
    }
    let vote = reseal::<Vote<NodeId>>(meta, KEY_VOTE, "vote")?;
    if upgraded > 0 || vote.is_some() {
        tracing::info!(
            entries = upgraded,
            "sealed the records of a data dir from an older format"
        );
    }
    db.flush()?;
    Ok(vote)
}

// ---------------------------------------------------------------------------------------------
// Log

/// Raft log, vote and commit index. Cheap to clone (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    /// The vote and the last durable log id ([`hardstate`]); std mutex, only held by
    /// blocking tasks.
    hard: Arc<Mutex<hardstate::HardState>>,
    flusher: Arc<std::sync::OnceLock<GroupCommit>>,
}

/// Update the hard state on a blocking thread (it fsyncs).
async fn update_hard(
    hard: &Arc<Mutex<hardstate::HardState>>,
    f: impl FnOnce(&mut hardstate::HardStateValue) + Send + 'static,
) -> Result<(), StoreError> {
    let hard = hard.clone();
    tokio::task::spawn_blocking(move || {
        let mut h = hard.lock().unwrap_or_else(PoisonError::into_inner);
        let mut value = h.value().clone();
        f(&mut value);
        h.write(value)
    })
    .await
    .map_err(|e| StoreError::File {
        path: PathBuf::from(hardstate::FILE_NAME),
        error: io::Error::other(e.to_string()),
    })?
}

/// Group commit of appended log entries: `append` writes its entries and queues its
/// `LogFlushed` callback; one task runs one fsync for everything queued so far, records the
/// last appended log id in the hard state, and then acknowledges those appends, in order. An
/// append is never acknowledged before an fsync that started after its entries were written,
/// and Raft is not held up while the disk works, so appends that arrive during an fsync share
/// the next one.
///
/// Each queued append carries its own handles on the `Db` and the hard state, so the task holds
/// them only while it has work: once the store is dropped and the last fsync acknowledged, the
/// directory can be opened again.
struct GroupCommit {
    queue: tokio::sync::mpsc::UnboundedSender<Flush>,
}

enum Flush {
    Append {
        callback: LogFlushed<TypeConfig>,
        db: sled::Db,
        hard: Arc<Mutex<hardstate::HardState>>,
        last: LogId<NodeId>,
    },
    /// Answered once every append queued before it is acknowledged.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

impl GroupCommit {
    fn start() -> GroupCommit {
        let (queue, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut batch: Vec<Flush> = Vec::new();
            while rx.recv_many(&mut batch, 4096).await > 0 {
                let mut target = None;
                let mut last = None;
                for f in &batch {
                    if let Flush::Append {
                        db, hard, last: l, ..
                    } = f
                    {
                        target.get_or_insert_with(|| (db.clone(), hard.clone()));
                        last = Some(*l);
                    }
                }
                let result = match (target, last) {
                    (Some((db, hard)), Some(last)) => {
                        let flushed = flush_db(&db).await.map_err(StoreError::from);
                        drop(db);
                        match flushed {
                            Ok(_) => update_hard(&hard, move |v| v.last_log_id = Some(last)).await,
                            Err(e) => Err(e),
                        }
                    }
                    _ => Ok(()),
                };
                if let Err(e) = &result {
                    tracing::error!("log fsync failed: {e}");
                }
                for f in batch.drain(..) {
                    match f {
                        Flush::Append { callback, .. } => {
                            let r = match &result {
                                Ok(()) => Ok(()),
                                Err(e) => Err(io::Error::other(e.to_string())),
                            };
                            callback.log_io_completed(r);
                        }
                        Flush::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            }
        });
        GroupCommit { queue }
    }
}

impl fmt::Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

impl LogStore {
    /// Whether anything of Raft is stored: a vote, a log entry, or a purged prefix.
    pub fn holds_state(&self) -> bool {
        let hard = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
        hard.value().vote.is_some()
            || hard.value().last_log_id.is_some()
            || !self.log.is_empty()
            || self.meta.contains_key(KEY_LAST_PURGED).unwrap_or(true)
    }

    /// The membership this store holds: the last membership entry of the log, else none
    /// (then the state machine's, [`SharedState::membership`], applies).
    pub fn last_membership(
        &self,
    ) -> Result<Option<openraft::Membership<NodeId, BasicNode>>, StoreError> {
        for record in self.log.iter().rev() {
            let (k, v) = record?;
            if let EntryPayload::Membership(m) = decode_log_record(&k, &v)?.payload {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// Bytes the whole `Db` (log, meta and snapshot trees) takes on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    fn get_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        match self.meta.get(key)? {
            Some(v) => Ok(Some(decode(what, &v)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(
        &self,
        key: &[u8],
        what: &'static str,
        value: &T,
    ) -> Result<(), StoreError> {
        self.meta.insert(key, encode(what, value)?)?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), StoreError> {
        flush_db(&self.db).await?;
        Ok(())
    }

    /// Wait until every append queued so far is flushed and acknowledged.
    async fn drain_appends(&self) {
        let Some(flusher) = self.flusher.get() else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if flusher.queue.send(Flush::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Write the entries (not flushed); returns the last one's log id.
    fn write_batch<I>(&self, entries: I) -> Result<Option<LogId<NodeId>>, StoreError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>>,
    {
        let mut batch = sled::Batch::default();
        let mut last = None;
        for entry in entries {
            let value = encode("log entry", &entry)?;
            batch.insert(&index_key(entry.log_id.index)[..], value);
            last = Some(entry.log_id);
        }
        self.log.apply_batch(batch)?;
        Ok(last)
    }

    /// Remove every log record whose key is in `range`.
    fn remove_range(&self, range: (Bound<[u8; 8]>, Bound<[u8; 8]>)) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for key in self.log.range(range).keys() {
            batch.remove(key?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let bounds = (key_bound(range.start_bound()), key_bound(range.end_bound()));
        let mut entries = Vec::new();
        for record in self.log.range(bounds) {
            let (k, v) = record.map_err(|e| StorageIOError::read_logs(&e))?;
            let entry = decode_log_record(&k, &v).map_err(|e| StorageIOError::read_logs(&e))?;
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self
            .get_meta(KEY_LAST_PURGED, "last purged log id")
            .map_err(|e| StorageIOError::read_logs(&e))?;
        let last_in_log = match self.log.last().map_err(|e| StorageIOError::read_logs(&e))? {
            Some((k, v)) => Some(
                decode_log_record(&k, &v)
                    .map_err(|e| StorageIOError::read_logs(&e))?
                    .log_id,
            ),
            None => None,
        };
        // After a crash between recording `last_purged` and deleting the entries, stale entries
        // at or below it may remain; never report a last log id below the purged one.
        let last_log_id = last_in_log.max(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let vote = *vote;
        update_hard(&self.hard, move |v| v.vote = Some(vote))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        let hard = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(hard.value().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not flushed on purpose: openraft does not need it durable, and the next flush (every
        // append is flushed) carries it.
        self.put_meta(KEY_COMMITTED, "committed log id", &committed)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let c: Option<Option<LogId<NodeId>>> = self
            .get_meta(KEY_COMMITTED, "committed log id")
            .map_err(|e| StorageIOError::read(&e))?;
        Ok(c.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let last = match self.write_batch(entries) {
            Ok(Some(last)) => last,
            Ok(None) => {
                callback.log_io_completed(Ok(()));
                return Ok(());
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                return Err(StorageIOError::write_logs(&e).into());
            }
        };
        // Acknowledged by the group commit once an fsync covering these entries is done and
        // the hard state records them.
        let flusher = self.flusher.get_or_init(GroupCommit::start);
        let queued = flusher.queue.send(Flush::Append {
            callback,
            db: self.db.clone(),
            hard: self.hard.clone(),
            last,
        });
        if let Err(tokio::sync::mpsc::error::SendError(Flush::Append { callback, .. })) = queued {
            // The flusher is gone (runtime shutting down): flush here instead.
            let result = match self.flush().await {
                Ok(()) => update_hard(&self.hard, move |v| v.last_log_id = Some(last)).await,
                Err(e) => Err(e),
            };
            let r = result
                .as_ref()
                .map(|_| ())
                .map_err(|e| io::Error::other(e.to_string()));
            callback.log_io_completed(r);
            result.map_err(|e| StorageIOError::write_logs(&e))?;
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "truncate log from");
        // The hard state first records the shorter log: a crash before the entries are gone
        // leaves a log longer than recorded, which is harmless; the reverse would look like
        // lost entries. Appends still in the group commit would record their (now removed)
        // ids after this, so let them finish first.
        self.drain_appends().await;
        let before = match log_id.index.checked_sub(1) {
            Some(prev) => self
                .try_get_log_entries(prev..=prev)
                .await?
                .pop()
                .map(|e| e.log_id),
            None => None,
        };
        let last_purged: Option<LogId<NodeId>> = self
            .get_meta(KEY_LAST_PURGED, "last purged log id")
            .map_err(|e| StorageIOError::read_logs(&e))?;
        let remaining = before.max(last_purged);
        update_hard(&self.hard, move |v| v.last_log_id = remaining)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.remove_range((Bound::Included(index_key(log_id.index)), Bound::Unbounded))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "purge log up to");
        // Record first: a crash between the two steps leaves only harmless stale entries.
        self.put_meta(KEY_LAST_PURGED, "last purged log id", &log_id)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.remove_range((Bound::Unbounded, Bound::Included(index_key(log_id.index))))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Purging past the last entry (after a snapshot was installed) makes the purged id the
        // last log id.
        update_hard(&self.hard, move |v| {
            if v.last_log_id.is_none_or(|l| l.index < log_id.index) {
                v.last_log_id = Some(log_id);
            }
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// State machine

#[derive(Clone, Default)]
struct SmState {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    machine: fenced_core::StateMachine,
}

/// Read handle on the applied state, for the server (lock info, deadlines, log time).
///
/// Each call takes the std `RwLock` for reading for the duration of the call only; keep the
/// closure given to [`SharedState::read`] short (apply waits for it). Safe to call from the
/// [`EventSink`], which runs with no lock held.
#[derive(Clone)]
pub struct SharedState(Arc<RwLock<SmState>>);

impl SharedState {
    fn read_guard(&self) -> RwLockReadGuard<'_, SmState> {
        // A poisoned lock means an apply panicked; that panic already stops the Raft node.
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `f` over the state machine as of the last applied entry.
    pub fn read<T>(&self, f: impl FnOnce(&fenced_core::StateMachine) -> T) -> T {
        f(&self.read_guard().machine)
    }

    /// Log id of the last applied entry (normal, blank or membership).
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        self.read_guard().last_applied
    }

    /// The last membership applied to the state machine.
    pub fn membership(&self) -> StoredMembership<NodeId, BasicNode> {
        self.read_guard().membership.clone()
    }
}

impl fmt::Debug for SharedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedState")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

/// The replicated state machine ([`fenced_core::StateMachine`]) and its snapshots.
pub struct StateMachineStore {
    db: sled::Db,
    snapshot: sled::Tree,
    state: Arc<RwLock<SmState>>,
    events: EventSink,
    snapshot_seq: u64,
}

impl fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("state", &self.shared())
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// A cheap, cloneable read handle on the applied state.
    pub fn shared(&self) -> SharedState {
        SharedState(self.state.clone())
    }

    fn read_state(&self) -> RwLockReadGuard<'_, SmState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Read the stored snapshot (meta and data) consistently.
fn read_snapshot(tree: &sled::Tree) -> Result<Option<(Meta, Vec<u8>)>, StoreError> {
    let pair = tree.transaction(|tx| {
        let meta = tx.get(KEY_SNAPSHOT_META)?;
        let data = tx.get(KEY_SNAPSHOT_DATA)?;
        Ok::<_, ConflictableTransactionError<StoreError>>((meta, data))
    })?;
    match pair {
        (Some(meta), Some(data)) => Ok(Some((decode("snapshot meta", &meta)?, data.to_vec()))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(StoreError::Corrupt {
            what: "snapshot",
            source: Box::new(bincode::ErrorKind::Custom(
                "snapshot meta and data are not both present".into(),
            )),
        }),
    }
}

/// Store `meta` + `data` as the current snapshot unless a newer one is already stored (a slow
/// `build_snapshot` may finish after `install_snapshot` stored a newer one), then flush.
async fn write_snapshot(
    db: &sled::Db,
    tree: &sled::Tree,
    meta: &Meta,
    data: &[u8],
) -> Result<(), StoreError> {
    let meta_bytes = encode("snapshot meta", meta)?;
    tree.transaction(|tx| {
        if let Some(current) = tx.get(KEY_SNAPSHOT_META)? {
            let current: Meta =
                decode("snapshot meta", &current).map_err(ConflictableTransactionError::Abort)?;
            if current.last_log_id > meta.last_log_id {
                return Ok(());
            }
        }
        tx.insert(KEY_SNAPSHOT_META, meta_bytes.as_slice())?;
        tx.insert(KEY_SNAPSHOT_DATA, data)?;
        Ok(())
    })?;
    flush_db(db).await?;
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let st = self.read_state();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Vec<fenced_core::Response>>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = entries.into_iter();
        let mut replies = Vec::with_capacity(entries.size_hint().0);
        for entry in entries {
            let log_id = entry.log_id;
            let (response, events) = {
                let mut st = self
                    .state
                    .write()
                    .map_err(|_| StorageIOError::apply(log_id, &StoreError::Poisoned))?;
                st.last_applied = Some(log_id);
                match entry.payload {
                    EntryPayload::Blank => (Vec::new(), Vec::new()),
                    EntryPayload::Normal(batch) => {
                        let applied = st.machine.apply_batch(log_id.index, &batch);
                        (applied.responses, applied.events)
                    }
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(log_id), m);
                        (Vec::new(), Vec::new())
                    }
                }
            };
            if !events.is_empty() {
                (self.events)(&events);
            }
            replies.push(response);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        let state = self.read_state().clone();
        SnapshotBuilder {
            db: self.db.clone(),
            tree: self.snapshot.clone(),
            state,
            seq: self.snapshot_seq,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let machine = decode_machine("received snapshot", &data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        write_snapshot(&self.db, &self.snapshot, meta, &data)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let new_state = SmState {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            machine,
        };
        let mut st = self.state.write().map_err(|_| {
            StorageIOError::write_state_machine(AnyError::new(&StoreError::Poisoned))
        })?;
        *st = new_state;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored =
            read_snapshot(&self.snapshot).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// A consistent copy of the state taken by `get_snapshot_builder`; `build_snapshot` serializes
/// and stores it while `apply` continues.
pub struct SnapshotBuilder {
    db: sled::Db,
    tree: sled::Tree,
    state: SmState,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let data = encode("state machine", &self.state.machine)
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let snapshot_id = match self.state.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.seq),
            None => format!("0-0-{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: self.state.last_applied,
            last_membership: self.state.membership.clone(),
            snapshot_id,
        };
        write_snapshot(&self.db, &self.tree, &meta, &data)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
