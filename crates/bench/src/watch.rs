//! Watch fan-out over etcd's v3 Watch API (issue 25's benchmark): `watchers` watches on one
//! prefix, spread evenly over `streams` bidirectional Watch streams (each on its own
//! connection; stream s on endpoint s mod N), and writers (one by default, each on its own
//! connection) putting into the prefix at a steady `rate` of all together (puts/s; 0 = as fast
//! as they go, one put at a time each), cycling over 1,000 keys.
//!
//! Every value carries the put's sequence number and its send time (ns since the run's
//! epoch); the writer records when each put was acknowledged. For every event received:
//! * **lag** = received − acknowledged, 0 when the event arrives before the writer saw the
//!   acknowledgement (the headline number: what a watcher waits once the write is done);
//! * **lag from send** = received − sent (includes the put's own commit).
//!
//! After the writer stops, the watchers get up to `grace` to receive what is still in flight;
//! events delivered per second = events received / (last event received − writer start).
//! `missing` = puts × watchers − events received (a slow or cancelled watcher).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_backends::etcd::{pb, prefix_end};
use hdrhistogram::Histogram;
use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::kv::{hist, micros, req, status_text};
use crate::load::Lat;

/// Parameters of one fan-out run.
#[derive(Clone, Debug)]
pub struct WatchWorkload {
    pub watchers: usize,
    pub streams: usize,
    /// Writer puts per second; 0: unpaced.
    pub rate: f64,
    pub duration: Duration,
    pub grace: Duration,
    pub value_size: usize,
    /// Watched prefix (unique per run).
    pub prefix: String,
}

/// Raw outcome (mergeable over rounds).
pub struct WatchMeasured {
    pub puts: u64,
    pub events: u64,
    pub expected: u64,
    /// How long the writer wrote, summed over rounds.
    pub writing: Duration,
    /// Writer start → last event received, summed over rounds.
    pub delivery: Duration,
    pub lag: Histogram<u64>,
    pub lag_from_send: Histogram<u64>,
    pub put_latency: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Default for WatchMeasured {
    fn default() -> Self {
        WatchMeasured {
            puts: 0,
            events: 0,
            expected: 0,
            writing: Duration::ZERO,
            delivery: Duration::ZERO,
            lag: hist(),
            lag_from_send: hist(),
            put_latency: hist(),
            errors: 0,
            first_error: None,
        }
    }
}

impl WatchMeasured {
    pub fn merge(&mut self, o: &WatchMeasured) {
        self.puts += o.puts;
        self.events += o.events;
        self.expected += o.expected;
        self.writing += o.writing;
        self.delivery += o.delivery;
        let _ = self.lag.add(&o.lag);
        let _ = self.lag_from_send.add(&o.lag_from_send);
        let _ = self.put_latency.add(&o.put_latency);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
    }

