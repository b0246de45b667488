//! Linearizable reads: one path for every front end (RESP, gRPC, `fenced snapshot save`,
//! `/ready`), in the three flavours reads need.
//!
//! * **A read barrier alone** ([`Node::read_barrier`], [`Node::read`]): the leader confirms
//!   its leadership with a quorum (a read-index round that started after the call, shared by
//!   every read that arrived meanwhile) and this node applies up to that index. For reads that
//!   judge no time (`/ready`).
//! * **The time committed first** ([`Node::read_timed`]), for reads that judge expiry or
//!   report a lease or TTL left: after the barrier, if the state machine's log time is behind
//!   the leader's log clock when the read-index check started (after every read it serves
//!   arrived), a [`Command::Tick`] is committed (stamped by the leader when its entry closes,
//!   so later) and applied here first; the read is then judged at the state machine's own
//!   `now()`. A read whose answer is the same at the state's log time and at the leader's
//!   clock (a `GET` of a key without a deadline in between) needs no tick ([`time_free`]).
//!   Never at a clock reading no
//!   entry committed: a new leader's clock continues from the last *committed* log time, so a
//!   key judged expired (or lease time judged gone) at an uncommitted time could come back
//!   after a failover. The tick is single-flight — every read that needs one while a tick
//!   runs shares the next — and is retried like any proposal until it is applied (it has no
//!   request id and changes nothing but the time and what is due), so reads never answer
//!   "outcome unknown" and never burn a revision each. On a busy cluster the entries of other
//!   commands carry the time: a read whose node has an entry in flight, or applied one
//!   recently, first waits about as long as a tick takes for them, and rarely needs a tick.
//! * **An O(1) copy-on-write clone** after either barrier ([`Node::read_clone_timed`],
//!   [`Node::read_clone`], [`Node::backup`]), for reads that may scan the whole state (RESP's
//!   `KEYS`/`SCAN`, whose reads the RESP front end cannot tell from point reads, etcd's
//!   `Range` and read-only `Txn`, and snapshot saves): the scan runs without holding the state
//!   lock that apply needs.
//!
//! Every answer of a read is judged at a time the log holds, so it is the same on every node:
//! a follower gets the tick committed through the leader and waits to apply it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use fenced_core::{Command, StateMachine};
use fenced_raft_types::NodeId;
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::time::Instant;

use super::{refused, Inner, Node, RETRY_PAUSE};
use crate::batch::{Batcher, Limits};
use crate::error::NodeError;
use crate::proposal::PROPOSE_TIMEOUT;

/// Read-index rounds and read ticks: one at a time, so every read waits for a round (a tick)
/// that starts after it arrived; all reads that arrive during one share the next.
const READ_LIMITS: Limits = Limits {
    in_flight: 1,
    max_items: usize::MAX,
    max_bytes: usize::MAX,
    cap_bytes: usize::MAX,
    // Set from `--max-pending-requests`.
    max_queued: usize::MAX,
};

/// How long a read that needs the log time committed waits for entries already in flight to
/// bring it before it commits a tick: about what a tick takes (its running average, as
/// measured here, times 3/2), within these bounds. On an idle cluster it does not wait.
const TRAFFIC_WAIT_MIN: Duration = Duration::from_millis(5);
const TRAFFIC_WAIT_MAX: Duration = Duration::from_millis(100);
/// The tick's cost assumed before one was measured.
const TICK_COST_GUESS: Duration = Duration::from_millis(10);

/// The shared rounds of the read path.
pub(super) struct Reads {
    /// Read-index rounds, shared by the reads that arrived while the previous one ran:
    /// `(read index, leader log time)`.
    rounds: Batcher<(), Result<(u64, u64), NodeError>>,
    /// Ticks committing the log time for the reads that judge it, shared the same way. Each
    /// read gives the leader log time it needs; the answer is a committed log time to wait
    /// for locally.
    ticks: Batcher<u64, Result<u64, NodeError>>,
    /// Running average of a successful read tick's duration, in µs.
    tick_cost_us: AtomicU64,
    /// The committed log time the last read tick answered: an entry applied at it is (most
    /// likely) that tick, not traffic.
    last_tick_at: AtomicU64,
}

