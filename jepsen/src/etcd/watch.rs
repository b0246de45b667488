//! The `watch` workload, checked by `checker/watch.rs`.
//!
//! * **Writers** (the first ⌊clients / 2⌋ clients, at least one) put unique increasing values
//!   (`<process>.<n>`) to `w/0` … `w/2`, and one put in six to `x/0` … `x/2`, outside the
//!   watched prefix (no watcher may see those). A put's `ok` records the revision etcd
//!   acknowledged. Writer 0 also compacts every 2 s, to 100 revisions below the newest
//!   revision acknowledged to it (about 3 s of writes), so that a watcher resuming from a
//!   few seconds behind (a silent, partitioned node) meets the compacted error. After an `info` a writer retires its process id and moves to the next
//!   node, like the kv clients.
//! * **Watchers** (the others) each keep one Watch on the prefix `w/` open, on one node. When
//!   the stream breaks, ends, is cancelled or stays silent for 4 s (a partitioned or paused
//!   node; writers put every few ms), the watcher reconnects to the next node and resumes
//!   with `start_revision` = last revision seen + 1, as etcd's clients do, or at the compact
//!   revision after a `compacted` cancel (what an etcd client must do after `ErrCompacted`).
//!   The first watch starts at revision 1. After the run's deadline (writers stop), a watcher
//!   reads the newest revision under the prefix (`watch-target`) and keeps watching until it
//!   has seen it, at most 7.5 s past the deadline.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use super::pb::kv_client::KvClient;
use super::pb::watch_client::WatchClient;
use super::pb::{self, range_request, watch_request};
use super::{channel, endpoint, mvccpb, outcome, prefix_end, req, revision, status_res, text};
use crate::client::{ClientError, ClientSpec, Recorder, Res};
use crate::history::{Event, Kind, Process};

/// The watched prefix, and the writers' keys outside it.
pub const PREFIX: &str = "w/";
const OTHER: &str = "x/";
/// Writer 0 compacts this far below its newest acknowledged revision, this often.
const COMPACT_KEEP: i64 = 100;
const COMPACT_EVERY_NS: u64 = 2_000_000_000;
/// A watch silent for this long is abandoned for another node.
const IDLE_NS: u64 = 4_000_000_000;
/// After the deadline: when the watcher reads the newest revision, and when it gives up.
const TARGET_AFTER_NS: u64 = 2_000_000_000;
const END_AFTER_NS: u64 = 7_500_000_000;

/// How many of `clients` write (the rest watch).
pub fn writers(clients: u64) -> u64 {
    (clients / 2).max(1)
}

/// Run this client's part until the deadline (watchers: a little past it).
pub(crate) async fn run(
    spec: &ClientSpec,
    rec: &mut Recorder,
    rng: &mut StdRng,
) -> Result<(), ClientError> {
    if spec.index < writers(spec.stride) {
        writer(spec, rec, rng).await
    } else {
        watcher(spec, rec, rng).await
    }
}

async fn writer(
    spec: &ClientSpec,
    rec: &mut Recorder,
    rng: &mut StdRng,
) -> Result<(), ClientError> {
    let t = Duration::from_millis(spec.op_timeout_ms);
    let mut incarnation = 0u64;
    let mut ch: Option<Channel> = None;
    let mut seq = 0u64;
    let mut newest = 0i64;
    let mut last_compact = 0u64;
    for _ in 0..1_000_000u32 {
        if rec.clock.now() >= spec.deadline {
            break;
        }
        if rec.retired {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
            incarnation += 1;
            rec.process = spec.index + incarnation * spec.stride;
            rec.retired = false;
            ch = None;
        }
        let c = match &ch {
            Some(c) => c.clone(),
            None => {
                let c = channel(&endpoint(spec, (spec.index + incarnation) as usize)?)?;
                ch = Some(c.clone());
                c
            }
        };
        let mut kv = KvClient::new(c);
        let now = rec.clock.now();
        if spec.index == 0
            && now.saturating_sub(last_compact) >= COMPACT_EVERY_NS
            && newest > COMPACT_KEEP
        {
            last_compact = now;
            let to = newest - COMPACT_KEEP;
            let inv = rec.ev("compact").value(json!({ "revision": to }));
            rec.invoke(inv.clone())?;
            let r = tokio::time::timeout(
                t,
                kv.compact(req(
                    pb::CompactionRequest {
                        revision: to,
                        physical: false,
                    },
                    t,
                )),
            )
            .await;
            let res = match outcome(r) {
                Ok(resp) => Res::Ok(
                    Some(json!({ "revision": revision(resp.header.as_ref()) })),
                    None,
                ),
                Err(res) => res,
            };
            rec.complete(&inv, &res)?;
        } else {
            seq += 1;
            let n = rng.gen_range(0..3);
            let key = if rng.gen_range(0..6) == 0 {
                format!("{OTHER}{n}")
            } else {
                format!("{PREFIX}{n}")
            };
            let value = format!("{}.{seq}", rec.process);
            let inv = rec.ev("put").key(&key).value(json!(value));
            rec.invoke(inv.clone())?;
            let r = tokio::time::timeout(
                t,
                kv.put(req(
                    pb::PutRequest {
                        key: key.into_bytes(),
                        value: value.into_bytes(),
                        ..Default::default()
                    },
                    t,
                )),
            )
            .await;
            let res = match outcome(r) {
                Ok(resp) => {
                    let r = revision(resp.header.as_ref());
                    newest = newest.max(r);
                    Res::Ok(Some(json!({ "revision": r })), None)
                }
                Err(res) => res,
            };
            rec.complete(&inv, &res)?;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..30))).await;
    }
    Ok(())
}

