//! The group commit: makes appended entries durable and acknowledges them, on a thread of
//! its own, inline, or as tasks on a simulator's executor ([`Io`]).

use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use fenced_fs::File;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::LogFlushed;
use openraft::LogId;

use tokio::sync::Notify;

use crate::hardstate::HardState;
use crate::observe::Hook;
use crate::planted::Planted;
use crate::{Io, StoreError};

/// The group commit: makes appended entries durable and acknowledges them.
///
/// Each round takes everything queued since the last one, runs one `fdatasync` of every
/// segment file those appends wrote, then calls the appends' callbacks in order. An append is
/// never acknowledged before an `fdatasync` that started after its entries were written.
/// After a failed sync every later append fails too: the kernel may have dropped the dirty
/// pages, so a later successful sync proves nothing (and openraft stops the node on the first
/// failure anyway).
///
/// **The hard state's record of the log's end** (what [`Wal::open`](super::Wal::open) checks
/// a log against, to tell damage from a torn tail) is written by a second thread, the
/// *recorder* (`fenced-hardstate`), after the round's sync and in parallel with the next
/// round's: one `fdatasync` on the acknowledgement's path instead of two in series. The record
/// only ever names entries already durable, and trails the acknowledgements by about one
/// `fdatasync`. What that costs: damage to the entries of the very last round acknowledged
/// before a crash, inside that trailing window, reads as a torn tail and is cut instead of
/// refused — a window of one sync, for a fault (a disk losing synced data) that the record
/// exists to catch everywhere else. A restart closes the window: [`Wal::open_on`](super::Wal::open_on)
/// raises the record to the log's end before anything is served. [`Flusher::drain`] and dropping the flusher wait for the
/// recorder, so a clean stop leaves the record complete.
///
/// With [`Io::Inline`] [`Flusher::sync`] runs the round at once over the one append, in the
/// caller, and records the hard state before it acknowledges, as before: nothing runs on
/// another thread there (the simulator's old mode).
///
/// With [`Io::Tasks`] (the simulator's default) the same rounds and recorder passes as with
/// threads run as two tokio tasks: the flusher task takes what is queued, waits one drawn
/// `fdatasync` latency, runs the round; the recorder task waits one latency between reading
/// what to record and recording it (the window a truncate or a power loss may fall into).
/// Only the waiting differs (a channel and [`Notify`] instead of `mpsc` and [`Condvar`]).
///
/// Dropping the last handle: the thread finishes the rounds already queued (fsyncs and
/// acknowledges them), the recorder records their end, and both end before the drop returns.
pub struct Flusher {
    mode: Mode,
}

enum Mode {
    Thread {
        jobs: Option<mpsc::Sender<Job>>,
        thread: Option<JoinHandle<()>>,
        recorder: Arc<Recorder>,
    },
    Inline(Mutex<Step>),
    /// [`Io::Tasks`]: the thread's loop and the recorder's as tasks. Dropping the sender lets
    /// the task finish what is queued, as the thread does (unless the node crashed).
    Task {
        jobs: tokio::sync::mpsc::UnboundedSender<Job>,
        recorder: Arc<Recorder>,
    },
}

enum Job {
    Append {
        file: Arc<dyn File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        /// When openraft called `append` (for [`StorageObserver::wal_append`]).
        since: Instant,
    },
    /// Answered once every append queued before it is acknowledged and recorded.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// What a round needs, and whether a sync failed before.
struct Step {
    hard: Arc<Mutex<HardState>>,
    committed: Arc<Mutex<Option<LogId<NodeId>>>>,
    hook: Hook,
    failed: Option<String>,
    /// With [`Io::Threads`] and [`Io::Tasks`], who records the hard state; `None`: the round
    /// does, inline.
    recorder: Option<Arc<Recorder>>,
}

/// The hand-over between the flusher and the recorder thread (or task).
struct Recorder {
    state: Mutex<Target>,
    /// Signalled when there is something to record, or to stop.
    work: Signal,
    /// Signalled when the recorder finished a pass.
    done: Signal,
}

/// How the recorder and the flusher wake each other: a thread waits on a [`Condvar`], a task
/// on a [`Notify`].
enum Signal {
    Thread(Condvar),
    Task(Notify),
}

impl Signal {
    fn new(io: &Io) -> Signal {
        match io {
            Io::Tasks(_) => Signal::Task(Notify::new()),
            _ => Signal::Thread(Condvar::new()),
        }
    }

