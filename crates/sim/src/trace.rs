//! The run's readable trace: one line per thing that happened (a fault, a node's start or
//! crash, a leader change, a client's operation and its answer), stamped with simulated time.
//! Its hash is the run's fingerprint: the same seed must give the same hash in any process.

use std::cell::RefCell;
use std::rc::Rc;

use tokio::time::Instant;
use xxhash_rust::xxh3::Xxh3;

/// The trace of one run. Cheap to clone (one shared buffer: the simulator is one thread).
#[derive(Clone)]
pub struct Trace {
    inner: Rc<RefCell<Inner>>,
}

struct Inner {
    start: Instant,
    lines: Vec<String>,
    hash: Xxh3,
    keep: bool,
    echo: bool,
}

impl Trace {
    /// A trace starting now. `keep`: keep the lines (for printing); the hash is always kept.
    /// `echo`: print each line to stderr as it happens.
    pub fn new(keep: bool, echo: bool) -> Trace {
        Trace {
            inner: Rc::new(RefCell::new(Inner {
                start: Instant::now(),
                lines: Vec::new(),
                hash: Xxh3::new(),
                keep,
                echo,
            })),
        }
    }

    /// Simulated nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        self.inner.borrow().start.elapsed().as_nanos() as u64
    }

    /// Record one line: `who` did `what`.
    pub fn line(&self, who: &str, what: impl AsRef<str>) {
        let mut t = self.inner.borrow_mut();
        let ns = t.start.elapsed().as_nanos() as u64;
        let line = format!(
            "[{:>4}.{:06}s] {who:<8} {}",
            ns / 1_000_000_000,
            (ns % 1_000_000_000) / 1_000,
            what.as_ref()
        );
        t.hash.update(line.as_bytes());
        t.hash.update(b"\n");
        if t.echo {
            eprintln!("{line}");
        }
        if t.keep {
            t.lines.push(line);
        }
    }

    /// Fold something that is not a line (a history, a digest) into the fingerprint.
    pub fn fold(&self, bytes: &[u8]) {
        self.inner.borrow_mut().hash.update(bytes);
    }

    pub fn hash(&self) -> u64 {
        self.inner.borrow().hash.digest()
    }

    pub fn lines(&self) -> Vec<String> {
        self.inner.borrow().lines.clone()
    }
}
