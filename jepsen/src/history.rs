//! History files (a contract that outside checks read; the format is this module's): one JSON object per line, in the order events
//! happened. Clients are separate processes; each appends to its own file and the control
//! process merges the files by `time` (CLOCK_MONOTONIC is one clock for every process on the
//! machine, whatever network namespace it runs in).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {source}")]
    Parse {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
}

/// Who performed an event: a client process number or the nemesis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Process {
    Client(u64),
    Named(String),
}

impl Process {
    pub fn nemesis() -> Process {
        Process::Named("nemesis".into())
    }

    pub fn is_nemesis(&self) -> bool {
        matches!(self, Process::Named(n) if n == "nemesis")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// A field that is `Some(Value::Null)` when the line says `"value":null` and `None` when the
/// line has no `value` at all (a `get` that found nothing vs. an op without a value).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub f: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Monotonic nanoseconds since the run started.
    pub time: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `throttle` (limiter workload), on the `ok`: whether the limiter admitted the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted: Option<bool>,
    /// `acquire` (rwlock and semaphore workloads), on the invoke: the grant asked for —
    /// `read`, `write` or `permit`. Absent: the exclusive lock (every history before them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `acquire` of a `permit`, on the invoke: the semaphore's number of permits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
}

impl Event {
    pub fn new(process: Process, kind: Kind, f: &str, time: u64) -> Event {
        Event {
            process,
            kind,
            f: f.to_owned(),
            key: None,
            value: None,
            token: None,
            ttl_ms: None,
            time,
            error: None,
            admitted: None,
            mode: None,
            permits: None,
        }
    }

    pub fn key(mut self, k: &str) -> Self {
        self.key = Some(k.to_owned());
        self
    }

    pub fn value(mut self, v: Value) -> Self {
        self.value = Some(v);
        self
    }

    pub fn token(mut self, t: u64) -> Self {
        self.token = Some(t);
        self
    }

    pub fn ttl_ms(mut self, t: u64) -> Self {
        self.ttl_ms = Some(t);
        self
    }

    /// The grant an `acquire` asks for (`read`, `write`, `permit` with `permits`).
    pub fn mode(mut self, mode: &str, permits: Option<u32>) -> Self {
        self.mode = Some(mode.to_owned());
        self.permits = permits;
        self
    }

    pub fn error(mut self, e: impl Into<String>) -> Self {
        self.error = Some(e.into());
        self
    }
}

/// CLOCK_MONOTONIC in nanoseconds: shared by every process on this machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Time since a run's start (`start` = [`monotonic_ns`] when the run began).
#[derive(Clone, Copy, Debug)]
pub struct RunClock {
    pub start: u64,
}

impl RunClock {
    pub fn now(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start)
    }
}

/// Appends events to a file, flushing each line (a SIGKILLed writer loses nothing written).
pub struct HistoryWriter {
    out: BufWriter<File>,
    path: String,
}

impl HistoryWriter {
    pub fn create(path: &Path) -> Result<Self, HistoryError> {
        let p = path.display().to_string();
        let f = File::create(path).map_err(|source| HistoryError::Io {
            path: p.clone(),
            source,
        })?;
        Ok(HistoryWriter {
            out: BufWriter::new(f),
            path: p,
        })
    }

    pub fn write(&mut self, e: &Event) -> Result<(), HistoryError> {
        let line = serde_json::to_string(e).map_err(|source| HistoryError::Parse {
            path: self.path.clone(),
            line: 0,
            source,
        })?;
        let io = |source| HistoryError::Io {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(line.as_bytes()).map_err(io)?;
        self.out.write_all(b"\n").map_err(io)?;
        self.out.flush().map_err(io)
    }
}

/// Read a history file. A torn last line (a writer killed mid-line) is skipped.
pub fn read(path: &Path) -> Result<Vec<Event>, HistoryError> {
    let p = path.display().to_string();
    let f = File::open(path).map_err(|source| HistoryError::Io {
        path: p.clone(),
        source,
    })?;
    let lines: Vec<String> = BufReader::new(f)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| HistoryError::Io {
            path: p.clone(),
            source,
        })?;
    let n = lines.len();
    let mut out = Vec::with_capacity(n);
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Event>(line) {
            Ok(e) => out.push(e),
            Err(_) if i + 1 == n => break,
            Err(source) => {
                return Err(HistoryError::Parse {
                    path: p,
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok(out)
}

/// Merge per-process histories into one, ordered by time (stable: equal times keep file order).
pub fn merge(mut parts: Vec<Vec<Event>>) -> Vec<Event> {
    let mut all: Vec<Event> = parts.drain(..).flatten().collect();
    all.sort_by_key(|e| e.time);
    all
}

pub fn write_all(path: &Path, events: &[Event]) -> Result<(), HistoryError> {
    let mut w = HistoryWriter::create(path)?;
    for e in events {
        w.write(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_doc_example_round_trips() {
        let text = r#"{"process":0,"type":"invoke","f":"acquire","key":"L","ttl_ms":5000,"time":1000}
{"process":0,"type":"ok","f":"acquire","key":"L","token":41,"time":2500000}
{"process":1,"type":"invoke","f":"put","key":"x","value":"3","time":2600000}
{"process":1,"type":"info","f":"put","key":"x","time":1002600000,"error":"timeout"}
{"process":2,"type":"ok","f":"get","key":"x","value":null,"time":1002600001}
{"process":"nemesis","type":"info","f":"start-partition","value":"isolate n1","time":5}
"#;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("h.jsonl");
        std::fs::write(&p, text).expect("write");
        let h = read(&p).expect("read");
        assert_eq!(h.len(), 6);
        assert_eq!(h[1].token, Some(41));
        assert_eq!(h[4].value, Some(Value::Null));
        assert_eq!(h[0].value, None);
        assert!(h[5].process.is_nemesis());
        let p2 = dir.path().join("h2.jsonl");
        write_all(&p2, &h).expect("write");
        assert_eq!(read(&p2).expect("read"), h);
        // The null of a get survives a round trip.
        assert!(std::fs::read_to_string(&p2)
            .expect("read")
            .contains(r#""value":null"#));
    }

    #[test]
    fn modes_round_trip_and_old_lines_have_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("h.jsonl");
        let e = Event::new(Process::Client(3), Kind::Invoke, "acquire", 7)
            .key("L")
            .ttl_ms(3000)
            .mode("permit", Some(3));
        write_all(&p, std::slice::from_ref(&e)).expect("write");
        let text = std::fs::read_to_string(&p).expect("read");
        assert!(text.contains(r#""mode":"permit","permits":3"#), "{text}");
        assert_eq!(read(&p).expect("read"), vec![e]);
        std::fs::write(
            &p,
            r#"{"process":0,"type":"invoke","f":"acquire","key":"L","ttl_ms":5000,"time":1}"#,
        )
        .expect("write");
        let h = read(&p).expect("read");
        assert_eq!((h[0].mode.as_deref(), h[0].permits), (None, None));
    }

    #[test]
    fn torn_last_line_is_skipped_but_a_torn_middle_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("h.jsonl");
        std::fs::write(
            &p,
            "{\"process\":0,\"type\":\"invoke\",\"f\":\"get\",\"time\":1}\n{\"process\":0,\"ty",
        )
        .expect("write");
        assert_eq!(read(&p).expect("read").len(), 1);
        std::fs::write(
            &p,
            "{\"pro\n{\"process\":0,\"type\":\"invoke\",\"f\":\"get\",\"time\":1}\n",
        )
        .expect("write");
        assert!(read(&p).is_err());
    }
}
