//! Two more operations of the RESP clients ([`crate::resp`]):
//!
//! * **`eval`**: register operations over RESP on the workload's registers `k<i>` — `GET`,
//!   `SET`, a compare-and-set through `EVAL` (the workload's script), and a script that
//!   writes and then fails (`redis.error_reply('boom')` or a raised `error('boom')`): docs/resp.md
//!   promises that a script's writes before its error stay applied, as in Redis, so a reply
//!   with that error is a `put` that took effect. Recorded in the run's history as processes
//!   of their own (`get`/`put`/`cas`, values `r<process>-<seq>`), so `linearizability` judges
//!   them together with the direct clients' operations. `-TIMEOUT` or a lost connection is an
//!   unknown outcome (`info`; the process retires); any other error, `fail`.
//! * **`throttle`**: a pipeline of 1–4 `CL.THROTTLE t:<client> 2 4 1 [q]` (burst 2, 4 per
//!   second, quantity 1 or 2), each an admission, a denial or an unknown outcome, recorded
//!   for the checker [`crate::throttle`].

use std::collections::BTreeMap;
use std::rc::Rc;

use fenced_jepsen::checker::limiter::Policy;
use fenced_jepsen::history::Kind;
use fenced_resp::frame::Frame;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use crate::history::Pending;
use crate::resp::Conn;
use crate::throttle::{Outcome, Throttle};
use crate::workload::{Shared, CAS};
use crate::world::Gone;

/// A script that writes `ARGV[1]` to `KEYS[1]`, then fails with an error reply.
const SET_THEN_ERROR_REPLY: &str =
    "redis.call('SET', KEYS[1], ARGV[1]) return redis.error_reply('boom')";
/// A script that writes `ARGV[1]` to `KEYS[1]`, then raises an error.
const SET_THEN_RAISE: &str = "redis.call('SET', KEYS[1], ARGV[1]) error('boom')";

/// The per-client policy: `CL.THROTTLE key 2 4 1`.
pub const POLICY: Policy = Policy {
    max_burst: 2,
    count: 4,
    period_ms: 1_000,
};

/// What one RESP client keeps for these operations.
pub struct Ops {
    shared: Rc<Shared>,
    client: usize,
    /// Its process in the history (a fresh one after an unknown outcome).
    process: u64,
    seq: u64,
    /// The last value it read from each register (what its compare-and-sets expect).
    seen: BTreeMap<String, String>,
}

