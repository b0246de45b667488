//! The replicated state machine in memory ([`StateMachineStore`], read through
//! [`SharedState`]) and its snapshots ([`SnapshotBuilder`], [`CompactionGauge`]).

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use fenced_raft_types::{NodeId, SnapshotFile, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};

use crate::{digests, observe, snapshot, DigestLog, EventSink, Io, LogStore, Meta, StoreError};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone, Default)]
pub(crate) struct SmState {
    pub(crate) last_applied: Option<LogId<NodeId>>,
    pub(crate) membership: StoredMembership<NodeId, BasicNode>,
    pub(crate) machine: fenced_core::StateMachine,
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
    pub(crate) snapshots: Arc<snapshot::SnapshotStore>,
    pub(crate) state: Arc<RwLock<SmState>>,
    pub(crate) events: EventSink,
    pub(crate) snapshot_seq: u64,
    /// Shared with the [`LogStore`] opened with it ([`LogStore::observe`]).
    pub(crate) hook: observe::Hook,
    /// Digests of the state at every N-th index, for the divergence alarm ([`digests`]).
    pub(crate) digester: digests::Digester,
    /// Where snapshot file I/O runs.
    pub(crate) io: Io,
    /// Log indexes the operator quarantined ([`crate::quarantine`]): applied as a no-op.
    pub(crate) quarantined: std::collections::BTreeSet<u64>,
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

    /// [`RaftStateMachine::install_snapshot`]'s work: check the received file, make it the
    /// current snapshot, and take its state.
    async fn install_received(
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
            let own = self
                .snapshots
                .receiving(self.io.inline())
                .map_err(err)?
                .path()
                .to_owned();
            let (from, to) = (path, own.clone());
            let fs = self.snapshots.fs().clone();
            self.io
                .run(snapshot::DIR, move || {
                    fs.copy(&from, &to)
                        .and_then(|_| fs.open(&to, fenced_fs::Mode::Read)?.sync_all())
                        .map_err(|error| StoreError::File { path: from, error })
                })
                .await
                .map_err(err)?;
            path = own;
        }
        let (checked, fs) = (path.clone(), self.snapshots.fs().clone());
        let (stored_meta, machine) = match self
            .io
            .run(snapshot::DIR, move || snapshot::load(&*fs, &checked))
            .await
        {
            Ok(loaded) => loaded,
            Err(e) => {
                let _ = self.snapshots.fs().remove_file(&path);
                return Err(err(e).into());
            }
        };
        if &stored_meta != meta {
            let _ = self.snapshots.fs().remove_file(&path);
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
        self.io
            .run(snapshot::DIR, move || store.install(&path, &m))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        // The state is replaced: etcd watches re-read the keyspace (they may be compacted).
        let changed = fenced_core::Event::EtcdChanged {
            revision: machine.revision(),
        };
        let new_state = SmState {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            machine,
        };
        let mut st = self.state.write().map_err(|_| {
            StorageIOError::write_state_machine(AnyError::new(&StoreError::Poisoned))
        })?;
        *st = new_state;
        drop(st);
        (self.events)(&[changed]);
        Ok(())
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
        self.snapshots
            .fs()
            .len(&self.snapshots.current_path())
            .unwrap_or(0)
    }
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
        let observer = self.hook.get();
        for entry in entries {
            let log_id = entry.log_id;
            if let Some(o) = observer {
                o.applying(log_id.index);
            }
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
                        let applied = if self.quarantined.contains(&log_id.index) {
                            tracing::warn!(
                                index = log_id.index,
                                requests = batch.requests.len(),
                                "log entry {} quarantined by the operator: applied as a no-op",
                                log_id.index
                            );
                            st.machine.apply_quarantined(log_id.index, &batch)
                        } else {
                            st.machine.apply_batch(log_id.index, &batch)
                        };
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
            if let Some(o) = observer {
                o.applied(log_id.index);
            }
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
            io: self.io.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<SnapshotFile>> {
        let file = self
            .snapshots
            .receiving(self.io.inline())
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<SnapshotFile>,
    ) -> StorageResult<()> {
        let installed = self.install_received(meta, snapshot).await;
        if let Err(e) = &installed {
            // A purge waiting for this install must not wait for good.
            self.snapshots.install_failed(e);
        }
        installed
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let err = |e: StoreError| StorageIOError::read_snapshot(None, &e);
        let Some((meta, path)) = self.snapshots.current().map_err(err)? else {
            return Ok(None);
        };
        let file = SnapshotFile::open(&**self.snapshots.fs(), &path, self.io.inline())
            .map_err(|e| err(StoreError::file(&path, e)))?;
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
    io: Io,
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
        let path = self
            .io
            .run(snapshot::DIR, move || {
                let path = store.write(&m, &machine)?;
                store.install(&path, &m)?;
                Ok(store.current_path())
            })
            .await
            .map_err(err)?;
        let file = SnapshotFile::open(&**self.snapshots.fs(), &path, self.io.inline())
            .map_err(|e| err(StoreError::file(&path, e)))?;
        let (bytes, took) = (
            self.snapshots.fs().len(&path).unwrap_or(0),
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
