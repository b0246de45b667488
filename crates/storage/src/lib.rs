//! Raft storage of fenced: the log in a write-ahead log of its own ([`wal`]), the vote and
//! the last durable log id in the [`hardstate`] file, the last purged log id in the
//! [`purged`] file, snapshots in files ([`snapshot`]). The member's identity file
//! (`fenced_raft_types::identity`) lives beside them; [`datadir`] applies its rules when a
//! data dir is opened.
//!
//! Data dirs of older layouts kept records in one sled `Db` (tree `meta`: `format`, `vote`,
//! `last_purged`, `committed`; tree `snapshot`; tree `log`); [`open`] moves them out once
//! (see `open.rs`) and removes sled's files. sled is never opened otherwise.
//!
//! Every stored value is sealed by [`frame`]: a format version and a CRC, checked on every
//! read. [`open`] reads and checks everything once (every log entry, the snapshot, the hard
//! state, the purged log id) and refuses a data dir whose log is damaged, has a hole or ends
//! before the last log id recorded in the hard-state file: such a node could vote from a log
//! shorter than what it acknowledged.
//!
//! The state machine lives in memory (see [`SharedState`]) and is rebuilt on [`open`] from the
//! stored snapshot; openraft re-applies the committed log entries after it.
//!
//! Durability: `append` is acknowledged after the log is fdatasync'ed (group commit,
//! [`wal::Flusher`]); the hard state then records its last log id, off the acknowledgement's
//! path and never naming an entry not yet durable; `save_vote` writes the hard state;
//! `truncate` and `purge` sync before they report success, as do `build_snapshot` and
//! `install_snapshot`. `save_committed` only remembers the value; the next hard-state record
//! carries it (openraft does not need it durable). Unreadable bytes on disk become a
//! [`StorageError`](openraft::StorageError), never a panic, and openraft then stops the node.
//!
//! Where the blocking part of that work runs — threads, or inline in the calling task — and
//! the file system every file is read and written through ([`fenced_fs::Fs`]: the real one,
//! or the simulator's disk) are chosen per store ([`Env`], [`open_with`]). sled alone (only
//! opened to upgrade a data dir of an older layout) does its own file I/O.

pub mod alarm;
pub mod datadir;
pub mod digests;
pub mod frame;
pub mod hardstate;
pub mod inspect;
mod log;
pub mod observe;
mod open;
pub mod planted;
pub mod purged;
pub mod quarantine;
pub mod restore;
pub mod snapshot;
mod state;
pub mod wal;

pub use digests::DigestLog;
pub use log::{CommittedIndex, LogStore};
pub use observe::StorageObserver;
pub use state::{CompactionGauge, SharedState, SnapshotBuilder, StateMachineStore};

pub(crate) use open::has_sled;
use open::open_checked;

use std::fmt;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::{Fs, Mode};
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::{BasicNode, Entry, EntryPayload, SnapshotMeta};
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
/// (records of [`frame`] version 1 and 2); 3 keeps it in the [`wal`] and the last purged log
/// id in sled; 4 has no sled at all (the last purged log id in the [`purged`] file). Older
/// layouts are upgraded when opened, and their sled files removed. A layout-4 dir has no
/// sled `format` record; sled's files left by an interrupted upgrade carry 4, which an older
/// build refuses as "written by another version" (and an older build refuses a dir without
/// sled files whose identity is ready, as one that lost its Raft state).
pub const DATA_DIR_FORMAT: u8 = 4;
/// The last layout that kept records in sled.
const LAST_SLED_FORMAT: u8 = 3;
const KEY_SNAPSHOT_META: &[u8] = b"meta";
const KEY_SNAPSHOT_DATA: &[u8] = b"data";

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Errors of this crate, before they are wrapped into openraft's
/// [`StorageError`](openraft::StorageError).
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

/// `mkdir -p dir`, durably: each directory created is fsynced into its parent, so that a
/// power loss cannot take a data dir away with everything synced inside it (a directory's
/// own name lives in its parent, which nothing else syncs). Nothing to do if `dir` exists.
pub(crate) fn create_dir_all_durably(fs: &dyn Fs, dir: &Path) -> Result<(), StoreError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|a| !fs.exists(a)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    fs.create_dir_all(dir)
        .map_err(|error| StoreError::file(dir, error))?;
    for created in missing.into_iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(fs, parent)?;
        }
    }
    Ok(())
}

/// fsync a directory, so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(fs: &dyn Fs, dir: &Path) -> Result<(), StoreError> {
    fs.sync_dir(dir)
        .map_err(|error| StoreError::file(dir, error))
}

/// Durably replace `dir/name` with `bytes`: write `dir/tmp`, fsync it, rename it over `name`,
/// fsync `dir`. A crash leaves the old file or the new one, never a mix (the `purged` file,
/// the divergence alarm).
pub(crate) fn replace_file(
    fs: &dyn Fs,
    dir: &Path,
    name: &str,
    tmp: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let (tmp, path) = (dir.join(tmp), dir.join(name));
    fs.open(&tmp, Mode::Truncate)
        .and_then(|f| {
            f.write_all_at(bytes, 0)?;
            f.sync_all()
        })
        .map_err(|e| StoreError::file(&tmp, e))?;
    fs.rename(&tmp, &path)
        .map_err(|e| StoreError::file(&path, e))?;
    sync_dir(fs, dir)
}

