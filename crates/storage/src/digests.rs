//! Digests of the applied state at deterministic log indexes, for the divergence alarm.
//!
//! Every `every` log indexes (`index % every == 0`, so every replica picks the same ones),
//! `StateMachineStore::apply` takes an O(1) copy-on-write clone of the state right after
//! applying that entry and hands it to one background thread, which computes
//! [`fenced_core::StateMachine::digest`] and records `(index, digest)` in a [`DigestLog`]
//! (the last [`KEPT`]). Nothing runs on the apply path but the clone and a non-blocking send;
//! no mutation is hooked. A digest the thread cannot take in time (more than [`QUEUE`] waiting)
//! is skipped: the leader then compares at another index. The digests are not in snapshots.
//!
//! With [`Io::Inline`] and [`Io::Tasks`] there is no thread: the digest is computed during `apply`, at once,
//! and never skipped.
//!
//! The leader compares digests at equal indexes (`fenced_server::alarm`). A replica that
//! installs a snapshot skips the indexes it covers; one that restarts recomputes from its log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

use fenced_core::{Batch, Command, Request, Semantics, StateMachine};

use crate::Io;

/// How many `(index, digest)` pairs a [`DigestLog`] keeps.
pub const KEPT: usize = 16;
/// Clones that may wait for the digest thread.
const QUEUE: usize = 4;

/// The last [`KEPT`] digests of this replica, oldest first, and the apply rules of the last
/// entry it applied. Cheap to clone (a handle).
#[derive(Clone, Default, Debug)]
pub struct DigestLog(Arc<Shared>);

#[derive(Default, Debug)]
struct Shared {
    digests: Mutex<VecDeque<(u64, u64)>>,
    semantics: AtomicU8,
}

impl DigestLog {
    /// The rules ([`Semantics`]) the last normal entry this replica applied was stamped with
    /// ([`Semantics::REVISIONS`] before any, and after a restart until one is applied).
    pub fn applied_semantics(&self) -> Semantics {
        Semantics(self.0.semantics.load(Ordering::Relaxed))
    }

    /// The recorded `(index, digest)` pairs, by index.
    pub fn recent(&self) -> Vec<(u64, u64)> {
        self.0
            .digests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }

    fn record(&self, index: u64, digest: u64) {
        let mut log = self
            .0
            .digests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The thread takes clones in order, but a restart or a snapshot install can go back.
        log.retain(|(i, _)| *i != index);
        let at = log.partition_point(|(i, _)| *i < index);
        log.insert(at, (index, digest));
        while log.len() > KEPT {
            log.pop_front();
        }
    }
}

/// The apply side: which indexes to digest, the channel to the digest thread, and the
/// test-only divergence hook.
#[derive(Default)]
pub(crate) struct Digester {
    every: u64,
    tx: Option<SyncSender<(u64, StateMachine)>>,
    log: DigestLog,
    /// Test only ([`crate::StateMachineStore::diverge_at_for_tests`]).
    diverge_at: Option<u64>,
    /// [`Io::Inline`], [`Io::Tasks`]: digest in [`Digester::applied`], no thread.
    io: Io,
}

impl Digester {
    /// A digester whose digests are computed as `io` says.
    pub(crate) fn new(io: Io) -> Digester {
        Digester {
            io,
            ..Digester::default()
        }
    }

    /// Digest every `every` indexes (0: never), from now on.
    pub(crate) fn start(&mut self, every: u64) {
        self.every = every;
        self.tx = None;
        if every == 0 || self.io.inline() {
            return;
        }
        let (tx, rx) = sync_channel::<(u64, StateMachine)>(QUEUE);
        let log = self.log.clone();
        let spawned = std::thread::Builder::new()
            .name("fenced-digest".into())
            .spawn(move || {
                // Ends when the store (the sender) is dropped.
                while let Ok((index, machine)) = rx.recv() {
                    let digest = machine.digest();
                    drop(machine);
                    log.record(index, digest);
                }
            });
        match spawned {
            Ok(_) => self.tx = Some(tx),
            Err(e) => tracing::error!("cannot start the digest thread: {e}; no digests"),
        }
    }

    pub(crate) fn log(&self) -> DigestLog {
        self.log.clone()
    }

    /// A normal entry stamped `semantics` was applied.
    pub(crate) fn applied_batch(&self, semantics: Semantics) {
        self.log.0.semantics.store(semantics.0, Ordering::Relaxed);
    }

    pub(crate) fn set_diverge_at(&mut self, index: u64) {
        self.diverge_at = Some(index);
    }