/// A record of the watch stream: no invoke (see `checker/watch.rs`).
fn note(rec: &Recorder, kind: Kind, f: &str) -> Event {
    Event::new(Process::Client(rec.process), kind, f, rec.clock.now()).key(PREFIX)
}

/// A Watch on the keys under `prefix` from revision `start` (0: from now).
pub(crate) fn create(prefix: &str, start: i64) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix.as_bytes()),
                start_revision: start,
                ..Default::default()
            },
        )),
    }
}

/// What the stream loop tells the reconnect loop.
enum Next {
    Reconnect,
    Done,
}

/// A watcher's state across sessions.
struct Watcher<'a> {
    spec: &'a ClientSpec,
    /// Newest revision delivered.
    last: i64,
    /// Where to resume after a compacted cancel.
    compacted: Option<i64>,
    /// The newest revision under the prefix after the run (`None`: not read yet).
    target: Option<i64>,
    target_tries: u32,
}

impl Watcher<'_> {
    fn done(&self, now: u64) -> bool {
        now >= self.spec.deadline + END_AFTER_NS || self.target.is_some_and(|t| self.last >= t)
    }

    /// Record one response; `Some(next)` when the watch is over.
    fn response(
        &mut self,
        rec: &mut Recorder,
        resp: pb::WatchResponse,
    ) -> Result<Option<Next>, ClientError> {
        if !resp.events.is_empty() {
            let evs: Vec<serde_json::Value> = resp
                .events
                .iter()
                .map(|e| {
                    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
                        "DELETE"
                    } else {
                        "PUT"
                    };
                    match &e.kv {
                        Some(kv) => json!([kv.mod_revision, text(&kv.key), text(&kv.value), kind]),
                        None => json!([0, "", "", kind]),
                    }
                })
                .collect();
            for e in &resp.events {
                if let Some(kv) = &e.kv {
                    self.last = self.last.max(kv.mod_revision);
                }
            }
            rec.w
                .write(&note(rec, Kind::Ok, "watch-events").value(json!(evs)))?;
        }
        if resp.canceled {
            let mut e = note(rec, Kind::Fail, "watch-canceled")
                .value(json!({ "compact_revision": resp.compact_revision }));
            e.error = Some(resp.cancel_reason.clone());
            rec.w.write(&e)?;
            if resp.compact_revision > 0 {
                self.compacted = Some(resp.compact_revision);
            }
            return Ok(Some(Next::Reconnect));
        }
        Ok(None)
    }

    /// After the deadline: read the newest revision under the prefix (bounded tries).
    async fn read_target(&mut self, rec: &mut Recorder, ch: &Channel) -> Result<(), ClientError> {
        let now = rec.clock.now();
        if self.target.is_some()
            || now < self.spec.deadline + TARGET_AFTER_NS
            || self.target_tries >= 3
        {
            return Ok(());
        }
        self.target_tries += 1;
        let t = Duration::from_millis(self.spec.op_timeout_ms.min(2_000));
        let r = tokio::time::timeout(
            t,
            KvClient::new(ch.clone()).range(req(
                pb::RangeRequest {
                    key: PREFIX.as_bytes().to_vec(),
                    range_end: prefix_end(PREFIX.as_bytes()),
                    limit: 1,
                    sort_order: range_request::SortOrder::Descend as i32,
                    sort_target: range_request::SortTarget::Mod as i32,
                    ..Default::default()
                },
                t,
            )),
        )
        .await;
        match outcome(r) {
            Ok(resp) => {
                let t = resp.kvs.first().map_or(0, |kv| kv.mod_revision);
                self.target = Some(t);
                rec.w
                    .write(&note(rec, Kind::Ok, "watch-target").value(json!({ "revision": t })))?;
            }
            Err(Res::Fail(e) | Res::Info(e)) => {
                eprintln!("watcher {}: reading the target: {e}", rec.process)
            }
            Err(Res::Ok(..)) => {}
        }
        Ok(())
    }

    /// One session on `addr`: open, wait for `created`, follow the stream.
    async fn session(&mut self, rec: &mut Recorder, addr: &str) -> Result<Next, ClientError> {
        let t = Duration::from_millis(self.spec.op_timeout_ms);
        let ch = channel(addr)?;
        let start = self.compacted.take().unwrap_or(self.last + 1);
        let inv = rec
            .ev("watch")
            .key(PREFIX)
            .value(json!({ "start_revision": start, "node": addr }));
        rec.invoke(inv.clone())?;
        let (tx, rx) = mpsc::channel(4);
        // Cannot fail: the receiver is still here.
        let _ = tx.send(create(PREFIX, start)).await;
        let opened = tokio::time::timeout(
            t,
            WatchClient::new(ch.clone()).watch(ReceiverStream::new(rx)),
        )
        .await;
        let mut stream = match outcome(opened) {
            Ok(s) => s,
            Err(res) => {
                rec.complete(&inv, &res)?;
                return Ok(Next::Reconnect);
            }
        };
        // The first answer must be `created`.
        let first = match tokio::time::timeout(t, stream.next()).await {
            Err(_) => Err(Res::Info("no created response in time".into())),
            Ok(None) => Err(Res::Info("stream ended before created".into())),
            Ok(Some(Err(s))) => Err(status_res(&s)),
            Ok(Some(Ok(resp))) => Ok(resp),
        };
        let first = match first {
            Ok(f) => f,
            Err(res) => {
                rec.complete(&inv, &res)?;
                return Ok(Next::Reconnect);
            }
        };
        let created = json!({
            "watch_id": first.watch_id,
            "revision": revision(first.header.as_ref()),
            "created": first.created,
        });
        rec.complete(&inv, &Res::Ok(Some(created), None))?;
        if let Some(n) = self.response(rec, first)? {
            return Ok(n);
        }
        let mut heard = rec.clock.now();
        loop {
            let now = rec.clock.now();
            if self.done(now) {
                return Ok(Next::Done);
            }
            self.read_target(rec, &ch).await?;
            match tokio::time::timeout(Duration::from_millis(250), stream.next()).await {
                Err(_) if rec.clock.now().saturating_sub(heard) >= IDLE_NS => {
                    return self.ended(rec, "silent for 4 s");
                }
                Err(_) => {}
                Ok(None) => return self.ended(rec, "stream ended"),
                Ok(Some(Err(s))) => {
                    return self.ended(rec, &format!("{:?}: {}", s.code(), s.message()))
                }
                Ok(Some(Ok(resp))) => {
                    heard = rec.clock.now();
                    if let Some(n) = self.response(rec, resp)? {
                        return Ok(n);
                    }
                }
            }
        }
    }

    fn ended(&mut self, rec: &mut Recorder, why: &str) -> Result<Next, ClientError> {
        let mut e = note(rec, Kind::Info, "watch-end").value(json!({ "last_revision": self.last }));
        e.error = Some(why.to_owned());
        rec.w.write(&e)?;
        Ok(Next::Reconnect)
    }
}

async fn watcher(
    spec: &ClientSpec,
    rec: &mut Recorder,
    rng: &mut StdRng,
) -> Result<(), ClientError> {
    let mut w = Watcher {
        spec,
        last: 0,
        compacted: None,
        target: None,
        target_tries: 0,
    };
    let mut node = spec.index as usize;
    for _ in 0..100_000u32 {
        if w.done(rec.clock.now()) {
            break;
        }
        let addr = endpoint(spec, node)?;
        match w.session(rec, &addr).await? {
            Next::Done => break,
            Next::Reconnect => {
                node += 1;
                // The watcher is one subscriber for the whole run: same process id.
                rec.retired = false;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(50..150))).await;
            }
        }
    }
    Ok(())
}