/// Where a store runs its blocking work: the `fdatasync`s of the group commit, hard-state
/// writes, snapshot files and state digests. Chosen per store when it is opened
/// ([`open_with`], [`datadir::open_with`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Io {
    /// Off the async runtime (production): the group commit on a flusher thread of its own
    /// ([`wal::Flusher`]), hard-state and snapshot I/O in `spawn_blocking`, digests on a
    /// digest thread.
    #[default]
    Threads,
    /// Synchronously, in the calling task, at once: `append` has written, `fdatasync`ed the
    /// log, recorded the hard state and called openraft's callback before it returns; a digest
    /// is computed during `apply`; snapshot files are written and read in the task. Nothing
    /// waits on another thread, so a single-threaded runtime with paused time (the
    /// simulator) stays deterministic.
    Inline,
    /// The production code paths on a simulator's executor ([`TaskIo`]): the group commit and
    /// its recorder run the same rounds and passes as [`Io::Threads`]'s threads, as tasks, each
    /// `fdatasync`'s completion (and each hard-state or snapshot write run where production
    /// runs `spawn_blocking`) delayed by a latency drawn from a seeded generator. So an append
    /// is acknowledged later than it returns, and openraft's pending flush is open while the
    /// next message is handled. Digests and snapshot file reads and writes stay inline
    /// ([`Io::inline`]).
    Tasks(Arc<TaskIo>),
}

/// The simulator's disk timing for [`Io::Tasks`]: a seeded latency per sync, and the node's
/// life (a crashed node's tasks do nothing more when they wake).
pub struct TaskIo {
    rng: std::sync::Mutex<rand::rngs::StdRng>,
    alive: std::sync::atomic::AtomicBool,
}

impl TaskIo {
    /// Latencies drawn from `seed`.
    pub fn new(seed: u64) -> Arc<TaskIo> {
        use rand::SeedableRng;
        Arc::new(TaskIo {
            rng: std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            alive: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The node crashed: its flusher, recorder and pending writes stop where they are (what
    /// they have not done yet is never done, as in a killed process).
    pub fn kill(&self) {
        self.alive.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn alive(&self) -> bool {
        self.alive.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The next sync's latency: 9 in 10 between 20 µs and 1 ms, the rest up to 12 ms (a slow
    /// disk's tail), so that a flush is often still pending a network hop later.
    pub fn latency(&self) -> std::time::Duration {
        use rand::Rng;
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let us = if rng.gen_bool(0.9) {
            rng.gen_range(20..=1_000)
        } else {
            rng.gen_range(1_000..=12_000)
        };
        std::time::Duration::from_micros(us)
    }

    /// Sleep one latency on the (simulated) clock; `false` if the node crashed meanwhile.
    pub async fn delay(&self) -> bool {
        tokio::time::sleep(self.latency()).await;
        self.alive()
    }
}

impl fmt::Debug for TaskIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskIo")
            .field("alive", &self.alive())
            .finish_non_exhaustive()
    }
}

impl PartialEq for TaskIo {
    fn eq(&self, other: &TaskIo) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for TaskIo {}

impl Io {
    /// Whether snapshot file I/O ([`SnapshotFile`](fenced_raft_types::SnapshotFile)) and
    /// digests run inline: with [`Io::Inline`] and [`Io::Tasks`].
    pub fn inline(&self) -> bool {
        !matches!(self, Io::Threads)
    }

    /// Run blocking `f` as this mode says: on tokio's blocking pool, right here, or (tasks)
    /// here after a drawn latency — an error if the node crashed during it.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self {
            Io::Inline => f(),
            Io::Tasks(t) => {
                if t.delay().await {
                    f()
                } else {
                    Err(StoreError::File {
                        path: PathBuf::from(what),
                        error: io::Error::other("the node crashed"),
                    })
                }
            }
            Io::Threads => tokio::task::spawn_blocking(f)
                .await
                .map_err(|e| StoreError::File {
                    path: PathBuf::from(what),
                    error: io::Error::other(e.to_string()),
                })?,
        }
    }
}

/// What a store runs on: the file system its files are on, and where its blocking work runs.
/// Chosen when the store is opened ([`open_with`], [`datadir::open_with`]) and kept by the
/// stores. [`Env::default`] is production's (the real file system, [`Io::Threads`]); an
/// [`Io`] alone converts to an `Env` on the real file system.
#[derive(Clone, Debug)]
pub struct Env {
    pub fs: Arc<dyn Fs>,
    pub io: Io,
}

impl Env {
    pub fn new(fs: Arc<dyn Fs>, io: Io) -> Env {
        Env { fs, io }
    }
}

impl Default for Env {
    fn default() -> Env {
        Env::new(fenced_fs::os(), Io::Threads)
    }
}

impl From<Io> for Env {
    /// `io` on the real file system.
    fn from(io: Io) -> Env {
        Env::new(fenced_fs::os(), io)
    }
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
    open_with(dir, events, Env::default())
}

/// [`open`], on the file system and with the blocking work placed as `env` says (an [`Io`]
/// alone: on the real file system).
pub fn open_with(
    dir: &Path,
    events: EventSink,
    env: impl Into<Env>,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_checked(dir, events, &env.into()).map_err(|e| match e {
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
