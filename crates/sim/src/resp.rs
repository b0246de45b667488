//! Clients that speak RESP to a node's real front end (`fenced_resp::Front` on
//! `fenced_server::resp::backend`), over an in-memory stream instead of a socket: the
//! connection's own paths (pipelines, `MULTI`/`WATCH`, `LOCK.*` runs) and the backend's
//! (forwarded batches) run as in production.
//!
//! A connection is one `tokio::io::duplex` to one node. Bytes cross the simulated network's
//! hop delay each way, in order (a TCP stream); a paused node holds them both ways; a crash
//! of the node kills the connection (the server's side stops at once, the client's requests
//! in flight become unknown outcomes).
//!
//! The workload ([`RespSpec`]) and its checkers:
//! * **Pipelines** of 2–k `INCR p:<client>` in one write: the replies are consecutive
//!   integers in pipeline order, above every reply the client had before; pipelines of 2–k
//!   `LOCK.ACQUIRE` of fresh private locks in one write (a `LOCK.*` run: one proposal each,
//!   queued as one group, forwarded together): their tokens — the store's revisions — rise in
//!   pipeline order, above every token the client had before. Checker `pipeline-order`.
//! * **WATCH/MULTI with a failing command**: on a private hash `h` (`HSET h f notanumber`
//!   once), cycles of `WATCH h`, `HINCRBY h f 1` (fails: not an integer, which changes
//!   nothing — docs/resp.md), then `MULTI`, `HSET h g n`, `EXEC` in one write. Nobody else
//!   writes `h`, so `EXEC` never aborts — unless a write of the client to `h` had an unknown
//!   outcome (it may apply later and change the revision `WATCH` saw); the client then moves
//!   on to a fresh key. Checker `watch`.
//! * **Register operations over RESP** and **`CL.THROTTLE` pipelines**: in `resp_ops.rs`;
//!   checkers `linearizability` (the run's history) and `throttle` (`throttle.rs`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use fenced_jepsen::checker::Verdict;
use fenced_resp::frame::{parse_frame, Frame, Limits};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::net::Net;
use crate::workload::Shared;
use crate::world::{Cluster, Gone};

/// The RESP clients of a run.
#[derive(Clone, Debug)]
pub struct RespSpec {
    /// RESP clients, besides the workload's direct ones (0: none).
    pub clients: usize,
    /// Longest pipeline (at least 2).
    pub pipeline_max: usize,
    /// Relative weights of `INCR` pipelines, `LOCK.ACQUIRE` pipelines, `WATCH` cycles,
    /// register operations over RESP (`eval`) and `CL.THROTTLE` pipelines (`throttle`;
    /// both in `resp_ops.rs`), and pipelines of the whole lock family (`family`: read,
    /// write, permit, multi-lock and session acquires; 0 by default, so the seeds of
    /// docs/simulation.md run as they did when they were found).
    pub mix: [u32; 6],
    /// Longest pause between two operations of a client, ms (drawn from 0 up to it).
    pub think_ms: u64,
}

impl Default for RespSpec {
    fn default() -> Self {
        RespSpec {
            clients: 1,
            pipeline_max: 8,
            mix: [4, 3, 3, 3, 2, 0],
            think_ms: 250,
        }
    }
}

