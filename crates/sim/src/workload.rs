//! The simulated clients: each loops over lock cycles (acquire with or without a wait, fence
//! and write at the simulated protected storage, hold — sometimes past the lease —, release)
//! and register operations (put, get, compare-and-set through a Lua script), on nodes picked at
//! random, retrying a request with the same request id through other nodes after an unknown
//! outcome, and recording every operation in the history.
//!
//! A client is one process of the history at a time: after an operation whose outcome stays
//! unknown it retires and carries on as a fresh process (docs/jepsen.md's contract).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use fenced_core::kv::{KvCommand, Reply};
use fenced_core::{Command, RequestId, Response, StateMachine};
use fenced_jepsen::history::{Event, Kind};
use fenced_server::NodeError;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use crate::history::{History, Pending};
use crate::world::{Cluster, Gone};

#[path = "uniform.rs"]
pub mod uniform;

/// What the clients do.
#[derive(Clone, Debug)]
pub struct Workload {
    pub clients: usize,
    pub locks: usize,
    pub keys: usize,
    /// Lease lengths asked for, ms.
    pub ttl_ms: (u64, u64),
    /// Share of operations that are lock cycles.
    pub lock_share: f64,
    /// Share of operations that are lock cycles inside a session (open, acquire, keep-alives
    /// or a lapse, release, close).
    pub session_share: f64,
    /// Share of operations on keys with a TTL (`put-ttl`, `read-ttl`); the rest are register
    /// operations.
    pub ttl_share: f64,
    /// How many nodes a client tries one request on (same request id) before it gives up
    /// with the last answer: 1 is a client that takes a refusal as final.
    pub tries: usize,
    /// Clock-rate drift bound of the nodes, in ppm: a lease asked for `ttl` is promised
    /// `ttl·(1 − ρ)` of real time (README, "The lease bound"); the history records that.
    pub drift_ppm: u64,
    /// Clients that speak RESP to the nodes' front ends (`resp.rs`).
    pub resp: crate::resp::RespSpec,
    /// Only `SET`s of one size, values of this many bytes (`uniform.rs`, `--uniform-writes`):
    /// every client entry is as long as every other of the same number of requests.
    pub uniform_writes: Option<usize>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            clients: 8,
            locks: 2,
            keys: 3,
            ttl_ms: (300, 3_000),
            lock_share: 0.4,
            session_share: 0.15,
            ttl_share: 0.15,
            tries: 3,
            drift_ppm: 100,
            resp: crate::resp::RespSpec::default(),
            uniform_writes: None,
        }
    }
}

/// The protected storage of the fencing story: per resource, the largest token it accepted.
/// A write with a smaller token is refused.
#[derive(Default)]
pub struct Storage {
    highest: BTreeMap<String, u64>,
    value: BTreeMap<String, i64>,
}

impl Storage {
    /// Accept `token` for `key` if it is at least every token accepted before.
    fn admit(&mut self, key: &str, token: u64) -> bool {
        let h = self.highest.entry(key.to_owned()).or_insert(0);
        if token < *h {
            return false;
        }
        *h = token;
        true
    }

    fn write(&mut self, key: &str, token: u64, value: i64) -> bool {
        if !self.admit(key, token) {
            return false;
        }
        self.value.insert(key.to_owned(), value);
        true
    }

    fn read(&self, key: &str) -> i64 {
        self.value.get(key).copied().unwrap_or(0)
    }
}

/// What the clients share.
pub struct Shared {
    pub cluster: Cluster,
    pub history: History,
    pub storage: RefCell<Storage>,
    pub next_process: Cell<u64>,
    pub spec: Workload,
    /// Set when the clients should finish their current operation and stop.
    pub stop: Cell<bool>,
}

/// A definite or unknown answer to a proposal.
enum Answer {
    Ok(Response),
    /// Certainly not applied.
    Refused(String),
    /// Maybe applied.
    Unknown(String),
}

/// What an accepted answer adds to the operation's completion.
type Fill = Box<dyn FnOnce(Event) -> Event>;

/// An operation's end ([`Client::op`]).
enum Done {
    Ok(Response),
    /// An answer, but not the one wanted (not granted, no such session, …).
    Failed,
    /// Refused before anything was applied (the node is down, no leader).
    Refused,
    /// Maybe applied: the process retired.
    Unknown,
}

