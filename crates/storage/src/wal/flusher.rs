//! The group commit: makes appended entries durable and acknowledges them, on a thread of
//! its own or inline ([`Io`]).

use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use fenced_fs::File;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::LogFlushed;
use openraft::LogId;

use crate::hardstate::HardState;
use crate::observe::Hook;
use crate::{Io, StoreError};

/// The group commit: makes appended entries durable and acknowledges them.
///
/// Each round takes everything queued since the last one, runs one `fdatasync` of every
/// segment file those appends wrote, then records the last log id in the hard state (its own
/// `fdatasync`), then calls the appends' callbacks in order. An append is never acknowledged
/// before an `fdatasync` that started after its entries were written. After a failed sync
/// every later append fails too: the kernel may have dropped the dirty pages, so a later
/// successful sync proves nothing (and openraft stops the node on the first failure anyway).
///
/// The round ([`Step::round`]) is one piece of code for both [`Io`] modes: with
/// [`Io::Threads`] a thread of its own (`fenced-wal`) runs it over whatever queued meanwhile;
/// with [`Io::Inline`] [`Flusher::sync`] runs it at once over the one append, in the caller.
///
/// Dropping the last handle: the thread finishes the rounds already queued (fsyncs and
/// acknowledges them), then ends; nothing is written that a crash at the same moment would
/// need — an append is promised only once acknowledged. Inline mode has nothing queued.
pub struct Flusher {
    mode: Mode,
}

enum Mode {
    Thread(mpsc::Sender<Job>),
    Inline(Mutex<Step>),
}

enum Job {
    Append {
        file: Arc<dyn File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        /// When openraft called `append` (for [`StorageObserver::wal_append`]).
        since: Instant,
    },
    /// Answered once every append queued before it is acknowledged.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// What a round needs, and whether a sync failed before.
struct Step {
    hard: Arc<Mutex<HardState>>,
    committed: Arc<Mutex<Option<LogId<NodeId>>>>,
    hook: Hook,
    failed: Option<String>,
}

impl Flusher {
    /// Start the group commit (with [`Io::Threads`], its thread; it ends when the last
    /// [`Flusher`] handle is dropped). `committed` is written with every hard-state record
    /// (see [`HardStateValue::committed`](crate::hardstate::HardStateValue)). Fsync and
    /// append timings go to the observer in `hook`, once one is installed.
    pub(crate) fn start(
        hard: Arc<Mutex<HardState>>,
        committed: Arc<Mutex<Option<LogId<NodeId>>>>,
        hook: Hook,
        io: Io,
    ) -> Result<Flusher, StoreError> {
        let mut step = Step {
            hard,
            committed,
            hook,
            failed: None,
        };
        let mode = match io {
            Io::Inline => Mode::Inline(Mutex::new(step)),
            Io::Threads => {
                let (jobs, rx) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name("fenced-wal".into())
                    .spawn(move || {
                        let mut batch = Vec::new();
                        while let Ok(first) = rx.recv() {
                            batch.push(first);
                            batch.extend(rx.try_iter());
                            step.round(&mut batch);
                        }
                    })
                    .map_err(|e| StoreError::file(Path::new("fenced-wal thread"), e))?;
                Mode::Thread(jobs)
            }
        };
        Ok(Flusher { mode })
    }

    /// Acknowledge `callback` once the entries up to `last`, written to `file`, are durable
    /// (inline: before this returns). If the thread is gone, the callback is dropped, which
    /// openraft reports as an error. `since`: when the append began (its duration is reported
    /// once it is durable).
    pub fn sync(
        &self,
        file: Arc<dyn File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        since: Instant,
    ) {
        let job = Job::Append {
            file,
            last,
            callback,
            since,
        };
        match &self.mode {
            Mode::Thread(jobs) => {
                let _ = jobs.send(job);
            }
            Mode::Inline(step) => step
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .round(&mut vec![job]),
        }
    }

    /// Wait until every append queued so far is acknowledged (inline: at once, none is).
    pub async fn drain(&self) {
        let Mode::Thread(jobs) = &self.mode else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if jobs.send(Job::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

fn same_file(a: &Arc<dyn File>, b: &Arc<dyn File>) -> bool {
    Arc::as_ptr(a) as *const () == Arc::as_ptr(b) as *const ()
}

/// Put the latest committed log id into a hard-state record about to be written, if the log
/// it records reaches it.
pub(crate) fn note_committed(
    value: &mut crate::hardstate::HardStateValue,
    committed: &Mutex<Option<LogId<NodeId>>>,
) {
    let c = *committed.lock().unwrap_or_else(PoisonError::into_inner);
    if c.is_some_and(|c| value.last_log_id.is_some_and(|l| c.index <= l.index)) {
        value.committed = c;
    }
}

impl Step {
    /// One round of the group commit over `batch` (emptied): sync, record, acknowledge.
    fn round(&mut self, batch: &mut Vec<Job>) {
        let hook = &self.hook;
        let mut files: Vec<&Arc<dyn File>> = Vec::new();
        let mut last = None;
        for job in batch.iter() {
            if let Job::Append { file, last: l, .. } = job {
                // The same file (its data pointer; vtable pointers may differ).
                if !files.iter().any(|f| same_file(f, file)) {
                    files.push(file);
                }
                last = Some(*l);
            }
        }
        if self.failed.is_none() && last.is_some() {
            let synced = files
                .iter()
                .try_for_each(|f| {
                    let started = Instant::now();
                    f.sync_data()?;
                    if let Some(o) = hook.get() {
                        o.wal_fsync(started.elapsed());
                    }
                    Ok::<(), io::Error>(())
                })
                .map_err(|e| format!("log fsync failed: {e}"))
                .and_then(|()| {
                    if let (Some(o), Some(l)) = (hook.get(), last) {
                        o.log_synced(l.index);
                    }
                    let mut h = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut value = h.value().clone();
                    value.last_log_id = last;
                    note_committed(&mut value, &self.committed);
                    h.write(value).map_err(|e| e.to_string())
                })
                .inspect(|()| {
                    if let (Some(o), Some(l)) = (hook.get(), last) {
                        o.log_recorded(l.index);
                    }
                });
            if let Err(e) = synced {
                tracing::error!("{e}");
                self.failed = Some(e);
            }
        }
        let observer = hook.get().filter(|_| self.failed.is_none());
        for job in batch.drain(..) {
            match job {
                Job::Append {
                    callback, since, ..
                } => {
                    let result = match &self.failed {
                        None => Ok(()),
                        Some(e) => Err(io::Error::other(e.clone())),
                    };
                    // Observed before the acknowledgement, so that every acknowledged
                    // append has been counted by the time its caller goes on.
                    if let Some(o) = observer {
                        o.wal_append(since.elapsed());
                    }
                    callback.log_io_completed(result);
                }
                Job::Barrier(done) => {
                    let _ = done.send(());
                }
            }
        }
    }
}