    pub fn summary(&self) -> WatchSummary {
        let secs = self.delivery.as_secs_f64();
        WatchSummary {
            puts: self.puts,
            puts_per_s: self.puts as f64 / self.writing.as_secs_f64().max(1e-9),
            events: self.events,
            events_per_s: if secs > 0.0 {
                self.events as f64 / secs
            } else {
                0.0
            },
            missing: self.expected.saturating_sub(self.events),
            seconds: secs,
            lag_us: Lat::of(&self.lag),
            lag_from_send_us: Lat::of(&self.lag_from_send),
            put_us: Lat::of(&self.put_latency),
            errors: self.errors,
            first_error: self.first_error.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct WatchSummary {
    pub puts: u64,
    pub puts_per_s: f64,
    pub events: u64,
    pub events_per_s: f64,
    pub missing: u64,
    pub seconds: f64,
    pub lag_us: Lat,
    pub lag_from_send_us: Lat,
    pub put_us: Lat,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// What the writer and the watchers share.
struct Shared {
    epoch: Instant,
    /// Acknowledgement time of put n (ns since epoch + 1; 0 = not yet).
    acks: Vec<AtomicU64>,
    events: AtomicU64,
    /// Latest receive time of any event (ns since epoch).
    last_event: AtomicU64,
    stop: AtomicBool,
    first_error: Mutex<Option<String>>,
    errors: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn error(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut f) = self.first_error.lock() {
            f.get_or_insert(e);
        }
    }
}

/// The value of put `seq`: seq and send time (little-endian u64s), padded to `size`.
fn encode(seq: u64, sent_ns: u64, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size.max(16));
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&sent_ns.to_le_bytes());
    v.resize(size.max(16), b'w');
    v
}

fn decode(v: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(v.get(0..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(v.get(8..16)?.try_into().ok()?);
    Some((seq, sent))
}

struct StreamOut {
    lag: Histogram<u64>,
    lag_from_send: Histogram<u64>,
}

/// One Watch stream with `n` watches on the prefix: report readiness on `ready` once all are
/// created, then record every event until told to stop.
async fn stream_task(
    ch: Channel,
    n: usize,
    prefix: Vec<u8>,
    shared: Arc<Shared>,
    ready: mpsc::Sender<Result<(), String>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> StreamOut {
    let mut out = StreamOut {
        lag: hist(),
        lag_from_send: hist(),
    };
    let (tx, rx) = mpsc::channel(n.max(1));
    let end = prefix_end(&prefix);
    for _ in 0..n {
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: prefix.clone(),
                    range_end: end.clone(),
                    ..Default::default()
                },
            )),
        };
        if tx.send(create).await.is_err() {
            let _ = ready.send(Err("watch request channel closed".into())).await;
            return out;
        }
    }
    let mut stream = match WatchClient::new(ch).watch(ReceiverStream::new(rx)).await {
        Ok(s) => s.into_inner(),
        Err(s) => {
            let _ = ready.send(Err(status_text(&s))).await;
            return out;
        }
    };
    let mut created = 0;
    let mut signalled = n == 0;
    if signalled {
        let _ = ready.send(Ok(())).await;
    }
    loop {
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = stop.changed() => break,
        };
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(s)) => {
                let e = status_text(&s);
                if signalled {
                    shared.error(e);
                } else {
                    let _ = ready.send(Err(e)).await;
                }
                break;
            }
            None => {
                if !signalled {
                    let _ = ready.send(Err("watch stream ended".into())).await;
                } else if !shared.stop.load(Ordering::Relaxed) {
                    shared.error("watch stream ended".into());
                }
                break;
            }
        };
        if msg.canceled {
            let e = format!("watch canceled: {}", msg.cancel_reason);
            if signalled {
                shared.error(e);
            } else {
                let _ = ready.send(Err(e)).await;
                break;
            }
        }
        if msg.created && !signalled {
            created += 1;
            if created == n {
                signalled = true;
                let _ = ready.send(Ok(())).await;
            }
        }
        if msg.events.is_empty() {
            continue;
        }
        let now = shared.now_ns();
        for ev in &msg.events {
            let Some((seq, sent)) = ev.kv.as_ref().and_then(|kv| decode(&kv.value)) else {
                continue;
            };
            let _ = out
                .lag_from_send
                .record((now.saturating_sub(sent) / 1000).clamp(1, 600_000_000));
            let ack = shared
                .acks
                .get(seq as usize)
                .map_or(0, |a| a.load(Ordering::Acquire));
            // ack is ns + 1; an event seen before the acknowledgement waited 0 after it.
            let lag = if ack == 0 {
                0
            } else {
                now.saturating_sub(ack - 1) / 1000
            };
            let _ = out.lag.record(lag.clamp(1, 600_000_000));
        }
        shared
            .events
            .fetch_add(msg.events.len() as u64, Ordering::Relaxed);
        shared.last_event.fetch_max(now, Ordering::Relaxed);
    }
    drop(tx);
    out
}