fn plain() -> Option<Fill> {
    Some(Box::new(|e| e))
}

fn granted(r: &Response) -> Option<Fill> {
    match *r {
        Response::Granted { token, .. } => Some(Box::new(move |e: Event| e.token(token))),
        _ => None,
    }
}

fn token_of(r: &Response) -> Option<u64> {
    match r {
        Response::Granted { token, .. } => Some(*token),
        _ => None,
    }
}

struct Client {
    shared: Rc<Shared>,
    rng: StdRng,
    process: u64,
    seq: u64,
    /// The last value this client read from each register (what its compare-and-sets expect).
    seen: BTreeMap<String, String>,
}

/// Run one client until [`Shared::stop`].
pub async fn run(shared: Rc<Shared>, rng: StdRng) {
    let process = fresh(&shared);
    let mut c = Client {
        shared,
        rng,
        process,
        seq: 0,
        seen: BTreeMap::new(),
    };
    while !c.shared.stop.get() {
        if let Some(bytes) = c.shared.spec.uniform_writes {
            c.uniform_put(bytes).await;
            let pause = c.rng.gen_range(0..50);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            continue;
        }
        let dice: f64 = c.rng.gen();
        let spec = &c.shared.spec;
        let (locks, sessions) = (spec.lock_share, spec.lock_share + spec.session_share);
        if dice < locks {
            c.lock_cycle().await;
        } else if dice < sessions {
            c.session_cycle().await;
        } else if dice < sessions + spec.ttl_share {
            c.ttl_op().await;
        } else {
            c.register_op().await;
        }
        let pause = c.rng.gen_range(0..50);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn fresh(shared: &Shared) -> u64 {
    let p = shared.next_process.get();
    shared.next_process.set(p + 1);
    p
}

impl Client {
    fn retire(&mut self) {
        self.process = fresh(&self.shared);
        self.seq = 0;
    }

    fn rid(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            // Distinct per process and never 0.
            client_id: 1_000_000 + self.process,
            seq: self.seq,
        }
    }

    fn pick_node(&mut self) -> u64 {
        let ids = self.shared.cluster.ids();
        ids[self.rng.gen_range(0..ids.len())]
    }

    /// Propose `cmd` under one request id: through a random node, and again through other
    /// nodes (same id: exactly once) after an unknown outcome or a refusal, up to
    /// [`Workload::tries`] tries.
    async fn propose(&mut self, cmd: Command, wait_ms: u64) -> Answer {
        let rid = self.rid();
        let mut unknown: Option<String> = None;
        let mut refused = String::new();
        for _ in 0..self.shared.spec.tries.max(1) {
            let node = self.pick_node();
            let c = cmd.clone();
            let r = self
                .shared
                .cluster
                .call(node, move |n| async move {
                    if wait_ms > 0 {
                        // `false`: the id is the client's (it retries it through other
                        // nodes), as a gRPC caller's: a dropped wait withdraws the wait only.
                        n.acquire(rid, c, wait_ms, false).await
                    } else {
                        n.propose(Some(rid), c).await
                    }
                })
                .await;
            match r {
                Ok(Ok(Response::Pending)) => unknown = Some("still pending".into()),
                Ok(Ok(resp)) => return Answer::Ok(resp),
                Err(Gone::Down) => refused = format!("n{node} is down"),
                Err(Gone::Lost) => unknown = Some(format!("n{node} crashed during the call")),
                Ok(Err(NodeError::Unknown(m))) => unknown = Some(m),
                Ok(Err(e @ (NodeError::Invalid(_) | NodeError::Rejected(_)))) => {
                    return match unknown {
                        Some(u) => Answer::Unknown(format!("{u}; then {e}")),
                        None => Answer::Refused(e.to_string()),
                    }
                }
                Ok(Err(e)) => refused = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(10..100))).await;
        }
        match unknown {
            Some(u) => Answer::Unknown(u),
            None => Answer::Refused(refused),
        }
    }

    /// Propose `cmd` as the operation `inv` and record how it ended: an answer `accept` takes
    /// completes it `ok` (with what `accept` adds to the event), any other definite answer
    /// `fail`, an unknown outcome `info` — after which this process retires.
    async fn op(
        &mut self,
        inv: Pending,
        cmd: Command,
        wait_ms: u64,
        accept: impl FnOnce(&Response) -> Option<Fill>,
    ) -> Done {
        let h = self.shared.history.clone();
        match self.propose(cmd, wait_ms).await {
            Answer::Ok(r) => match accept(&r) {
                Some(fill) => {
                    h.complete(inv, Kind::Ok, fill);
                    Done::Ok(r)
                }
                None => {
                    h.complete(inv, Kind::Fail, |e| e.error(format!("{r:?}")));
                    Done::Failed
                }
            },
            Answer::Refused(m) => {
                h.complete(inv, Kind::Fail, |e| e.error(m));
                Done::Refused
            }
            Answer::Unknown(m) => {
                h.complete(inv, Kind::Info, |e| e.error(m));
                self.retire();
                Done::Unknown
            }
        }
    }

    /// A read on a random node's read path (RESP's: the time committed first, on a clone of
    /// the state), judged by `f` at the time it returns.
    async fn read<T: PartialEq>(
        &mut self,
        f: impl Fn(&StateMachine, u64) -> T,
    ) -> Result<Result<T, NodeError>, Gone> {
        let node = self.pick_node();
        self.shared
            .cluster
            .call(node, move |n| async move { n.read_clone_timed(f).await })
            .await
    }

    /// The lease the history records for `ttl`: what the lease bound promises in real time.
    fn promised(&self, ttl: u64) -> u64 {
        ttl - (ttl * self.shared.spec.drift_ppm).div_ceil(1_000_000)
    }

    async fn lock_cycle(&mut self) {
        let spec = &self.shared.spec;
        let lock = format!("L{}", self.rng.gen_range(0..spec.locks));
        let ttl = self.rng.gen_range(spec.ttl_ms.0..=spec.ttl_ms.1);
        let wait = if self.rng.gen_bool(0.5) {
            self.rng.gen_range(1..2_000)
        } else {
            0
        };
        let owner = format!("p{}", self.process);
        let promised = self.promised(ttl);
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, "acquire", &lock, |e| e.ttl_ms(promised));
        let cmd = Command::Acquire {
            name: lock.clone(),
            owner: owner.clone(),
            ttl_ms: ttl,
            session: None,
            wait_ms: wait,
        };
        let Done::Ok(r) = self.op(inv, cmd, wait, granted).await else {
            return;
        };
        let Some(token) = token_of(&r) else { return };
        // Register the token with storage, hold (sometimes past the lease: a paused holder),
        // then write with it: storage refuses it once a newer holder registered a larger one.
        if !self.storage_op("fence", &lock, token, None) {
            return self.release(&lock, &owner, token).await;
        }
        let hold = if self.rng.gen_bool(0.1) {
            self.rng.gen_range(ttl..ttl * 2)
        } else {
            self.rng.gen_range(0..ttl / 2)
        };
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let v = self.shared.storage.borrow().read(&lock) + 1;
        self.storage_op("fenced-write", &lock, token, Some(v));
        self.release(&lock, &owner, token).await;
    }

    /// A lock held through a session: open it (TTL `t`), acquire in it, keep it alive while
    /// holding (or, one time in five, let it lapse), write, release, close (or leave it to
    /// expire). A session-bound grant lasts as long as its session, so the history gives the
    /// acquire the session's TTL left at its invoke — `t` from the session's opening,
    /// less the drift bound — and each keep-alive is an `extend` of the lock by `t`.
    async fn session_cycle(&mut self) {
        let spec = &self.shared.spec;
        let ttl = self.rng.gen_range(spec.ttl_ms.0..=spec.ttl_ms.1);
        let lock = format!("L{}", self.rng.gen_range(0..spec.locks));
        let h = self.shared.history.clone();
        let promised = self.promised(ttl);
        let inv = h.invoke(self.process, "open-session", "session", |e| {
            e.ttl_ms(promised)
        });
        let opened = self.shared.history.now_ns();
        let opened_session = self
            .op(inv, Command::OpenSession { ttl_ms: ttl }, 0, |r| match *r {
                Response::SessionOpened { session, .. } => {
                    Some(Box::new(move |e: Event| e.value(json!(session))))
                }
                _ => None,
            })
            .await;
        let session = match opened_session {
            Done::Ok(Response::SessionOpened { session, .. }) => session,
            _ => return,
        };
        let owner = format!("p{}", self.process);
        let wait = if self.rng.gen_bool(0.5) {
            self.rng.gen_range(1..ttl)
        } else {
            0
        };
        let left = |now: u64| promised.saturating_sub((now - opened) / 1_000_000);
        let inv = h.invoke(self.process, "acquire", &lock, |e| {
            e.ttl_ms(left(h.now_ns()))
        });
        let cmd = Command::Acquire {
            name: lock.clone(),
            owner: owner.clone(),
            ttl_ms: ttl,
            session: Some(session),
            wait_ms: wait,
        };
        let token = match self.op(inv, cmd, wait, granted).await {
            Done::Ok(r) => token_of(&r),
            Done::Failed | Done::Refused => None,
            Done::Unknown => return,
        };
        let lapse = self.rng.gen_bool(0.2);
        if let Some(token) = token {
            if self.storage_op("fence", &lock, token, None) {
                // Hold for a while, keeping the session alive every third of its TTL.
                let hold = self.rng.gen_range(0..ttl * 2);
                let started = h.now_ns();
                while h.now_ns() - started < hold * 1_000_000 {
                    tokio::time::sleep(Duration::from_millis(ttl / 3)).await;
                    if lapse {
                        continue;
                    }
                    let inv = h.invoke(self.process, "extend", &lock, |e| {
                        e.token(token).ttl_ms(promised)
                    });
                    let alive = |r: &Response| {
                        matches!(r, Response::SessionAlive { .. })
                            .then(plain)
                            .flatten()
                    };
                    match self.op(inv, Command::KeepAlive { session }, 0, alive).await {
                        Done::Ok(_) | Done::Refused => {}
                        // The session is gone: stop holding.
                        Done::Failed => break,
                        Done::Unknown => return,
                    }
                }
                let v = self.shared.storage.borrow().read(&lock) + 1;
                self.storage_op("fenced-write", &lock, token, Some(v));
            }
            self.release(&lock, &owner, token).await;
        }
        if lapse || self.rng.gen_bool(0.3) {
            return;
        }
        let inv = h.invoke(self.process, "close-session", "session", |e| {
            e.value(json!(session))
        });
        let closed = |r: &Response| matches!(r, Response::SessionClosed).then(plain).flatten();
        self.op(inv, Command::CloseSession { session }, 0, closed)
            .await;
    }

    /// A write at the protected storage with `token` (instant: the storage is local).
    fn storage_op(&mut self, f: &str, lock: &str, token: u64, value: Option<i64>) -> bool {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, f, lock, |mut e| {
            e.token = Some(token);
            if let Some(v) = value {
                e = e.value(json!(v));
            }
            e
        });
        let accepted = {
            let mut s = self.shared.storage.borrow_mut();
            match value {
                Some(v) => s.write(lock, token, v),
                None => s.admit(lock, token),
            }
        };
        let kind = if accepted { Kind::Ok } else { Kind::Fail };
        h.complete(
            inv,
            kind,
            |e| {
                if accepted {
                    e
                } else {
                    e.error("stale token")
                }
            },
        );
        accepted
    }

    async fn release(&mut self, lock: &str, owner: &str, token: u64) {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, "release", lock, |e| e.token(token));
        let cmd = Command::Release {
            name: lock.to_owned(),
            owner: owner.to_owned(),
            token,
        };
        let released = |r: &Response| matches!(r, Response::Released { .. }).then(plain).flatten();
        self.op(inv, cmd, 0, released).await;
    }

    async fn register_op(&mut self) {
        let key = format!("k{}", self.rng.gen_range(0..self.shared.spec.keys));
        let value = format!("{}-{}", self.process, self.seq + 1);
        match self.rng.gen_range(0..3) {
            0 => self.get(&key).await,
            1 => {
                let argv = vec![
                    b"SET".to_vec(),
                    key.clone().into_bytes(),
                    value.clone().into_bytes(),
                ];
                self.write("put", &key, json!(value), argv).await
            }
            _ => {
                let Some(old) = self.seen.get(&key).cloned() else {
                    return self.get(&key).await;
                };
                let argv = vec![
                    b"EVAL".to_vec(),
                    CAS.as_bytes().to_vec(),
                    b"1".to_vec(),
                    key.clone().into_bytes(),
                    old.clone().into_bytes(),
                    value.clone().into_bytes(),
                ];
                self.write("cas", &key, json!([old, value]), argv).await
            }
        }
    }

    /// A key with a TTL: write it (`SET e v PX ttl`) or read its value and TTL together.
    async fn ttl_op(&mut self) {
        let key = format!("e{}", self.rng.gen_range(0..2));
        if self.rng.gen_bool(0.3) {
            let value = format!("{}-{}", self.process, self.seq + 1);
            let ttl = self.rng.gen_range(100..3_000u64);
            let argv = vec![
                b"SET".to_vec(),
                key.clone().into_bytes(),
                value.clone().into_bytes(),
                b"PX".to_vec(),
                ttl.to_string().into_bytes(),
            ];
            return self.write("put-ttl", &key, json!(value), argv).await;
        }
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, "read-ttl", &key, |e| e);
        let k = key.as_bytes().to_vec();
        let r = self
            .read(move |sm, now| {
                let v = sm.kv().read(now, &[b"GET".to_vec(), k.clone()]);
                let t = sm.kv().read(now, &[b"PTTL".to_vec(), k.clone()]);
                (v, t)
            })
            .await;
        match r {
            Ok(Ok((v, Some(Reply::Int(t))))) => {
                let v = match v {
                    Some(Reply::Bulk(b)) => json!(String::from_utf8_lossy(&b)),
                    _ => json!(null),
                };
                h.complete(inv, Kind::Ok, |e| e.value(json!([v, t])))
            }
            Ok(Ok(other)) => h.complete(inv, Kind::Fail, |e| e.error(format!("{other:?}"))),
            Ok(Err(e)) => h.complete(inv, Kind::Fail, |ev| ev.error(e.to_string())),
            Err(g) => h.complete(inv, Kind::Fail, |e| e.error(format!("{g:?}"))),
        }
    }

    async fn write(&mut self, f: &str, key: &str, v: serde_json::Value, argv: Vec<Vec<u8>>) {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, f, key, |e| e.value(v));
        let cmd = Command::Kv(KvCommand::Batch(vec![argv]));
        // `+OK` from SET, 1 from a compare-and-set that set; 0 (not equal) or an error: failed.
        let done = |r: &Response| match r {
            Response::Kv(k) => match k.replies.first() {
                Some(Reply::Status(_) | Reply::Int(1)) => plain(),
                _ => None,
            },
            _ => None,
        };
        self.op(inv, cmd, 0, done).await;
    }

    async fn get(&mut self, key: &str) {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, "get", key, |e| e);
        let k = key.as_bytes().to_vec();
        let r = self
            .read(move |sm, now| sm.kv().read(now, &[b"GET".to_vec(), k.clone()]))
            .await;
        match r {
            Ok(Ok(Some(Reply::Bulk(v)))) => {
                let v = String::from_utf8_lossy(&v).into_owned();
                self.seen.insert(key.to_owned(), v.clone());
                h.complete(inv, Kind::Ok, |e| e.value(json!(v)))
            }
            Ok(Ok(Some(Reply::Nil) | None)) => h.complete(inv, Kind::Ok, |e| e.value(json!(null))),
            Ok(Ok(other)) => h.complete(inv, Kind::Fail, |e| e.error(format!("{other:?}"))),
            Ok(Err(e)) => h.complete(inv, Kind::Fail, |ev| ev.error(e.to_string())),
            Err(g) => h.complete(inv, Kind::Fail, |e| e.error(format!("{g:?}"))),
        }
    }
}

/// Compare-and-set of a register: `KEYS[1]` from `ARGV[1]` to `ARGV[2]`.
pub(crate) const CAS: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                   redis.call('SET', KEYS[1], ARGV[2]) return 1 else return 0 end";
