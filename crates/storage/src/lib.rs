//! Raft storage of fenced: the log in a write-ahead log of its own ([`wal`]), the vote and
//! the last durable log id in the [`hardstate`] file, snapshots and a few meta records in one
//! sled `Db`. The member's identity file (`fenced_raft_types::identity`) lives beside them;
//! [`datadir`] applies its rules when a data dir is opened.
//!
//! * `wal/`: segment files of sealed bincode [`openraft::Entry`] records ([`wal`]);
//! * sled tree `meta`: `format` ([`DATA_DIR_FORMAT`]) and `last_purged` (sealed bincode;
//!   layouts 1 and 2 kept `committed` here too);
//! * sled tree `snapshot`: `meta` (sealed bincode [`SnapshotMeta`]) and `data` (sealed bincode
//!   [`fenced_core::StateMachine`]), always written together in one transaction;
//! * sled tree `log`: the log of layouts 1 and 2, moved into the `wal` when such a data dir is
//!   opened.
//!
//! Every stored value is sealed by [`frame`]: a format version and a CRC, checked on every
//! read. [`open`] reads and checks everything once (every log entry, the snapshot, the hard
//! state) and refuses a data dir whose log is damaged, has a hole or ends before the last log
//! id recorded in the hard-state file: such a node could vote from a log shorter than what it
//! acknowledged.
//!
//! The state machine lives in memory (see [`SharedState`]) and is rebuilt on [`open`] from the
//! stored snapshot; openraft re-applies the committed log entries after it.
//!
//! Durability: `append` is acknowledged after the log is fdatasync'ed *and* the hard state
//! records its last log id (group commit, [`wal::Flusher`]); `save_vote` writes the hard state;
//! `truncate` and `purge` sync before they report success, as do `build_snapshot` and
//! `install_snapshot` (a sled flush). `save_committed` only remembers the value; the next
//! hard-state record carries it (openraft does not need it durable). Unreadable bytes on disk become a [`StorageError`], never a panic, and openraft
//! then stops the node.

pub mod alarm;
pub mod datadir;
pub mod digests;
pub mod frame;
pub mod hardstate;
pub mod inspect;
mod log;
pub mod observe;
pub mod restore;
pub mod snapshot;
pub mod wal;

pub use digests::DigestLog;
pub use log::LogStore;
pub use observe::StorageObserver;

use std::fmt;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use fenced_raft_types::{NodeId, SnapshotFile, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionError};

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

/// Called after each applied normal entry with the events it produced (never with an empty
/// slice). It runs on openraft's state machine task: keep it short and non-blocking (e.g. send
/// into a channel).
pub type EventSink = Arc<dyn Fn(&[fenced_core::Event]) + Send + Sync>;

/// sled page cache size. sled's default (1 GiB) is far more than a lock service needs.
pub const CACHE_CAPACITY: u64 = 64 * 1024 * 1024;

/// Legacy (unsealed) location of the vote; moved to the hard-state file on upgrade.
const KEY_VOTE: &[u8] = b"vote";
/// The data dir's layout version ([`DATA_DIR_FORMAT`]); absent in a pre-checksum `Db`.
const KEY_FORMAT: &[u8] = b"format";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_COMMITTED: &[u8] = b"committed";
/// Layout of the data dir this build writes: 1 and 2 kept the Raft log in sled's `log` tree
/// (records of [`frame`] version 1 and 2); 3 keeps it in the [`wal`]. Older layouts are
/// upgraded when opened; an older build refuses a layout-3 dir as "written by another
/// version".
pub const DATA_DIR_FORMAT: u8 = 3;
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
    #[error("corrupt log: the place of entry {expected} holds entry {found}")]
    MisplacedEntry { expected: u64, found: u64 },
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
    /// Reading or writing the identity file.
    #[error(transparent)]
    Identity(#[from] fenced_raft_types::identity::IdentityError),
}

