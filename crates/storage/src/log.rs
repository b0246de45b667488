//! openraft's log storage over the [`Wal`]: entries in the write-ahead log; the vote, the last
//! durable and the committed log id in the [`hardstate`](crate::hardstate) file; the last
//! purged log id in the [`purged`](crate::purged) file.

use std::fmt;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};

use crate::hardstate::{HardState, HardStateValue};
use crate::observe::{Hook, StorageObserver};
use crate::purged::Purged;
use crate::snapshot::SnapshotStore;
use crate::wal::{Flusher, Wal};
use crate::{Io, StoreError};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Raft log, vote and commit index. Cheap to clone (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    /// The last purged log id; std mutex, held only while it is read or written.
    purged: Arc<Mutex<Purged>>,
    wal: Arc<Mutex<Wal>>,
    /// The vote and the last durable log id; std mutex, held only by blocking code (the
    /// group commit, blocking tasks, or inline in [`Io::Inline`]).
    hard: Arc<Mutex<HardState>>,
    /// The last committed log id openraft told us; written with the next hard-state record.
    committed: Arc<Mutex<Option<LogId<NodeId>>>>,
    flusher: Arc<Flusher>,
    /// Where timings go ([`LogStore::observe`]); shared with the flusher thread and the
    /// state machine store of the same data dir.
    hook: Hook,
    /// Where blocking work runs.
    io: Io,
    /// The snapshots of the same data dir: a purge waits for one that covers it.
    snapshots: Arc<SnapshotStore>,
}

/// See [`LogStore::committed`].
#[derive(Clone, Debug)]
pub struct CommittedIndex(Arc<Mutex<Option<LogId<NodeId>>>>);

impl CommittedIndex {
    pub fn index(&self) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|c| c.index)
    }
}

impl fmt::Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

/// Update the hard state (it fsyncs) as the store's [`Io`] says, with the latest committed
/// log id that the log reaches.
async fn update_hard(
    store: &LogStore,
    f: impl FnOnce(&mut HardStateValue) + Send + 'static,
) -> Result<(), StoreError> {
    let hard = store.hard.clone();
    let committed = store.committed.clone();
    store
        .io
        .run(crate::hardstate::FILE_NAME, move || {
            let mut h = hard.lock().unwrap_or_else(PoisonError::into_inner);
            let mut value = h.value().clone();
            f(&mut value);
            crate::wal::note_committed(&mut value, &committed);
            h.write(value)
        })
        .await
}

impl LogStore {
    /// The store over an opened data dir; blocking work runs as `io` says.
    pub(crate) fn new(
        purged: Purged,
        wal: Wal,
        hard: HardState,
        hook: Hook,
        io: Io,
        snapshots: Arc<SnapshotStore>,
    ) -> Result<LogStore, StoreError> {
        let committed = Arc::new(Mutex::new(hard.value().committed));
        let hard = Arc::new(Mutex::new(hard));
        Ok(LogStore {
            flusher: Arc::new(Flusher::start(
                hard.clone(),
                committed.clone(),
                hook.clone(),
                io.clone(),
            )?),
            hook,
            purged: Arc::new(Mutex::new(purged)),
            wal: Arc::new(Mutex::new(wal)),
            hard,
            committed,
            io,
            snapshots,
        })
    }

    fn last_purged(&self) -> Option<LogId<NodeId>> {
        self.purged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .value()
    }

    /// Report the storage's timings (WAL fsyncs and appends, snapshots built) to `observer`
    /// from now on: this store, its clones and the state machine store opened with it share
    /// it. Only the first call installs one; `false` if an observer was there already.
    pub fn observe(&self, observer: Arc<dyn StorageObserver>) -> bool {
        self.hook.set(observer)
    }

    /// The index of the last committed entry openraft reported (`save_committed`), if any.
    pub fn committed_index(&self) -> Option<u64> {
        self.committed().index()
    }

    /// A reader of [`LogStore::committed_index`] that keeps nothing else of the store alive:
    /// for an observer the store itself holds (a clone of the store there would be a
    /// reference cycle, which leaks the store's files when a node stops in a process that
    /// goes on, like the simulator).
    pub fn committed(&self) -> CommittedIndex {
        CommittedIndex(self.committed.clone())
    }

