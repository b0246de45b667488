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
mod open;
pub mod restore;
pub mod snapshot;
pub mod wal;

pub use digests::DigestLog;
pub use log::LogStore;
pub use observe::StorageObserver;

use open::open_checked;

use std::fmt;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use fenced_raft_types::{NodeId, SnapshotFile, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::TransactionError;

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