impl StoreError {
    /// An I/O error on `path`.
    pub(crate) fn file(path: &Path, error: std::io::Error) -> StoreError {
        StoreError::File {
            path: path.to_owned(),
            error,
        }
    }
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
        .map_err(|error| StoreError::file(dir, error))
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
        | StoreError::MisplacedEntry { .. }
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

/// How long [`open_sled`] waits for a just-closed handle of the same data dir to let go of
/// its file lock.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// sled's refusal while another handle holds the data dir's file lock.
fn is_lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

fn open_sled(dir: &Path) -> Result<sled::Db, StoreError> {
    // sled may panic on some damaged files instead of returning an error.
    let attempt = || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sled::Config::new()
                .path(dir)
                .cache_capacity(CACHE_CAPACITY)
                .open()
        }))
        .unwrap_or_else(|_| Err(sled::Error::Corruption { at: None, bt: () }))
    };
    // A handle dropped in this process releases the lock only when sled's background thread
    // has ended: a data dir opened again right after (a restore or `--force-new-cluster`
    // that then starts the node, or a test) waits for it, briefly. Another process that
    // holds the lock still gets the error.
    let give_up = std::time::Instant::now() + SLED_LOCK_WAIT;
    let mut opened = attempt();
    while opened.as_ref().is_err_and(is_lock_held) && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(20));
        opened = attempt();
    }
    opened.map_err(|e| match e {
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
    let sled_log = db.open_tree("log")?;
    let meta = db.open_tree("meta")?;
    let snapshot = db.open_tree("snapshot")?;

    let format = match meta.get(KEY_FORMAT)? {
        None => None,
        Some(v) if v.len() == 1 && (1..=DATA_DIR_FORMAT).contains(&v[0]) => Some(v[0]),
        Some(v) => {
            return Err(StoreError::UnknownFormat {
                what: "data dir",
                found: v.first().copied().map_or(0, u32::from),
                supported: u32::from(DATA_DIR_FORMAT),
            })
        }
    };
    let legacy_vote = match format {
        None => upgrade_unsealed(&db, &sled_log, &meta, &snapshot)?,
        Some(_) => None,
    };
    let last_purged: Option<LogId<NodeId>> = match meta.get(KEY_LAST_PURGED)? {
        Some(v) => Some(decode("last purged log id", &v)?),
        None => None,
    };
    let hard = match hardstate::HardState::open(dir)? {
        Some(h) => h,
        None if format.is_some() => {
            return Err(StoreError::Damaged {
                path: hardstate::HardState::path_in(dir),
                detail: "the file is missing (it holds the vote and the last appended log id)"
                    .into(),
            })
        }
        None => {
            let last_in_log = check_log(&sled_log)?;
            hardstate::HardState::create(
                dir,
                hardstate::HardStateValue {
                    vote: legacy_vote,
                    last_log_id: last_in_log.max(last_purged),
                    committed: None,
                },
            )?
        }
    };
    let recorded = hard.value().last_log_id;
    if format.is_none_or(|f| f < DATA_DIR_FORMAT) {
        move_log_out_of_sled(dir, &db, &sled_log, &meta, last_purged, recorded)?;
    } else if !sled_log.is_empty() {
        // A copy left by an upgrade interrupted after the log had moved.
        sled_log.clear()?;
        db.flush()?;
    }
    let wal = wal::Wal::open(dir, recorded, last_purged.map(|l| l.index))?;
    // Layouts 1 and 2 kept the committed log id in sled; the hard state holds it now.
    let legacy_committed = match meta.get(KEY_COMMITTED)? {
        Some(v) => decode::<Option<LogId<NodeId>>>("committed log id", &v)?,
        None => None,
    };

    let snapshots = snapshot::SnapshotStore::open(dir)?;
    move_snapshot_out_of_sled(&db, &snapshot, &snapshots)?;
    let state = match snapshots.current()? {
        Some((_, path)) => {
            let (meta, machine) = snapshot::load(&path)?;
            SmState {
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
                machine,
            }
        }
        None => SmState::default(),
    };
    // Entries are purged only once a snapshot covers them.
    if let Some(p) = last_purged {
        if state.last_applied.is_none_or(|l| l.index < p.index) {
            return Err(StoreError::Damaged {
                path: snapshots.current_path(),
                detail: format!(
                    "the log was purged up to index {}, but no snapshot covers it (the \
                     snapshot reaches {:?})",
                    p.index,
                    state.last_applied.map(|l| l.index)
                ),
            });
        }
    }

    let hook = observe::Hook::default();
    let log_store = LogStore::new(db, meta, wal, hard, legacy_committed, hook.clone())?;
    let sm_store = StateMachineStore {
        snapshots: Arc::new(snapshots),
        state: Arc::new(RwLock::new(state)),
        events,
        snapshot_seq: 0,
        hook,
        digester: digests::Digester::default(),
    };
    Ok((log_store, sm_store))
}

/// Upgrade a data dir that keeps its Raft log in sled (layouts 1 and 2): check the log as
/// [`wal::Wal::open`] would (every record, no hole, no shorter than `recorded`), write it into
/// the write-ahead log, durably, then mark the layout and drop sled's copy. A crash at any
/// point leaves either the old layout (the upgrade runs again) or the new one.
fn move_log_out_of_sled(
    dir: &Path,
    db: &sled::Db,
    sled_log: &sled::Tree,
    meta: &sled::Tree,
    last_purged: Option<LogId<NodeId>>,
    recorded: Option<LogId<NodeId>>,
) -> Result<(), StoreError> {
    let last_in_log = check_log(sled_log)?;
    let last_index = last_in_log
        .map(|l| l.index)
        .max(last_purged.map(|l| l.index));
    if let Some(r) = recorded {
        if last_index.is_none_or(|i| i < r.index) {
            return Err(StoreError::LogEndsEarly {
                found: last_index,
                recorded: r.index,
            });
        }
    }
    let mut entries = Vec::new();
    for record in sled_log.iter() {
        let (k, v) = record?;
        entries.push(decode_log_record(&k, &v)?);
    }
    let moved = entries.len();
    wal::Wal::create_from(dir, entries, last_purged.map(|l| l.index))?;
    meta.insert(KEY_FORMAT, &[DATA_DIR_FORMAT])?;
    meta.remove(KEY_VOTE)?;
    db.flush()?;
    sled_log.clear()?;
    db.flush()?;
    if moved > 0 {
        tracing::info!(
            entries = moved,
            "moved the Raft log out of sled into the write-ahead log"
        );
    }
    Ok(())
}

/// Read every record of a sled-kept log (layouts 1 and 2) once: each must pass its checksum,
/// sit under its own index, and follow the previous one without a gap. Returns the last
/// stored log id.
fn check_log(log: &sled::Tree) -> Result<Option<LogId<NodeId>>, StoreError> {
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
    Ok(last)
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

    /// A consistent copy of the applied state (O(1): the tables are copy-on-write) and the
    /// meta of a snapshot of it: what `fenced snapshot save` streams
    /// ([`snapshot::write_to`]).
    pub fn backup(&self) -> (Meta, fenced_core::StateMachine) {
        let st = self.read_guard().clone();
        let snapshot_id = match st.last_applied {
            Some(l) => format!("backup-{}-{}", l.leader_id.term, l.index),
            None => "backup-0-0".to_owned(),
        };
        let meta = SnapshotMeta {
            last_log_id: st.last_applied,
            last_membership: st.membership,
            snapshot_id,
        };
        (meta, st.machine)
    }
}

impl fmt::Debug for SharedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedState")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

/// Move a snapshot kept in sled (before snapshots were files) into the snapshot directory,
/// then drop sled's copy. A crash in between leaves both, and the move runs again.
fn move_snapshot_out_of_sled(
    db: &sled::Db,
    tree: &sled::Tree,
    snapshots: &snapshot::SnapshotStore,
) -> Result<(), StoreError> {
    let Some((meta, data)) = read_snapshot(tree)? else {
        return Ok(());
    };
    if snapshots
        .current()?
        .is_none_or(|(have, _)| have.last_log_id < meta.last_log_id)
    {
        let machine = decode_machine("state machine snapshot", &data)?;
        let path = snapshots.write(&meta, &machine)?;
        snapshots.install(&path, &meta)?;
        tracing::info!(id = %meta.snapshot_id, "moved the snapshot out of sled into a file");
    }
    tree.clear()?;
    db.flush()?;
    Ok(())
}

/// Read the snapshot a data dir of an older layout kept in sled (meta and data).
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

/// The replicated state machine ([`fenced_core::StateMachine`]) and its snapshots.
pub struct StateMachineStore {
    snapshots: Arc<snapshot::SnapshotStore>,
    state: Arc<RwLock<SmState>>,
    events: EventSink,
    snapshot_seq: u64,
    /// Shared with the [`LogStore`] opened with it ([`LogStore::observe`]).
    hook: observe::Hook,
    /// Digests of the state at every N-th index, for the divergence alarm ([`digests`]).
    digester: digests::Digester,
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

    /// Digest the state after every `every`-th log index (0: never), off the apply path;
    /// the digests land in [`StateMachineStore::digests`] ([`digests`]).
    pub fn digest_every(&mut self, every: u64) {
        self.digester.start(every);
    }

    /// The digests this replica computed lately.
    pub fn digests(&self) -> DigestLog {
        self.digester.log()
    }

    /// **Test only**: once the entry at `index` (or the first after it) is applied, change
    /// this replica's state as no other replica does ([`digests::DIVERGED_KEY`]), so that the
    /// divergence alarm can be tested. The server enables it only from a hidden flag guarded
    /// by an environment variable.
    pub fn diverge_at_for_tests(&mut self, index: u64) {
        self.digester.set_diverge_at(index);
    }
}

/// What the server's snapshot trigger weighs: bytes of log on disk against the size of the
/// last snapshot. Cheap to clone; reads only sizes.
#[derive(Clone)]
pub struct CompactionGauge {
    log: LogStore,
    snapshots: Arc<snapshot::SnapshotStore>,
}

impl CompactionGauge {
    pub fn new(log: &LogStore, state_machine: &StateMachineStore) -> CompactionGauge {
        CompactionGauge {
            log: log.clone(),
            snapshots: state_machine.snapshots.clone(),
        }
    }

    /// Bytes the write-ahead log's segments take on disk.
    pub fn log_bytes(&self) -> u64 {
        self.log.size_on_disk()
    }

    /// Size of the current snapshot file (0 without one).
    pub fn snapshot_bytes(&self) -> u64 {
        std::fs::metadata(self.snapshots.current_path()).map_or(0, |m| m.len())
    }
}

/// Run blocking snapshot I/O off the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::File {
            path: PathBuf::from(snapshot::DIR),
            error: io::Error::other(e.to_string()),
        })?
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
                let applied = match entry.payload {
                    EntryPayload::Blank => (Vec::new(), Vec::new()),
                    EntryPayload::Normal(batch) => {
                        self.digester.applied_batch(batch.semantics);
                        let applied = st.machine.apply_batch(log_id.index, &batch);
                        (applied.responses, applied.events)
                    }
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(log_id), m);
                        (Vec::new(), Vec::new())
                    }
                };
                self.digester.applied(log_id.index, &mut st.machine);
                applied
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
        // O(1): the state's tables are copy-on-write (fenced_core::cow); apply goes on while
        // the builder writes this copy out.
        let state = self.read_state().clone();
        SnapshotBuilder {
            snapshots: self.snapshots.clone(),
            state,
            seq: self.snapshot_seq,
            hook: self.hook.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<SnapshotFile>> {
        let file = self
            .snapshots
            .receiving()
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        mut snapshot: Box<SnapshotFile>,
    ) -> StorageResult<()> {
        let err = |e: StoreError| StorageIOError::read_snapshot(Some(meta.signature()), &e);
        snapshot
            .sync()
            .await
            .map_err(|e| err(StoreError::file(snapshot.path(), e)))?;
        let mut path = snapshot.path().to_owned();
        drop(snapshot);
        if path.parent() != Some(self.snapshots.dir()) {
            // Not a file of `begin_receiving_snapshot` (openraft's storage test suite hands
            // over the leader's own): install a copy, never move someone else's file.
            let own = self.snapshots.receiving().map_err(err)?.path().to_owned();
            let (from, to) = (path, own.clone());
            blocking(move || {
                std::fs::copy(&from, &to)
                    .and_then(|_| std::fs::File::open(&to)?.sync_all())
                    .map_err(|error| StoreError::File { path: from, error })
            })
            .await
            .map_err(err)?;
            path = own;
        }
        let checked = path.clone();
        let (stored_meta, machine) = match blocking(move || snapshot::load(&checked)).await {
            Ok(loaded) => loaded,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(err(e).into());
            }
        };
        if &stored_meta != meta {
            let _ = std::fs::remove_file(&path);
            return Err(err(StoreError::Checksum {
                what: "received snapshot",
                detail: format!(
                    "it describes snapshot {}, the leader announced {}",
                    stored_meta.snapshot_id, meta.snapshot_id
                ),
            })
            .into());
        }
        let store = self.snapshots.clone();
        let m = meta.clone();
        blocking(move || store.install(&path, &m))
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
        let err = |e: StoreError| StorageIOError::read_snapshot(None, &e);
        let Some((meta, path)) = self.snapshots.current().map_err(err)? else {
            return Ok(None);
        };
        let file = SnapshotFile::open(&path).map_err(|e| err(StoreError::file(&path, e)))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

/// A consistent copy of the state taken by `get_snapshot_builder` (O(1), copy-on-write);
/// `build_snapshot` writes it into a snapshot file while `apply` continues.
pub struct SnapshotBuilder {
    snapshots: Arc<snapshot::SnapshotStore>,
    state: SmState,
    seq: u64,
    hook: observe::Hook,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let started = std::time::Instant::now();
        let snapshot_id = match self.state.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.seq),
            None => format!("0-0-{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: self.state.last_applied,
            last_membership: self.state.membership.clone(),
            snapshot_id,
        };
        let err = |e: StoreError| StorageIOError::write_snapshot(Some(meta.signature()), &e);
        let (store, m, machine) = (
            self.snapshots.clone(),
            meta.clone(),
            self.state.machine.clone(),
        );
        let path = blocking(move || {
            let path = store.write(&m, &machine)?;
            store.install(&path, &m)?;
            Ok(store.current_path())
        })
        .await
        .map_err(err)?;
        let file = SnapshotFile::open(&path).map_err(|e| err(StoreError::file(&path, e)))?;
        let (bytes, took) = (
            std::fs::metadata(&path).map_or(0, |m| m.len()),
            started.elapsed(),
        );
        if let Some(o) = self.hook.get() {
            o.snapshot_built(bytes, took);
        }
        tracing::info!(
            id = %meta.snapshot_id,
            bytes,
            ms = took.as_millis() as u64,
            "snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}