impl Reads {
    pub(super) fn new(me: &Weak<Inner>, max_queued: usize) -> Reads {
        let limits = Limits {
            max_queued,
            ..READ_LIMITS
        };
        Reads {
            rounds: Batcher::spawn(limits, {
                let me = me.clone();
                move |batch: Vec<()>| {
                    let node = Node::upgrade(&me);
                    async move {
                        let round = match node {
                            Some(node) => node.read_round().await,
                            None => Err(NodeError::Fatal("node stopped".into())),
                        };
                        vec![round; batch.len()]
                    }
                }
            }),
            ticks: Batcher::spawn(limits, {
                let me = me.clone();
                move |needed: Vec<u64>| {
                    let node = Node::upgrade(&me);
                    let n = needed.len();
                    let needed = needed.into_iter().max().unwrap_or(0);
                    async move {
                        let tick = match node {
                            Some(node) => node.read_tick(needed).await,
                            None => Err(NodeError::Fatal("node stopped".into())),
                        };
                        vec![tick; n]
                    }
                }
            }),
            tick_cost_us: AtomicU64::new(TICK_COST_GUESS.as_micros() as u64),
            last_tick_at: AtomicU64::new(0),
        }
    }

    /// How long to wait for traffic to carry the time before ticking.
    fn traffic_wait(&self) -> Duration {
        let cost = Duration::from_micros(self.tick_cost_us.load(Ordering::Relaxed));
        (cost * 3 / 2).clamp(TRAFFIC_WAIT_MIN, TRAFFIC_WAIT_MAX)
    }

    /// Account a successful tick that took `took`: average over about the last 8.
    fn tick_took(&self, took: Duration) {
        let took = took.as_micros().min(u64::MAX as u128) as u64;
        let avg = self.tick_cost_us.load(Ordering::Relaxed);
        self.tick_cost_us
            .store(avg - avg / 8 + took / 8, Ordering::Relaxed);
    }
}

/// A read's error: a read changes nothing, so it never answers "outcome unknown" — a timeout
/// (no quorum, no leader, not caught up in time) is "unavailable, try again".
fn read_error(e: NodeError) -> NodeError {
    match e {
        NodeError::Unknown(m) => {
            tracing::debug!("read: {m}");
            NodeError::NotLeader { leader: None }
        }
        other => other,
    }
}

impl Node {
    /// Wait until a read on this node's state machine is linearizable: the leader confirms
    /// its leadership with a quorum (read-index) and this node has applied up to that index.
    /// Nothing about time: see [`Node::read_timed`] for reads that judge it.
    pub async fn read_barrier(&self) -> Result<(), NodeError> {
        self.read_barrier_time()
            .await
            .map(|_| ())
            .map_err(read_error)
    }

    /// Read the state machine linearizably, judging no time (a read barrier alone).
    pub async fn read<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> Result<T, NodeError> {
        self.read_barrier().await?;
        Ok(self.inner.state.read(f))
    }

    /// A linearizable read that judges time: `f` gets the state machine and its own log time,
    /// which the log holds and which is at or after the leader's log clock when the read-index
    /// check started (the module docs). Expiry, leases left and limiter state are judged at it.
    ///
    /// `f` may be called more than once: when the state's log time is behind the leader's
    /// clock, `f` is first asked at both times, and if it answers the same, that answer is
    /// given without committing the time ([`time_free`]).
    pub async fn read_timed<T: PartialEq>(
        &self,
        f: impl Fn(&StateMachine, u64) -> T,
    ) -> Result<T, NodeError> {
        let leader_now = self.read_barrier_time().await.map_err(read_error)?;
        if let Some(answer) = self.inner.state.read(|sm| time_free(sm, leader_now, &f)) {
            return Ok(answer);
        }
        self.commit_time(leader_now).await.map_err(read_error)?;
        Ok(self.inner.state.read(|sm| f(sm, sm.now())))
    }

    /// [`Node::read_timed`] on an O(1) copy-on-write clone of the state, for reads that may
    /// scan it all without holding the state lock apply needs.
    pub async fn read_clone_timed<T: PartialEq>(
        &self,
        f: impl Fn(&StateMachine, u64) -> T,
    ) -> Result<T, NodeError> {
        let leader_now = self.read_barrier_time().await.map_err(read_error)?;
        let sm = self.inner.state.read(StateMachine::clone);
        if let Some(answer) = time_free(&sm, leader_now, &f) {
            return Ok(answer);
        }
        drop(sm);
        self.commit_time(leader_now).await.map_err(read_error)?;
        let sm = self.inner.state.read(StateMachine::clone);
        Ok(f(&sm, sm.now()))
    }

    /// [`Node::read`] on an O(1) copy-on-write clone of the state (the read barrier alone, no
    /// time judged): for reads that may scan a large part of it (etcd's `Range`) without
    /// holding the state lock apply needs.
    pub async fn read_clone<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> Result<T, NodeError> {
        self.read_barrier().await?;
        let sm = self.inner.state.read(StateMachine::clone);
        Ok(f(&sm))
    }