    fn notify_one(&self) {
        match self {
            Signal::Thread(c) => c.notify_one(),
            Signal::Task(n) => n.notify_one(),
        }
    }

    fn notify_all(&self) {
        match self {
            Signal::Thread(c) => c.notify_all(),
            Signal::Task(n) => n.notify_waiters(),
        }
    }

    /// Block on the condition variable (a thread's signal only).
    fn wait<'a>(&self, t: MutexGuard<'a, Target>) -> MutexGuard<'a, Target> {
        match self {
            Signal::Thread(c) => c.wait(t).unwrap_or_else(PoisonError::into_inner),
            Signal::Task(_) => t,
        }
    }

    /// Wait, as a task, until `until` holds of the target (a task's signal only).
    async fn wait_until(&self, recorder: &Recorder, until: impl Fn(&Target) -> bool) {
        let Signal::Task(n) = self else {
            return;
        };
        loop {
            // Registered before the check: a notification in between is not missed.
            let notified = n.notified();
            if until(&recorder.lock()) {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Default)]
struct Target {
    /// The last log id known durable: what the record should say.
    durable: Option<LogId<NodeId>>,
    /// Bumped when the log is cut ([`Flusher::truncated`]): a pass that read an older epoch
    /// records nothing (it would name removed entries).
    epoch: u64,
    /// What the recorder last handled: (`durable`, `epoch`).
    handled: (Option<LogId<NodeId>>, u64),
    /// A failed hard-state write: every later append fails.
    failed: Option<String>,
    stop: bool,
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Target> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether everything posted so far is recorded (or recording failed).
    fn is_caught_up(t: &Target) -> bool {
        t.failed.is_some() || t.handled == (t.durable, t.epoch)
    }

    /// Wait until everything posted so far is recorded (or recording failed).
    fn caught_up(&self) {
        let mut t = self.lock();
        while !Recorder::is_caught_up(&t) {
            t = self.done.wait(t);
        }
    }

    /// [`Recorder::caught_up`], as a task.
    async fn caught_up_task(&self) {
        self.done.wait_until(self, Recorder::is_caught_up).await;
    }

    /// What the next pass should record, `None` when there is nothing new.
    fn wanted(t: &Target) -> Option<(Option<LogId<NodeId>>, u64)> {
        (t.handled != (t.durable, t.epoch)).then_some((t.durable, t.epoch))
    }

    /// The recorder thread: record the latest durable log id whenever it moves, never naming
    /// entries cut meanwhile, never lowering the record (a truncate lowers it itself).
    fn run(&self, hard: &Mutex<HardState>, committed: &Mutex<Option<LogId<NodeId>>>, hook: &Hook) {
        loop {
            let (want, epoch) = {
                let mut t = self.lock();
                while !t.stop && Recorder::wanted(&t).is_none() {
                    t = self.work.wait(t);
                }
                match Recorder::wanted(&t) {
                    Some(w) => w,
                    None => return,
                }
            };
            self.pass(want, epoch, hard, committed, hook);
        }
    }

    /// The recorder as a task ([`Io::Tasks`]): [`Recorder::run`]'s loop, with one drawn
    /// latency between reading what to record and recording it.
    async fn run_task(
        &self,
        io: &crate::TaskIo,
        hard: &Mutex<HardState>,
        committed: &Mutex<Option<LogId<NodeId>>>,
        hook: &Hook,
    ) {
        loop {
            self.work
                .wait_until(self, |t| t.stop || Recorder::wanted(t).is_some())
                .await;
            let Some((want, epoch)) = Recorder::wanted(&self.lock()) else {
                return;
            };
            if !io.delay().await {
                return;
            }
            self.pass(want, epoch, hard, committed, hook);
        }
    }

    /// One pass: record `want`, read at `epoch`, unless the log was cut since or the record
    /// is already there; then mark it handled and wake who waits for it.
    fn pass(
        &self,
        want: Option<LogId<NodeId>>,
        epoch: u64,
        hard: &Mutex<HardState>,
        committed: &Mutex<Option<LogId<NodeId>>>,
        hook: &Hook,
    ) {
        let result = {
            let mut h = hard.lock().unwrap_or_else(PoisonError::into_inner);
            let current = h.value().last_log_id;
            // Checked under the hard-state lock, which a truncate holds to lower it.
            let same_log = self.lock().epoch == epoch || crate::planted::is(Planted::RecorderEpoch);
            if same_log && want.map(|w| w.index) > current.map(|c| c.index) {
                record_end(&mut h, want, committed)
            } else {
                Ok(())
            }
        };
        let mut t = self.lock();
        match result {
            Ok(()) => {
                if let (Some(o), Some(w)) = (hook.get(), want) {
                    o.log_recorded(w.index);
                }
            }
            Err(e) => {
                tracing::error!("hard state write failed: {e}");
                t.failed = Some(e);
            }
        }
        // A truncate meanwhile set what it handled itself.
        if t.epoch == epoch {
            t.handled = (want, epoch);
        }
        self.done.notify_all();
    }
}

impl Flusher {
    /// Start the group commit (with [`Io::Threads`], its thread and the recorder's; they end
    /// when the last [`Flusher`] handle is dropped). `committed` is written with every
    /// hard-state record (see [`HardStateValue::committed`](crate::hardstate::HardStateValue)).
    /// Fsync and append timings go to the observer in `hook`, once one is installed.
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
            recorder: None,
        };
        let mode = match io {
            Io::Inline => Mode::Inline(Mutex::new(step)),
            Io::Threads => {
                let recorder = step.new_recorder(&io);
                let recording = {
                    let (r, hard, committed, hook) = (
                        recorder.clone(),
                        step.hard.clone(),
                        step.committed.clone(),
                        step.hook.clone(),
                    );
                    std::thread::Builder::new()
                        .name("fenced-hardstate".into())
                        .spawn(move || r.run(&hard, &committed, &hook))
                        .map_err(|e| StoreError::file(Path::new("fenced-hardstate thread"), e))?
                };
                let (jobs, rx) = mpsc::channel::<Job>();
                let stopping = recorder.clone();
                let thread = std::thread::Builder::new()
                    .name("fenced-wal".into())
                    .spawn(move || {
                        let mut batch = Vec::new();
                        while let Ok(first) = rx.recv() {
                            batch.push(first);
                            batch.extend(rx.try_iter());
                            // A thread's recorder is waited for in the round: none is left.
                            let _ = step.round(&mut batch);
                        }
                        // Every handle is gone: record what is durable, then end.
                        stopping.lock().stop = true;
                        stopping.work.notify_all();
                        let _ = recording.join();
                    })
                    .map_err(|e| StoreError::file(Path::new("fenced-wal thread"), e))?;
                Mode::Thread {
                    jobs: Some(jobs),
                    thread: Some(thread),
                    recorder,
                }
            }
            Io::Tasks(ref tasks) => {
                let recorder = step.new_recorder(&io);
                {
                    let (r, hard, committed, hook, tasks) = (
                        recorder.clone(),
                        step.hard.clone(),
                        step.committed.clone(),
                        step.hook.clone(),
                        tasks.clone(),
                    );
                    tokio::spawn(async move { r.run_task(&tasks, &hard, &committed, &hook).await });
                }
                let (jobs, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
                let (stopping, tasks) = (recorder.clone(), tasks.clone());
                tokio::spawn(async move {
                    let mut batch = Vec::new();
                    while let Some(first) = rx.recv().await {
                        batch.push(first);
                        while let Ok(more) = rx.try_recv() {
                            batch.push(more);
                        }
                        // The round's fdatasync takes a drawn latency; what is queued meanwhile
                        // waits for the next round, as behind the thread's sync.
                        let syncs = batch.iter().any(|j| matches!(j, Job::Append { .. }));
                        if (syncs && !tasks.delay().await) || !tasks.alive() {
                            return;
                        }
                        for barrier in step.round(&mut batch) {
                            stopping.caught_up_task().await;
                            if !tasks.alive() {
                                return;
                            }
                            let _ = barrier.send(());
                        }
                    }
                    stopping.lock().stop = true;
                    stopping.work.notify_all();
                });
                Mode::Task { jobs, recorder }
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
            Mode::Thread { jobs, .. } => {
                if let Some(jobs) = jobs {
                    let _ = jobs.send(job);
                }
            }
            Mode::Task { jobs, .. } => {
                let _ = jobs.send(job);
            }
            Mode::Inline(step) => {
                let mut step = step.lock().unwrap_or_else(PoisonError::into_inner);
                // Inline there is no recorder: no barrier is left waiting.
                let _ = step.round(&mut vec![job]);
            }
        }
    }

    /// Wait until every append queued so far is acknowledged and its end recorded in the hard
    /// state (inline: at once, none is pending).
    pub async fn drain(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = match &self.mode {
            Mode::Thread {
                jobs: Some(jobs), ..
            } => jobs.send(Job::Barrier(tx)).is_ok(),
            Mode::Task { jobs, .. } => jobs.send(Job::Barrier(tx)).is_ok(),
            _ => false,
        };
        if sent {
            let _ = rx.await;
        }
    }

    /// The log was cut: entries after `to` are gone, and the recorder must not name them. Call
    /// after [`Flusher::drain`] and before writing the lowered record yourself.
    pub fn truncated(&self, to: Option<LogId<NodeId>>) {
        if let Mode::Thread { recorder, .. } | Mode::Task { recorder, .. } = &self.mode {
            let mut t = recorder.lock();
            t.durable = to;
            t.epoch += 1;
            t.handled = (t.durable, t.epoch);
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        if let Mode::Thread { jobs, thread, .. } = &mut self.mode {
            drop(jobs.take());
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn same_file(a: &Arc<dyn File>, b: &Arc<dyn File>) -> bool {
    Arc::as_ptr(a) as *const () == Arc::as_ptr(b) as *const ()
}

/// Write `last` as the log's end into the hard state, with the latest committed log id.
fn record_end(
    h: &mut HardState,
    last: Option<LogId<NodeId>>,
    committed: &Mutex<Option<LogId<NodeId>>>,
) -> Result<(), String> {
    let mut value = h.value().clone();
    value.last_log_id = last;
    note_committed(&mut value, committed);
    h.write(value).map_err(|e| e.to_string())
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
    /// The recorder, caught up with the hard state as it stands, now this step's.
    fn new_recorder(&mut self, io: &Io) -> Arc<Recorder> {
        let recorder = Arc::new(Recorder {
            state: Mutex::new(Target {
                durable: self.hard_value_last(),
                ..Target::default()
            }),
            work: Signal::new(io),
            done: Signal::new(io),
        });
        {
            let mut t = recorder.lock();
            t.handled = (t.durable, t.epoch);
        }
        self.recorder = Some(recorder.clone());
        recorder
    }

    fn hard_value_last(&self) -> Option<LogId<NodeId>> {
        self.hard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .value()
            .last_log_id
    }

    /// Record `last` in the hard state now, in this thread (inline mode).
    fn record_inline(&self, last: Option<LogId<NodeId>>) -> Result<(), String> {
        let mut h = self.hard.lock().unwrap_or_else(PoisonError::into_inner);
        record_end(&mut h, last, &self.committed)?;
        if let (Some(o), Some(l)) = (self.hook.get(), last) {
            o.log_recorded(l.index);
        }
        Ok(())
    }

    /// One round of the group commit over `batch` (emptied): sync, hand the new end to the
    /// recorder (inline: record it), acknowledge. Returns the barriers a task's recorder must
    /// catch up with before they are answered (a thread's recorder is waited for here).
    #[must_use]
    fn round(&mut self, batch: &mut Vec<Job>) -> Vec<tokio::sync::oneshot::Sender<()>> {
        let mut later = Vec::new();
        let hook = &self.hook;
        if self.failed.is_none() {
            if let Some(r) = &self.recorder {
                self.failed = r.lock().failed.clone();
            }
        }
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
                    match &self.recorder {
                        Some(r) => {
                            r.lock().durable = last;
                            r.work.notify_one();
                            Ok(())
                        }
                        None => self.record_inline(last),
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
                Job::Barrier(done) => match &self.recorder {
                    Some(r) if matches!(r.done, Signal::Task(_)) => later.push(done),
                    r => {
                        if let Some(r) = r {
                            r.caught_up();
                        }
                        let _ = done.send(());
                    }
                },
            }
        }
        later
    }
}