/// Run the fan-out: `stream_channels[s]` carries stream s, `writers[j]` writer j's puts.
pub async fn run_watch(
    stream_channels: Vec<Channel>,
    writers: Vec<Channel>,
    w: &WatchWorkload,
) -> WatchMeasured {
    let mut m = WatchMeasured::default();
    let streams = stream_channels.len().max(1);
    // Room for the acknowledgements of every put the writer can make (bounded).
    let cap = if w.rate > 0.0 && w.rate.is_finite() {
        (w.rate * w.duration.as_secs_f64() * 1.1) as usize + 16
    } else {
        2_000_000
    };
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        acks: (0..cap).map(|_| AtomicU64::new(0)).collect(),
        events: AtomicU64::new(0),
        last_event: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        first_error: Mutex::new(None),
        errors: AtomicU64::new(0),
    });
    let (ready_tx, mut ready_rx) = mpsc::channel(streams);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for (s, ch) in stream_channels.into_iter().enumerate() {
        // Watchers spread evenly: the first (watchers mod streams) streams get one more.
        let n = w.watchers / streams + usize::from(s < w.watchers % streams);
        tasks.push(tokio::spawn(stream_task(
            ch,
            n,
            w.prefix.clone().into_bytes(),
            shared.clone(),
            ready_tx.clone(),
            stop_rx.clone(),
        )));
    }
    drop(ready_tx);
    // Every stream reports once: all watches created, or why not.
    let mut ready = 0;
    let mut reported = 0;
    let setup = tokio::time::timeout(Duration::from_secs(60), async {
        while reported < tasks.len() {
            let Some(r) = ready_rx.recv().await else {
                break;
            };
            reported += 1;
            match r {
                Ok(()) => ready += 1,
                Err(e) => shared.error(format!("creating watches: {e}")),
            }
        }
    });
    let _ = setup.await;
    if ready < tasks.len() {
        shared.error(format!("{ready} of {} streams ready", tasks.len()));
    }

    if ready > 0 {
        let start_ns = shared.now_ns();
        let start = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let nw = writers.len().max(1);
        // Each writer paces its share: its put n is due at start + offset + n × every.
        let every = (w.rate > 0.0).then(|| Duration::from_secs_f64(nw as f64 / w.rate));
        let mut wtasks = Vec::new();
        for (j, ch) in writers.into_iter().enumerate() {
            let (shared, next, w) = (shared.clone(), next.clone(), w.clone());
            wtasks.push(tokio::spawn(async move {
                let kv = KvClient::new(ch);
                let mut lat = hist();
                let mut puts = 0u64;
                let mut n = 0u32;
                while start.elapsed() < w.duration {
                    if let Some(every) = every {
                        let offset = every.mul_f64(j as f64 / nw as f64);
                        tokio::time::sleep_until((start + offset + every * n).into()).await;
                        n += 1;
                    }
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq as usize >= cap {
                        break;
                    }
                    let sent = shared.now_ns();
                    let t0 = Instant::now();
                    let r = kv
                        .clone()
                        .put(req(pb::PutRequest {
                            key: format!("{}{}", w.prefix, seq % 1000).into_bytes(),
                            value: encode(seq, sent, w.value_size),
                            ..Default::default()
                        }))
                        .await;
                    match r {
                        Ok(_) => {
                            shared.acks[seq as usize].store(shared.now_ns() + 1, Ordering::Release);
                            let _ = lat.record(micros(t0.elapsed()));
                            puts += 1;
                        }
                        Err(s) => {
                            shared.error(format!("writer: {}", status_text(&s)));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (puts, lat)
            }));
        }
        let mut seq = 0;
        for t in wtasks {
            match t.await {
                Ok((puts, lat)) => {
                    seq += puts;
                    let _ = m.put_latency.add(&lat);
                }
                Err(e) => shared.error(format!("writer: {e}")),
            }
        }
        m.puts = seq;
        m.writing = start.elapsed();
        // Watchers of streams that failed count as missing (and their stream as an error).
        m.expected = seq * w.watchers as u64;
        let until = Instant::now() + w.grace;
        while shared.events.load(Ordering::Relaxed) < m.expected && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let last = shared.last_event.load(Ordering::Relaxed);
        m.delivery = Duration::from_nanos(last.saturating_sub(start_ns));
    }
    shared.stop.store(true, Ordering::Relaxed);
    let _ = stop_tx.send(true);
    for t in tasks {
        match t.await {
            Ok(o) => {
                let _ = m.lag.add(&o.lag);
                let _ = m.lag_from_send.add(&o.lag_from_send);
            }
            Err(e) => shared.error(e.to_string()),
        }
    }
    m.events = shared.events.load(Ordering::Relaxed);
    m.errors = shared.errors.load(Ordering::Relaxed);
    m.first_error = shared.first_error.lock().ok().and_then(|f| f.clone());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_sequence_and_send_time() {
        let v = encode(42, 123_456_789, 100);
        assert_eq!(v.len(), 100);
        assert_eq!(decode(&v), Some((42, 123_456_789)));
        assert_eq!(decode(b"short"), None);
    }
}