fn argv(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn error_text(f: &Frame) -> Option<String> {
    match f {
        Frame::Error(e) => Some(String::from_utf8_lossy(e).into_owned()),
        _ => None,
    }
}

impl Ops {
    pub fn new(shared: Rc<Shared>, client: usize) -> Ops {
        let process = fresh(&shared);
        Ops {
            shared,
            client,
            process,
            seq: 0,
            seen: BTreeMap::new(),
        }
    }

    /// One register operation over RESP.
    pub async fn eval(&mut self, conn: &mut Conn, rng: &mut StdRng) -> Result<(), Gone> {
        let key = format!("k{}", rng.gen_range(0..self.shared.spec.keys.max(1)));
        self.seq += 1;
        let value = format!("r{}-{}", self.process, self.seq);
        match rng.gen_range(0..6) {
            0 | 1 => self.get(conn, &key).await,
            2 => {
                let cmd = argv(&["SET", &key, &value]);
                self.write(conn, "put", &key, json!(value), cmd, None).await
            }
            3 => {
                let script = if rng.gen_bool(0.5) {
                    SET_THEN_ERROR_REPLY
                } else {
                    SET_THEN_RAISE
                };
                let cmd = argv(&["EVAL", script, "1", &key, &value]);
                self.write(conn, "put", &key, json!(value), cmd, Some("boom"))
                    .await
            }
            _ => {
                let Some(old) = self.seen.get(&key).cloned() else {
                    return self.get(conn, &key).await;
                };
                let cmd = argv(&["EVAL", CAS, "1", &key, &old, &value]);
                self.write(conn, "cas", &key, json!([old, value]), cmd, None)
                    .await
            }
        }
    }

    /// Send one command, wait for its reply.
    async fn call(conn: &mut Conn, cmd: Vec<Vec<u8>>) -> Result<Frame, Gone> {
        conn.send(&[cmd]).await?;
        conn.recv().await
    }

    async fn get(&mut self, conn: &mut Conn, key: &str) -> Result<(), Gone> {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, "get", key, |e| e);
        let r = Self::call(conn, argv(&["GET", key])).await;
        match &r {
            Ok(Frame::Bulk(v)) => {
                let v = String::from_utf8_lossy(v).into_owned();
                self.seen.insert(key.to_owned(), v.clone());
                h.complete(inv, Kind::Ok, |e| e.value(json!(v)))
            }
            Ok(Frame::Null) => h.complete(inv, Kind::Ok, |e| e.value(json!(null))),
            // A read that did not answer changed nothing.
            Ok(f) => h.complete(inv, Kind::Fail, |e| e.error(format!("{f:?}"))),
            Err(g) => h.complete(inv, Kind::Fail, |e| e.error(format!("{g:?}"))),
        }
        r.map(|_| ())
    }

    /// A write: `ok` on `+OK` or `1` (or an error containing `applied_on_error`, from a script
    /// whose writes before its error stay), `fail` on `0` or another error, `info` on
    /// `-TIMEOUT` or a lost connection.
    async fn write(
        &mut self,
        conn: &mut Conn,
        f: &str,
        key: &str,
        v: serde_json::Value,
        cmd: Vec<Vec<u8>>,
        applied_on_error: Option<&str>,
    ) -> Result<(), Gone> {
        let h = self.shared.history.clone();
        let inv = h.invoke(self.process, f, key, |e| e.value(v));
        let r = Self::call(conn, cmd).await;
        if let (Some(_), Ok(reply)) = (applied_on_error, &r) {
            let shown = error_text(reply).unwrap_or_else(|| format!("{reply:?}"));
            let line = format!(
                "p{}: the script that writes and fails: {shown}",
                self.process
            );
            self.shared
                .cluster
                .trace()
                .line(&format!("r{}", self.client), line);
        }
        let kind = match &r {
            Ok(Frame::Simple(_) | Frame::Integer(1)) => Ok(()),
            Ok(f) => match error_text(f) {
                Some(e) if applied_on_error.is_some_and(|a| e.contains(a)) => Ok(()),
                Some(e) if e.starts_with("TIMEOUT") => Err((Kind::Info, e)),
                Some(e) => Err((Kind::Fail, e)),
                None => Err((Kind::Fail, format!("{f:?}"))),
            },
            Err(g) => Err((Kind::Info, format!("{g:?}"))),
        };
        self.complete(inv, kind);
        r.map(|_| ())
    }

    fn complete(&mut self, inv: Pending, kind: Result<(), (Kind, String)>) {
        let h = self.shared.history.clone();
        match kind {
            Ok(()) => h.complete(inv, Kind::Ok, |e| e),
            Err((k, m)) => {
                h.complete(inv, k, |e| e.error(m));
                if k == Kind::Info {
                    // The write may still apply: carry on as a fresh process.
                    self.process = fresh(&self.shared);
                    self.seq = 0;
                }
            }
        }
    }

    /// A pipeline of 1–4 `CL.THROTTLE`s on this client's key, one record each.
    pub async fn throttle(
        &mut self,
        conn: &mut Conn,
        rng: &mut StdRng,
    ) -> (Vec<Throttle>, Result<(), Gone>) {
        let key = format!("t:{}", self.client);
        let k = rng.gen_range(1..=4);
        let qs: Vec<u64> = (0..k)
            .map(|_| if rng.gen_bool(0.2) { 2 } else { 1 })
            .collect();
        let p = POLICY;
        let cmds: Vec<Vec<Vec<u8>>> = qs
            .iter()
            .map(|q| {
                argv(&[
                    "CL.THROTTLE",
                    &key,
                    &p.max_burst.to_string(),
                    &p.count.to_string(),
                    &(p.period_ms / 1_000).to_string(),
                    &q.to_string(),
                ])
            })
            .collect();
        let trace = self.shared.cluster.trace().clone();
        let invoke_ns = trace.now_ns();
        let mut sent = conn.send(&cmds).await;
        let mut out = Vec::new();
        for q in qs {
            let outcome = match &sent {
                Err(g) => Outcome::Unknown(format!("{g:?}")),
                Ok(()) => match conn.recv().await {
                    Err(g) => {
                        let o = Outcome::Unknown(format!("{g:?}"));
                        sent = Err(g);
                        o
                    }
                    Ok(Frame::Array(a)) => match a.first() {
                        Some(Frame::Integer(0)) => Outcome::Allowed,
                        Some(Frame::Integer(1)) => Outcome::Denied,
                        _ => Outcome::Failed(format!("{a:?}")),
                    },
                    Ok(f) => match error_text(&f) {
                        Some(e) if e.starts_with("TIMEOUT") => Outcome::Unknown(e),
                        Some(e) => Outcome::Failed(e),
                        None => Outcome::Failed(format!("{f:?}")),
                    },
                },
            };
            out.push(Throttle {
                client: self.client,
                key: key.clone(),
                policy: p,
                quantity: q,
                invoke_ns,
                end_ns: trace.now_ns(),
                outcome,
            });
        }
        let shown: Vec<String> = out
            .iter()
            .map(|t| format!("{}×{:?}", t.quantity, t.outcome))
            .collect();
        trace.line(
            &format!("r{}", self.client),
            format!(
                "throttle pipeline on n{} {key}: {}",
                conn.node(),
                shown.join(", ")
            ),
        );
        (out, sent)
    }
}

fn fresh(shared: &Shared) -> u64 {
    let p = shared.next_process.get();
    shared.next_process.set(p + 1);
    p
}