    /// A consistent copy of the state as of a linearizable read that started with this call
    /// (an O(1) clone after a read barrier), with the meta of a snapshot of it
    /// (`fenced snapshot save`).
    pub async fn backup(
        &self,
    ) -> Result<
        (
            openraft::SnapshotMeta<NodeId, openraft::BasicNode>,
            StateMachine,
        ),
        NodeError,
    > {
        self.read_barrier().await?;
        Ok(self.inner.state.backup())
    }

    /// Commit the time after a read barrier that saw the leader's clock at `leader_now`: when
    /// this returns, the state machine here has applied up to the read index and its log time
    /// is at or after `leader_now` (or at a tick a later leader stamped after it).
    async fn commit_time(&self, leader_now: u64) -> Result<(), NodeError> {
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        if self.inner.state.read(StateMachine::now) >= leader_now {
            return Ok(());
        }
        let committed = self
            .inner
            .reads
            .ticks
            .call(leader_now, 0, |why| {
                Err(refused(why, "the read tick batcher stopped"))
            })
            .await?;
        self.applied_time_at_least(committed, give_up).await
    }

    /// One shared read tick: unless the log time already reached `needed` (the latest leader
    /// log time its reads saw; other entries often carry it), commit a `Tick` through the
    /// leader — it started after every read of this round saw the leader's clock, so its
    /// entry is stamped at or after all of them — retrying until one is applied or
    /// [`PROPOSE_TIMEOUT`]. Returns a committed log time at or after the tick's, for the
    /// reads to wait for here.
    async fn read_tick(&self, needed: u64) -> Result<u64, NodeError> {
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        if let Some(applied) = self.carried_by_traffic(needed).await {
            return Ok(applied);
        }
        loop {
            let applied = self.inner.state.read(StateMachine::now);
            if applied >= needed {
                return Ok(applied);
            }
            let started = Instant::now();
            match self.propose(None, Command::Tick).await {
                // Applied on the leader: its log time then, as the forwarded answer reported
                // it, or this node's own if it leads.
                Ok(_) => {
                    let at = self.log_time();
                    self.inner.reads.tick_took(started.elapsed());
                    self.inner.reads.last_tick_at.store(at, Ordering::Relaxed);
                    return Ok(at);
                }
                // The cluster's CORRUPT alarm refuses the tick: retrying changes nothing.
                Err(e @ (NodeError::Fatal(_) | NodeError::Corrupt(_))) => return Err(e),
                Err(e) if Instant::now() >= give_up => return Err(e),
                Err(e) => tracing::debug!("read tick: {e}; retrying"),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// On a busy cluster the entries of other commands bring the log time to `needed`
    /// without a tick: if an entry is in flight here (appended, not applied) or the last one
    /// applied is recent, wait up to about what a tick takes ([`TRAFFIC_WAIT_MAX`]) for the
    /// applied log time to reach `needed`. The applied log time
    /// then, or `None` if it did not (an idle cluster does not wait at all).
    async fn carried_by_traffic(&self, needed: u64) -> Option<u64> {
        let applied = self.inner.state.read(StateMachine::now);
        if applied >= needed {
            return Some(applied);
        }
        let wait = self.inner.reads.traffic_wait();
        // Busy: an entry is in flight here, or the last one applied — not a read tick of
        // this node — was stamped less than the wait before the time needed (so entries
        // come about that often).
        let recent = needed - applied <= wait.as_millis() as u64
            && applied > self.inner.reads.last_tick_at.load(Ordering::Relaxed);
        let in_flight = {
            let m = self.inner.raft.metrics();
            let m = m.borrow();
            m.last_log_index > m.last_applied.map(|l| l.index)
        };
        if !in_flight && !recent {
            return None;
        }
        let state = self.inner.state.clone();
        let reached = self
            .inner
            .raft
            .wait(Some(wait))
            .metrics(
                move |_| state.read(StateMachine::now) >= needed,
                "traffic to carry the log time",
            )
            .await
            .is_ok();
        reached.then(|| self.inner.state.read(StateMachine::now))
    }

    /// Wait until this node's state machine reached log time `t` (a committed one), or the
    /// cluster's `CORRUPT` alarm is raised in it (`Err(Corrupt)`: under apply rules 15 the
    /// alarm stops the replicated clock, so `t` may never be reached).
    async fn applied_time_at_least(&self, t: u64, give_up: Instant) -> Result<(), NodeError> {
        if self.inner.state.read(StateMachine::now) >= t {
            return Ok(());
        }
        let state = self.inner.state.clone();
        let left = give_up.saturating_duration_since(Instant::now());
        self.inner
            .raft
            .wait(Some(left.max(Duration::from_millis(100))))
            .metrics(
                move |_| state.read(|sm| sm.now() >= t || sm.cluster_alarm().is_some()),
                "the read tick applied",
            )
            .await
            .map_err(|e| NodeError::Unknown(format!("applying the read tick: {e}")))
            .and_then(|_| self.cluster_serving())
    }

    /// The read barrier, returning the leader's log clock when the read-index check started.
    async fn read_barrier_time(&self) -> Result<u64, NodeError> {
        // An alarmed member (its state diverged) serves no reads.
        self.serving()?;
        let give_up = Instant::now() + PROPOSE_TIMEOUT;
        loop {
            let attempt = self.shared_read_round().await;
            match attempt {
                Ok((index, time)) => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    return self
                        .inner
                        .raft
                        .wait(Some(left.max(Duration::from_millis(100))))
                        .applied_index_at_least(Some(index), "read barrier")
                        .await
                        .map_err(|e| NodeError::Unknown(format!("catching up: {e}")))
                        // The cluster's alarm, as of the state the read is served from.
                        .and_then(|_| self.cluster_serving())
                        .map(|()| time);
                }
                Err(NodeError::NotLeader { .. } | NodeError::Unknown(_))
                    if Instant::now() < give_up => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// A read-index round that started after this call: `(read index, leader log time)`.
    /// Every caller that arrives while a round runs shares the next one ([`READ_LIMITS`]).
    /// On the leader, followers' forwarded rounds share it too.
    pub(crate) async fn shared_read_round(&self) -> Result<(u64, u64), NodeError> {
        self.inner
            .reads
            .rounds
            .call((), 0, |why| Err(refused(why, "the read batcher stopped")))
            .await
    }

    /// One read-index round: on the leader a quorum check, on a follower one forwarded
    /// round on the leader (which shares it with the leader's own reads the same way).
    /// The leader log time is its clock when the round starts: after every read it serves
    /// arrived, so a read judged at or after it is judged at a time after it was asked; any
    /// later is more than a read needs, and costs waiting for a later entry.
    async fn read_round(&self) -> Result<(u64, u64), NodeError> {
        let started = self.leader_time_now();
        match self.read_index_local().await {
            Ok(index) => Ok((index, started)),
            Err(NodeError::NotLeader { leader: Some(addr) }) => {
                self.inner.forwarder.read_index(&addr).await
            }
            Err(e) => Err(e),
        }
    }

    /// On the leader: the index a linearizable read must wait for.
    async fn read_index_local(&self) -> Result<u64, NodeError> {
        self.leader_term()?;
        match self.inner.raft.get_read_log_id().await {
            Ok((read, _applied)) => Ok(read.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(NodeError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Err(RaftError::APIError(e)) => Err(NodeError::Unknown(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(NodeError::Fatal(e.to_string())),
        }
    }

    /// The leader's log clock now (this node leads), never behind the applied log time.
    fn leader_time_now(&self) -> u64 {
        let applied = self.inner.state.read(StateMachine::now);
        match self.leader_term() {
            Ok(term) => self.inner.clock.peek(term, || applied).max(applied),
            Err(_) => applied,
        }
    }
}

/// The answer of a read that needs no time committed, judged at the state's own (committed)
/// log time: the state already reached `leader_now`, or `f` answers the same at both times.
/// Without writes a read's answer moves one way as time passes (keys and grants only expire,
/// TTLs only fall, limiters only refill), so an answer equal at both ends is the answer at
/// every time between them — a later leader, whose clock continues from the last committed
/// time, cannot contradict it. A plain `GET` of a key far from its deadline, or of one without
/// any, thus costs no tick; a `PTTL` of an expiring key does.
///
/// This holds only if `f` judges every deadline at the time it is given, never at the state's
/// own applied time: a read that asked "is the session there" of an unticked state would
/// answer the same at both times, and call a session alive whose deadline passed on the
/// leader's clock. So the state machine's time-dependent views take the time
/// ([`StateMachine::session_info`] needs `now`, as `Keyspace`'s expiring reads do): a read
/// cannot ask them without saying at what time.
fn time_free<T: PartialEq>(
    sm: &StateMachine,
    leader_now: u64,
    f: &impl Fn(&StateMachine, u64) -> T,
) -> Option<T> {
    let committed = sm.now();
    let answer = f(sm, committed);
    if committed >= leader_now || f(sm, leader_now) == answer {
        Some(answer)
    } else {
        None
    }
}