/// The longest a client waits for a reply before it takes the connection as dead.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// One RESP connection from a simulated client to node `node`.
pub struct Conn {
    node: u64,
    net: Arc<Net>,
    tx: WriteHalf<DuplexStream>,
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    buf: Vec<u8>,
    life: watch::Receiver<u64>,
    tasks: Vec<JoinHandle<()>>,
    /// Dropped with the connection: the server's side stops too.
    _shutdown: watch::Sender<bool>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Conn {
    /// Connect `client` to node `id`'s front end (one hop to get there).
    pub async fn open(cluster: &Cluster, id: u64, client: usize) -> Result<Conn, Gone> {
        let net = cluster.net().clone();
        tokio::time::sleep(net.hop()).await;
        net.unpaused(id).await;
        let (node, life) = cluster.node_life(id).ok_or(Gone::Down)?;
        let config =
            fenced_server::resp::config(&node, &cluster.config(id)).map_err(|_| Gone::Down)?;
        let (shutdown, stop) = watch::channel(false);
        let front = fenced_resp::Front::new(fenced_server::resp::backend(node), config, stop);
        let (mine, theirs) = tokio::io::duplex(1 << 20);
        let peer = SocketAddr::from(([10, 0, 1, (client % 250) as u8], 40_000));
        let local = SocketAddr::from(([10, 0, 0, id as u8], 7379));
        let mut crashed = life.clone();
        let server = tokio::task::spawn_local(async move {
            tokio::select! {
                biased;
                _ = crashed.changed() => {}
                _ = front.connection(theirs, peer, Some(local)) => {}
            }
        });
        let (mut read, tx) = tokio::io::split(mine);
        let (deliver, rx) = mpsc::unbounded_channel();
        let (relay_net, relay_life) = (net.clone(), life.clone());
        // The replies, one hop back each, in order; held while the node is paused.
        let relay = tokio::task::spawn_local(async move {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                tokio::time::sleep(relay_net.hop()).await;
                relay_net.unpaused(id).await;
                if relay_life.has_changed().unwrap_or(true)
                    || deliver.send(chunk[..n].to_vec()).is_err()
                {
                    return;
                }
            }
        });
        Ok(Conn {
            node: id,
            net,
            tx,
            rx,
            buf: Vec::new(),
            life,
            tasks: vec![server, relay],
            _shutdown: shutdown,
        })
    }

    pub fn node(&self) -> u64 {
        self.node
    }

    /// Send `cmds` in one write (a pipeline): one hop to the node.
    pub async fn send(&mut self, cmds: &[Vec<Vec<u8>>]) -> Result<(), Gone> {
        let mut out = Vec::new();
        for argv in cmds {
            encode(argv, &mut out);
        }
        tokio::time::sleep(self.net.hop()).await;
        self.net.unpaused(self.node).await;
        if self.life.has_changed().unwrap_or(true) {
            return Err(Gone::Lost);
        }
        self.tx.write_all(&out).await.map_err(|_| Gone::Lost)
    }

    /// The next reply.
    pub async fn recv(&mut self) -> Result<Frame, Gone> {
        let deadline = tokio::time::Instant::now() + REPLY_TIMEOUT;
        loop {
            match parse_frame(&self.buf, &Limits::default()) {
                Ok(Some((f, n))) => {
                    self.buf.drain(..n);
                    return Ok(f);
                }
                Ok(None) => {}
                Err(_) => return Err(Gone::Lost),
            }
            tokio::select! {
                biased;
                _ = self.life.changed() => return Err(Gone::Lost),
                c = self.rx.recv() => match c {
                    Some(c) => self.buf.extend_from_slice(&c),
                    None => return Err(Gone::Lost),
                },
                _ = tokio::time::sleep_until(deadline) => return Err(Gone::Lost),
            }
        }
    }
}