    /// After applying the entry at `index` (under the state's write lock): the test hook,
    /// then, at a digest index, a clone for the digest thread.
    pub(crate) fn applied(&mut self, index: u64, machine: &mut StateMachine) {
        if self.diverge_at.is_some_and(|at| index >= at) {
            self.diverge_at = None;
            diverge(index, machine);
        }
        if self.every == 0 || !index.is_multiple_of(interval_at(self.every, machine)) {
            return;
        }
        if self.io.inline() {
            self.log.record(index, machine.digest());
            return;
        }
        let Some(tx) = &self.tx else { return };
        match tx.try_send((index, machine.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::debug!(index, "digest thread busy; skipping this index");
            }
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }
}

/// Stored etcd versions per doubling of the digest interval.
pub const VERSIONS_PER_DOUBLING: usize = 100_000;

/// The digest interval at a state: `every` while the etcd history holds fewer than
/// [`VERSIONS_PER_DOUBLING`] versions, doubled for each doubling above it (×16 at 1 M). A
/// digest hashes the whole state, so without this its cost grew with the keyspace: with 1 M
/// etcd keys the digest threads took a quarter of a 2-core machine (docs/performance.md).
///
/// It depends only on the state after the entry at that index — the same on every replica — so
/// members still digest at the same indexes, and since every interval is `every` times a power
/// of two, members on coarser and finer schedules (an older build, a state just across a
/// doubling) still meet at the coarser one's indexes.
pub fn interval_at(every: u64, machine: &StateMachine) -> u64 {
    let weight = (machine.etcd().version_count() / VERSIONS_PER_DOUBLING) as u64;
    let doublings = (u64::BITS - weight.leading_zeros()).min(20);
    every.saturating_mul(1 << doublings)
}

/// The key the test-only divergence hook writes.
pub const DIVERGED_KEY: &str = "fenced-test-diverged";

/// Make this replica's state differ from every other's, as a bug would: `SET
/// fenced-test-diverged 1` applied here only. Test only.
fn diverge(index: u64, machine: &mut StateMachine) {
    tracing::error!(
        index,
        "TEST HOOK: making this replica diverge on purpose (SET {DIVERGED_KEY} 1 applied \
         here only)"
    );
    let argv = vec![
        b"SET".to_vec(),
        DIVERGED_KEY.as_bytes().to_vec(),
        b"1".to_vec(),
    ];
    let batch = Batch {
        requests: vec![Request {
            time_ms: machine.now(),
            client: None,
            cmd: Command::Kv(fenced_core::kv::KvCommand::Batch(vec![argv])),
        }],
        semantics: Semantics::NEWEST,
    };
    machine.apply_batch(index, &batch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_last_digests_in_index_order() {
        let log = DigestLog::default();
        for i in (1..=40).rev() {
            log.record(i * 10, i);
        }
        log.record(400, 7);
        let recent = log.recent();
        assert_eq!(recent.len(), KEPT);
        assert!(recent.windows(2).all(|w| w[0].0 < w[1].0), "{recent:?}");
        assert_eq!(recent.last(), Some(&(400, 7)));
    }

    #[test]
    fn the_interval_doubles_with_each_doubling_of_the_etcd_history() {
        use fenced_core::etcd::PutRequest;
        use fenced_core::{Batch, Command, EtcdCommand, Request, Semantics};
        let mut m = StateMachine::new();
        assert_eq!(interval_at(1_000, &m), 1_000);
        // 2 × VERSIONS_PER_DOUBLING versions: two doublings (weight 2 has two bits' length).
        let puts: Vec<Request> = (0..2 * VERSIONS_PER_DOUBLING)
            .map(|i| Request {
                time_ms: 1,
                client: None,
                cmd: Command::Etcd(EtcdCommand::Put(PutRequest::new(format!("k{i}"), "v"))),
            })
            .collect();
        for (n, chunk) in puts.chunks(10_000).enumerate() {
            let batch = Batch {
                requests: chunk.to_vec(),
                semantics: Semantics::NEWEST,
            };
            m.apply_batch(n as u64 + 1, &batch);
        }
        assert_eq!(m.etcd().version_count(), 2 * VERSIONS_PER_DOUBLING);
        assert_eq!(interval_at(1_000, &m), 4_000);
        assert_eq!(interval_at(0, &m), 0, "off stays off");
    }

    #[test]
    fn digests_are_taken_at_multiples_of_the_interval_and_equal_states_agree() {
        let mut a = Digester::default();
        a.start(5);
        let mut m = StateMachine::new();
        for i in 1..=12 {
            a.applied(i, &mut m);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while a.log().recent().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let recent = a.log().recent();
        assert_eq!(
            recent.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![5, 10]
        );
        assert_eq!(recent[0].1, StateMachine::new().digest());
        // Inline: the digests are there as soon as the entries are applied.
        let mut inline = Digester::new(Io::Inline);
        inline.start(5);
        let mut m = StateMachine::new();
        for i in 1..=12 {
            inline.applied(i, &mut m);
        }
        assert_eq!(inline.log().recent(), recent);
        // The hook changes the state: the digest shows it.
        let mut b = Digester::default();
        b.set_diverge_at(3);
        let mut n = StateMachine::new();
        b.applied(3, &mut n);
        assert_ne!(n.digest(), StateMachine::new().digest());
    }
}