    fn wal(&self) -> MutexGuard<'_, Wal> {
        self.wal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes the write-ahead log's segments take on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.wal().size_on_disk()
    }

    /// Whether anything of Raft is stored: a vote, a log entry, or a purged prefix.
    pub fn holds_state(&self) -> bool {
        let hard = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
        hard.value().vote.is_some()
            || hard.value().last_log_id.is_some()
            || !self.wal().is_empty()
            || self.last_purged().is_some()
    }

    /// The membership this store holds: the last membership entry of the log, else none
    /// (then the state machine's, [`crate::SharedState::membership`], applies).
    pub fn last_membership(
        &self,
    ) -> Result<Option<openraft::Membership<NodeId, BasicNode>>, StoreError> {
        let wal = self.wal();
        let Some(last) = wal.last_log_id() else {
            return Ok(None);
        };
        const STEP: u64 = 256;
        let mut end = last.index + 1;
        while end > 0 {
            let start = end.saturating_sub(STEP);
            let entries = wal.read(start..end)?;
            if entries.is_empty() {
                break;
            }
            for entry in entries.into_iter().rev() {
                if let EntryPayload::Membership(m) = entry.payload {
                    return Ok(Some(m));
                }
            }
            end = start;
        }
        Ok(None)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        self.wal()
            .read(start..end)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    /// Replication's read: the entries from `start` on, or none at all when `start` is purged
    /// (openraft then sends a heartbeat and, next, the snapshot). The default, the clamped
    /// read, gave openraft 0.9's leader entries 251.. for a request from 144 when its log had
    /// been purged meanwhile, and it sent them after entry 143 (found by fenced-sim, seed
    /// 1008664).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let entries = self.try_get_log_entries(start..end).await?;
        match entries.first() {
            Some(e) if e.log_id.index != start => Ok(Vec::new()),
            _ => Ok(entries),
        }
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id = self.last_purged();
        let last_in_log = self.wal().last_log_id();
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last_in_log.max(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let vote = *vote;
        update_hard(self, move |v| v.vote = Some(vote))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        let hard = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(hard.value().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not durable on its own: openraft does not need it; the next hard-state record
        // carries it.
        *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let committed = *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Never beyond the log this node holds (a record written as the log was cut).
        let last = self.wal().last_log_id().map(|l| l.index);
        Ok(committed.filter(|c| last.is_some_and(|l| c.index <= l)))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let since = Instant::now();
        let entries: Vec<_> = entries.into_iter().collect();
        let first = entries.first().map_or(0, |e| e.log_id.index);
        let overwrites = {
            let last = self.wal().last_log_id();
            entries
                .first()
                .filter(|e| last.is_some_and(|l| e.log_id.index <= l.index))
                .map(|e| e.log_id)
        };
        if let Some(from) = overwrites {
            // openraft truncates before it overwrites; its storage test suite does not.
            self.truncate(from).await?;
        }
        let written = self.wal().append(entries);
        match written {
            Ok(Some((last, file))) => {
                if let Some(o) = self.hook.get() {
                    o.log_written(first, last.index);
                }
                // Acknowledged by the flusher once an fdatasync covering these entries is done
                // (its recorder then records them in the hard state).
                self.flusher.sync(file, last, callback, since);
                Ok(())
            }
            Ok(None) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(&e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "truncate log from");
        // The hard state first records the shorter log: a crash before the entries are gone
        // leaves a log longer than recorded, which is harmless; the reverse would look like
        // lost entries. Appends still queued would record their (now removed) ids after this,
        // so let them finish first.
        self.flusher.drain().await;
        let before = match log_id.index.checked_sub(1) {
            Some(prev) => self
                .try_get_log_entries(prev..=prev)
                .await?
                .pop()
                .map(|e| e.log_id),
            None => None,
        };
        let remaining = before.max(self.last_purged());
        // The recorder must not name the removed entries after this.
        self.flusher.truncated(remaining);
        update_hard(self, move |v| v.last_log_id = remaining)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.wal()
            .truncate(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "purge log up to");
        // Not past what a snapshot on disk covers, while one is being installed
        // (`SnapshotStore::covering`).
        self.snapshots
            .covering(log_id)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Record first, durably: a crash before the segments are gone leaves only harmless
        // stale entries, while segments gone without the record would look like a hole.
        let purged = self.purged.clone();
        self.io
            .run(crate::purged::FILE_NAME, move || {
                purged
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .write(Some(log_id))
            })
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.wal()
            .purge(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Purging past the last entry (after a snapshot was installed) makes the purged id the
        // last log id.
        update_hard(self, move |v| {
            if v.last_log_id.is_none_or(|l| l.index < log_id.index) {
                v.last_log_id = Some(log_id);
            }
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}
