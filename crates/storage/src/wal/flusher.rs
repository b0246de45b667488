//! The group commit: the thread that makes appended entries durable and acknowledges them.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::LogFlushed;
use openraft::LogId;

use crate::hardstate::HardState;
use crate::observe::Hook;
use crate::StoreError;

/// The group commit: one thread that makes appended entries durable and acknowledges them.
///
/// For everything queued since its last round it runs one `fdatasync` of the open segment,
/// then records the last log id in the hard state (its own `fdatasync`), then calls the
/// appends' callbacks in order. An append is never acknowledged before an `fdatasync` that
/// started after its entries were written. After a failed sync every later append fails
/// too: the kernel may have dropped the dirty pages, so a later successful sync proves
/// nothing (and openraft stops the node on the first failure anyway).
pub struct Flusher {
    jobs: mpsc::Sender<Job>,
}

enum Job {
    Append {
        file: Arc<File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        /// When openraft called `append` (for [`StorageObserver::wal_append`]).
        since: Instant,
    },
    /// Answered once every append queued before it is acknowledged.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

impl Flusher {
    /// Start the thread; it ends when the last [`Flusher`] handle is dropped.
    /// `committed` is written with every hard-state record (see
    /// [`HardStateValue::committed`](crate::hardstate::HardStateValue)). The thread reports
    /// its fsync and append timings to the observer in `hook`, once one is installed.
    pub(crate) fn start(
        hard: Arc<Mutex<HardState>>,
        committed: Arc<Mutex<Option<LogId<NodeId>>>>,
        hook: Hook,
    ) -> Result<Flusher, StoreError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("fenced-wal".into())
            .spawn(move || flush_loop(&rx, &hard, &committed, &hook))
            .map_err(|e| StoreError::file(Path::new("fenced-wal thread"), e))?;
        Ok(Flusher { jobs })
    }

    /// Acknowledge `callback` once the entries up to `last`, written to `file`, are durable.
    /// If the thread is gone, the callback is dropped, which openraft reports as an error.
    /// `since`: when the append began (its duration is reported once it is durable).
    pub fn sync(
        &self,
        file: Arc<File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        since: Instant,
    ) {
        let _ = self.jobs.send(Job::Append {
            file,
            last,
            callback,
            since,
        });
    }

    /// Wait until every append queued so far is acknowledged.
    pub async fn drain(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.jobs.send(Job::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }
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

fn flush_loop(
    rx: &mpsc::Receiver<Job>,
    hard: &Mutex<HardState>,
    committed: &Mutex<Option<LogId<NodeId>>>,
    hook: &Hook,
) {
    let mut failed: Option<String> = None;
    let mut batch = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        batch.extend(rx.try_iter());
        let mut files: Vec<&Arc<File>> = Vec::new();
        let mut last = None;
        for job in &batch {
            if let Job::Append { file, last: l, .. } = job {
                if !files.iter().any(|f| Arc::ptr_eq(f, file)) {
                    files.push(file);
                }
                last = Some(*l);
            }
        }
        if failed.is_none() && last.is_some() {
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
                    let mut h = hard.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut value = h.value().clone();
                    value.last_log_id = last;
                    note_committed(&mut value, committed);
                    h.write(value).map_err(|e| e.to_string())
                });
            if let Err(e) = synced {
                tracing::error!("{e}");
                failed = Some(e);
            }
        }
        let observer = hook.get().filter(|_| failed.is_none());
        for job in batch.drain(..) {
            match job {
                Job::Append {
                    callback, since, ..
                } => {
                    let result = match &failed {
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