/// `argv` as a RESP array of bulk strings.
pub fn encode(argv: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
    for a in argv {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn argv(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// A pipeline's outcome, for `pipeline-order`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pipeline {
    pub client: usize,
    /// `incr` (replies: the counter) or `lock` (replies: the tokens).
    pub kind: &'static str,
    /// The largest reply of this kind the client had before it sent the pipeline.
    pub before: Option<i64>,
    /// One per command, in order: its integer reply, or `None` (an error, no reply).
    pub replies: Vec<Option<i64>>,
    pub at_ns: u64,
}

/// How a `WATCH … EXEC` cycle's `EXEC` ended, for `watch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exec {
    Committed,
    /// Nil: a watched key changed.
    Aborted,
    /// Nothing applied (`-TRYAGAIN`, `-BUSY`, …).
    Failed(String),
    /// A write to the key whose outcome is unknown (this `EXEC`, or the `HSET` making it).
    Unknown(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCycle {
    pub client: usize,
    pub key: String,
    pub exec: Exec,
    pub at_ns: u64,
}

/// What the RESP clients saw.
#[derive(Default, Debug)]
pub struct Log {
    pub pipelines: Vec<Pipeline>,
    pub cycles: Vec<WatchCycle>,
    pub throttles: Vec<crate::throttle::Throttle>,
    /// The nodes' clock-rate drift bound, ppm (for `throttle`).
    pub drift_ppm: u64,
}

/// The RESP clients' shared record. Cheap to clone.
#[derive(Clone, Default)]
pub struct Resp {
    log: Rc<RefCell<Log>>,
}

impl Resp {
    /// `pipeline-order` and `watch` over what the clients saw.
    pub fn verdicts(&self) -> Vec<Verdict> {
        let log = self.log.borrow();
        vec![
            check_pipelines(&log.pipelines),
            check_watch(&log.cycles),
            crate::throttle::check(&log.throttles, log.drift_ppm),
        ]
    }

    /// The record, as bytes for the fingerprint.
    pub fn digest(&self) -> Vec<u8> {
        format!("{:?}", self.log.borrow()).into_bytes()
    }
}

/// Each pipeline's integer replies rise in pipeline order (`incr`: by exactly one from one
/// command to the next), the first above everything the client had before.
pub fn check_pipelines(pipelines: &[Pipeline]) -> Verdict {
    let mut bad = Vec::new();
    for p in pipelines {
        let mut last: Option<(usize, i64)> = None;
        for (i, r) in p.replies.iter().enumerate() {
            let Some(v) = *r else { continue };
            let why = match last {
                None => p
                    .before
                    .filter(|b| v <= *b)
                    .map(|b| format!("reply {i} is {v}, not above {b} the client had before")),
                Some((j, u)) if p.kind == "incr" && j + 1 == i && v != u + 1 => {
                    Some(format!("reply {i} is {v} after {u}: not consecutive"))
                }
                Some((_, u)) if v <= u => Some(format!("reply {i} is {v} after {u}: out of order")),
                _ => None,
            };
            if let Some(why) = why {
                bad.push(format!(
                    "client r{} {} pipeline done at {} ms {:?}: {why}",
                    p.client,
                    p.kind,
                    p.at_ns / 1_000_000,
                    p.replies
                ));
                break;
            }
            last = Some((i, v));
        }
    }
    Verdict::new(
        "pipeline-order",
        bad.len() as u64,
        bad,
        json!({ "pipelines": pipelines.len() }),
    )
}

/// No `EXEC` aborts on a key only its client writes, before a write of it to the key had an
/// unknown outcome (docs/resp.md: `EXEC` aborts only if a watched key's revision changed; a
/// command that fails changes nothing).
pub fn check_watch(cycles: &[WatchCycle]) -> Verdict {
    let mut unknown: BTreeMap<&str, bool> = BTreeMap::new();
    let mut bad = Vec::new();
    for c in cycles {
        match &c.exec {
            Exec::Unknown(_) => {
                unknown.insert(&c.key, true);
            }
            Exec::Aborted if !unknown.get(c.key.as_str()).copied().unwrap_or(false) => {
                bad.push(format!(
                    "client r{}: EXEC on {} aborted at {} ms, though nobody else writes it and none of its writes had an unknown outcome",
                    c.client,
                    c.key,
                    c.at_ns / 1_000_000
                ))
            }
            _ => {}
        }
    }
    let committed = cycles.iter().filter(|c| c.exec == Exec::Committed).count();
    Verdict::new(
        "watch",
        bad.len() as u64,
        bad,
        json!({ "cycles": cycles.len(), "committed": committed }),
    )
}

/// One RESP client, until the workload stops.
pub async fn run(shared: Rc<Shared>, resp: Resp, spec: RespSpec, client: usize, rng: StdRng) {
    resp.log.borrow_mut().drift_ppm = shared.spec.drift_ppm;
    let mut c = Client {
        ops: crate::resp_ops::Ops::new(shared.clone(), client),
        cluster: shared.cluster.clone(),
        resp,
        spec,
        client,
        rng,
        conn: None,
        best: BTreeMap::new(),
        key: 0,
        ready: false,
        pipelines: 0,
    };
    while !shared.stop.get() {
        if c.conn.is_none() {
            let node = c.rng.gen_range(1..=c.cluster.ids().len() as u64);
            match Conn::open(&c.cluster, node, client).await {
                Ok(conn) => c.conn = Some(conn),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(c.rng.gen_range(50..200))).await;
                    continue;
                }
            }
        }
        let [incr, lock, watch, eval, throttle, family] = c.spec.mix;
        let pick = c
            .rng
            .gen_range(0..(incr + lock + watch + eval + throttle + family).max(1));
        let ok = if pick < incr {
            c.incr_pipeline().await
        } else if pick < incr + lock {
            c.lock_pipeline().await
        } else if pick < incr + lock + watch {
            c.watch_cycle().await
        } else if pick < incr + lock + watch + eval {
            c.eval_op().await
        } else if pick < incr + lock + watch + eval + throttle {
            c.throttle_pipeline().await
        } else {
            c.family_pipeline().await
        };
        // A dead connection, or now and then a move to another node.
        if ok.is_err() || c.rng.gen_bool(0.05) {
            c.conn = None;
        }
        let think = c.rng.gen_range(0..=c.spec.think_ms);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
}

struct Client {
    ops: crate::resp_ops::Ops,
    cluster: Cluster,
    resp: Resp,
    spec: RespSpec,
    client: usize,
    rng: StdRng,
    conn: Option<Conn>,
    /// The largest reply so far, per pipeline kind.
    best: BTreeMap<&'static str, i64>,
    /// The watched key's generation: a new one after an unknown outcome on the old.
    key: u64,
    /// Whether the watched key holds its `f` (not an integer).
    ready: bool,
    pipelines: u64,
}

fn error_text(f: &Frame) -> Option<String> {
    match f {
        Frame::Error(e) => Some(String::from_utf8_lossy(e).into_owned()),
        _ => None,
    }
}

impl Client {
    fn conn(&mut self) -> Result<&mut Conn, Gone> {
        self.conn.as_mut().ok_or(Gone::Down)
    }

    fn now_ns(&self) -> u64 {
        self.cluster.trace().now_ns()
    }

    fn who(&self) -> String {
        format!("r{}", self.client)
    }

    /// Send `cmds` as one pipeline and collect one reply each (`None` past a lost
    /// connection; the `Err` says it was lost).
    async fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> (Vec<Option<Frame>>, Result<(), Gone>) {
        let mut out: Vec<Option<Frame>> = vec![None; cmds.len()];
        let conn = match self.conn() {
            Ok(c) => c,
            Err(g) => return (out, Err(g)),
        };
        if let Err(g) = conn.send(cmds).await {
            return (out, Err(g));
        }
        for slot in out.iter_mut() {
            match conn.recv().await {
                Ok(f) => *slot = Some(f),
                Err(g) => return (out, Err(g)),
            }
        }
        (out, Ok(()))
    }

    async fn record_pipeline(
        &mut self,
        kind: &'static str,
        cmds: Vec<Vec<Vec<u8>>>,
    ) -> Result<(), Gone> {
        let node = self.conn()?.node();
        let before = self.best.get(kind).copied();
        let (frames, done) = self.pipeline(&cmds).await;
        let replies: Vec<Option<i64>> = frames
            .iter()
            .map(|f| match f {
                Some(Frame::Integer(i)) => Some(*i),
                _ => None,
            })
            .collect();
        if let Some(m) = replies.iter().flatten().max() {
            self.best.insert(kind, (*m).max(before.unwrap_or(i64::MIN)));
        }
        let errors: Vec<String> = frames.iter().flatten().filter_map(error_text).collect();
        self.cluster.trace().line(
            &self.who(),
            format!(
                "{kind} pipeline of {} on n{node}: {replies:?}{}{}",
                cmds.len(),
                if errors.is_empty() {
                    String::new()
                } else {
                    format!(" errors {errors:?}")
                },
                if done.is_err() {
                    " (connection lost)"
                } else {
                    ""
                },
            ),
        );
        let at_ns = self.now_ns();
        self.resp.log.borrow_mut().pipelines.push(Pipeline {
            client: self.client,
            kind,
            before,
            replies,
            at_ns,
        });
        done
    }

    async fn incr_pipeline(&mut self) -> Result<(), Gone> {
        let k = self.rng.gen_range(2..=self.spec.pipeline_max.max(2));
        let key = format!("p:{}", self.client);
        let cmds = vec![argv(&["INCR", &key]); k];
        self.record_pipeline("incr", cmds).await
    }

    async fn lock_pipeline(&mut self) -> Result<(), Gone> {
        let k = self.rng.gen_range(2..=self.spec.pipeline_max.max(2));
        self.pipelines += 1;
        let owner = format!("r{}", self.client);
        let cmds = (0..k)
            .map(|i| {
                let name = format!("pl:{}:{}:{i}", self.client, self.pipelines);
                argv(&["LOCK.ACQUIRE", &name, &owner, "200"])
            })
            .collect();
        self.record_pipeline("lock", cmds).await
    }

    /// A pipeline of the lock family's acquires of fresh private locks, one kind after
    /// another (`LOCK.READ`, `LOCK.WRITE`, `LOCK.PERMIT`, `LOCK.MACQUIRE` of two names,
    /// `LOCK.ACQUIRE … DELAY`), each with the client's own `REQID`: proposed as one run, so
    /// their tokens rise in pipeline order (checker `pipeline-order`, kind `family`).
    async fn family_pipeline(&mut self) -> Result<(), Gone> {
        let k = self.rng.gen_range(2..=self.spec.pipeline_max.max(2));
        self.pipelines += 1;
        let owner = format!("r{}", self.client);
        let client_id = (1 + self.client as u64).to_string();
        let cmds = (0..k)
            .map(|i| {
                let name = format!("pf:{}:{}:{i}", self.client, self.pipelines);
                let seq = (self.pipelines * 64 + i as u64).to_string();
                let mut a = match i % 5 {
                    0 => argv(&["LOCK.READ", &name, &owner, "200"]),
                    1 => argv(&["LOCK.WRITE", &name, &owner, "200"]),
                    2 => argv(&["LOCK.PERMIT", &name, &owner, "3", "200"]),
                    3 => argv(&[
                        "LOCK.MACQUIRE",
                        &owner,
                        "200",
                        "2",
                        &name,
                        &format!("{name}b"),
                    ]),
                    _ => argv(&["LOCK.ACQUIRE", &name, &owner, "200", "DELAY", "100"]),
                };
                a.extend(argv(&["REQID", &client_id, &seq]));
                a
            })
            .collect();
        self.record_pipeline("family", cmds).await
    }

    async fn eval_op(&mut self) -> Result<(), Gone> {
        let conn = self.conn.as_mut().ok_or(Gone::Down)?;
        self.ops.eval(conn, &mut self.rng).await
    }

    async fn throttle_pipeline(&mut self) -> Result<(), Gone> {
        let conn = self.conn.as_mut().ok_or(Gone::Down)?;
        let (records, done) = self.ops.throttle(conn, &mut self.rng).await;
        self.resp.log.borrow_mut().throttles.extend(records);
        done
    }

    fn cycle(&mut self, key: &str, exec: Exec) {
        let at_ns = self.now_ns();
        self.cluster
            .trace()
            .line(&self.who(), format!("watch cycle on {key}: {exec:?}"));
        if matches!(exec, Exec::Unknown(_)) {
            // The write may still apply: carry on with a fresh key.
            self.key += 1;
            self.ready = false;
        }
        self.resp.log.borrow_mut().cycles.push(WatchCycle {
            client: self.client,
            key: key.to_owned(),
            exec,
            at_ns,
        });
    }

    async fn watch_cycle(&mut self) -> Result<(), Gone> {
        let key = format!("h:{}:{}", self.client, self.key);
        if !self.ready {
            let (r, done) = self
                .pipeline(&[argv(&["HSET", &key, "f", "notanumber"])])
                .await;
            match &r[0] {
                Some(Frame::Integer(_)) => self.ready = true,
                Some(f) => match error_text(f) {
                    Some(e) if e.starts_with("TIMEOUT") => self.cycle(&key, Exec::Unknown(e)),
                    _ => {}
                },
                None => self.cycle(&key, Exec::Unknown("connection lost".into())),
            }
            return done;
        }
        let (r, done) = self.pipeline(&[argv(&["WATCH", &key])]).await;
        done?;
        if !matches!(&r[0], Some(Frame::Simple(s)) if s == b"OK") {
            return Ok(());
        }
        // Fails (not an integer): must change nothing, so must not abort the EXEC.
        let (_, done) = self.pipeline(&[argv(&["HINCRBY", &key, "f", "1"])]).await;
        done?;
        let n = self.rng.gen_range(0..1_000_000u32).to_string();
        let cmds = [
            argv(&["MULTI"]),
            argv(&["HSET", &key, "g", &n]),
            argv(&["EXEC"]),
        ];
        let (r, done) = self.pipeline(&cmds).await;
        let exec = match (&r[0], &r[2]) {
            (Some(Frame::Simple(ok)), _) if ok != b"OK" => return done,
            (_, None) if r[0].is_none() => Exec::Unknown("connection lost".into()),
            (_, None) => Exec::Unknown("connection lost before EXEC's reply".into()),
            (_, Some(Frame::Array(_))) => Exec::Committed,
            (_, Some(Frame::Null)) => Exec::Aborted,
            (_, Some(f)) => match error_text(f) {
                Some(e) if e.starts_with("TIMEOUT") => Exec::Unknown(e),
                Some(e) => Exec::Failed(e),
                None => Exec::Failed(format!("{f:?}")),
            },
        };
        self.cycle(&key, exec);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: &'static str, before: Option<i64>, replies: &[Option<i64>]) -> Pipeline {
        Pipeline {
            client: 1,
            kind,
            before,
            replies: replies.to_vec(),
            at_ns: 5_000_000,
        }
    }

    #[test]
    fn pipeline_order_passes_good_histories() {
        let v = check_pipelines(&[
            p("incr", None, &[Some(1), Some(2), Some(3)]),
            p("incr", Some(3), &[Some(7), Some(8)]),
            p("incr", Some(8), &[None, None]),
            p("lock", Some(40), &[Some(41), Some(45), None, Some(50)]),
        ]);
        assert_eq!(v.valid, Some(true), "{:?}", v.examples);
    }

    #[test]
    fn pipeline_order_fails_bad_histories() {
        // Not consecutive.
        let v = check_pipelines(&[p("incr", None, &[Some(1), Some(3)])]);
        assert_eq!(v.valid, Some(false));
        // Out of order: a split pipeline's tail applied first.
        let v = check_pipelines(&[p("lock", None, &[Some(50), Some(51), Some(44), Some(45)])]);
        assert_eq!(v.valid, Some(false));
        assert!(v.examples[0].contains("out of order"), "{:?}", v.examples);
        // Not above what the client had before.
        let v = check_pipelines(&[p("incr", Some(9), &[Some(9), Some(10)])]);
        assert_eq!(v.valid, Some(false));
        let v = check_pipelines(&[p("lock", Some(60), &[Some(55), Some(61)])]);
        assert_eq!(v.valid, Some(false));
    }

    fn w(key: &str, exec: Exec) -> WatchCycle {
        WatchCycle {
            client: 2,
            key: key.into(),
            exec,
            at_ns: 0,
        }
    }

    #[test]
    fn watch_allows_aborts_only_after_an_unknown_outcome() {
        let good = [
            w("h:2:0", Exec::Committed),
            w("h:2:0", Exec::Failed("TRYAGAIN".into())),
            w("h:2:0", Exec::Unknown("TIMEOUT".into())),
            w("h:2:0", Exec::Aborted),
            w("h:2:1", Exec::Committed),
        ];
        assert_eq!(check_watch(&good).valid, Some(true));
        let bad = [w("h:2:0", Exec::Committed), w("h:2:0", Exec::Aborted)];
        let v = check_watch(&bad);
        assert_eq!(v.valid, Some(false));
        assert_eq!(v.anomalies, 1);
        // An unknown outcome on another key excuses nothing.
        let bad = [
            w("h:2:0", Exec::Unknown("x".into())),
            w("h:2:1", Exec::Aborted),
        ];
        assert_eq!(check_watch(&bad).valid, Some(false));
    }
}
