//! What the connections of one node share about each other: the registry `CLIENT LIST`,
//! `CLIENT KILL` and `CLIENT UNBLOCK` work on, and the counters `INFO` shows.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The front end's counters (`INFO stats`, `INFO clients`): atomics bumped on the
/// connections' tasks, never a lock per command.
pub(crate) struct Stats {
    pub started: Instant,
    pub connections_received: AtomicU64,
    pub commands: AtomicU64,
    pub error_replies: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub net_in: AtomicU64,
    pub net_out: AtomicU64,
    pub blocked: AtomicU64,
    /// Commands per second: the second (since `started`) being counted, its count so far,
    /// and the count of the second before it.
    window_sec: AtomicU64,
    window_count: AtomicU64,
    last_rate: AtomicU64,
}

impl Stats {
    pub fn new() -> Self {
        Stats {
            started: Instant::now(),
            connections_received: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            error_replies: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            net_in: AtomicU64::new(0),
            net_out: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            window_sec: AtomicU64::new(0),
            window_count: AtomicU64::new(0),
            last_rate: AtomicU64::new(0),
        }
    }

    /// One command served (its reply an error or not).
    pub fn command(&self, error: bool) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        if error {
            self.error_replies.fetch_add(1, Ordering::Relaxed);
        }
        let sec = self.started.elapsed().as_secs();
        let cur = self.window_sec.load(Ordering::Relaxed);
        if sec != cur
            && self
                .window_sec
                .compare_exchange(cur, sec, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let n = self.window_count.swap(0, Ordering::Relaxed);
            self.last_rate
                .store(if sec == cur + 1 { n } else { 0 }, Ordering::Relaxed);
        }
        self.window_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Commands served in the last whole second (`instantaneous_ops_per_sec`).
    pub fn ops_per_sec(&self) -> u64 {
        let sec = self.started.elapsed().as_secs();
        let cur = self.window_sec.load(Ordering::Relaxed);
        if sec == cur {
            self.last_rate.load(Ordering::Relaxed)
        } else if sec == cur + 1 {
            self.window_count.load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

/// What `CLIENT LIST` shows of a connection that changes while it runs.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub name: Vec<u8>,
    pub user: String,
    pub resp: u8,
    pub lib_name: String,
    pub lib_ver: String,
    /// The last command's name in the command table (`NULL` before the first), and its
    /// subcommand for a container command (`CLIENT LIST` shows `client|list`).
    pub cmd: &'static str,
    pub cmd_sub: Option<String>,
    pub last: Instant,
    pub sub: usize,
    pub psub: usize,
    /// Commands queued in `MULTI`, -1 outside one.
    pub multi: i64,
}

impl Meta {
    /// A new connection's: no name or library, no command yet, nothing subscribed.
    pub(crate) fn fresh(user: String) -> Meta {
        Meta {
            name: Vec::new(),
            user,
            resp: 2,
            lib_name: String::new(),
            lib_ver: String::new(),
            cmd: "NULL",
            cmd_sub: None,
            last: Instant::now(),
            sub: 0,
            psub: 0,
            multi: -1,
        }
    }
}

/// One connection in the registry.
pub(crate) struct Client {
    pub id: u64,
    pub addr: SocketAddr,
    pub laddr: Option<SocketAddr>,
    pub created: Instant,
    pub meta: Mutex<Meta>,
    pub blocked: AtomicBool,
    kill: watch::Sender<bool>,
    /// Bumped by `CLIENT UNBLOCK`: (generation, answer with an error).
    unblock: watch::Sender<(u64, bool)>,
}

impl Client {
    pub fn meta(&self) -> MutexGuard<'_, Meta> {
        lock(&self.meta)
    }

    /// Ask the connection to close (it does so at its next wake-up, after the reply it is
    /// writing).
    pub fn kill(&self) {
        self.kill.send_replace(true);
    }

    pub fn killed(&self) -> watch::Receiver<bool> {
        self.kill.subscribe()
    }

    pub fn is_killed(&self) -> bool {
        *self.kill.borrow()
    }

    /// `CLIENT UNBLOCK`: wake the connection's blocking pop if it is in one.
    pub fn unblock(&self, error: bool) -> bool {
        if !self.blocked.load(Ordering::Acquire) {
            return false;
        }
        self.unblock.send_modify(|(g, e)| {
            *g += 1;
            *e = error;
        });
        true
    }

    pub fn unblocks(&self) -> watch::Receiver<(u64, bool)> {
        self.unblock.subscribe()
    }

    fn flags(&self, m: &Meta) -> String {
        let mut f = String::new();
        if m.sub + m.psub > 0 {
            f.push('P');
        }
        if self.blocked.load(Ordering::Relaxed) {
            f.push('b');
        }
        if m.multi >= 0 {
            f.push('x');
        }
        if f.is_empty() {
            f.push('N');
        }
        f
    }

    /// Whether `CLIENT LIST TYPE`/`CLIENT KILL TYPE` `kind` matches: `normal` or `pubsub`
    /// (fenced has no replica or master connections).
    pub fn is_type(&self, kind: &str) -> bool {
        let m = self.meta();
        let pubsub = m.sub + m.psub > 0;
        match kind {
            "pubsub" => pubsub,
            "normal" => !pubsub,
            _ => false,
        }
    }

    /// The connection's `CLIENT LIST` line (without the newline).
    pub fn line(&self, now: Instant) -> String {
        let m = self.meta().clone();
        let cmd = match &m.cmd_sub {
            Some(sub) => format!("{}|{sub}", m.cmd.to_ascii_lowercase()),
            None if m.cmd == "NULL" => m.cmd.to_string(),
            None => m.cmd.to_ascii_lowercase(),
        };
        format!(
            "id={} addr={} laddr={} name={} age={} idle={} flags={} db=0 sub={} psub={} \
             ssub=0 multi={} cmd={} user={} redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr.map(|a| a.to_string()).unwrap_or_default(),
            String::from_utf8_lossy(&m.name),
            now.saturating_duration_since(self.created).as_secs(),
            now.saturating_duration_since(m.last).as_secs(),
            self.flags(&m),
            m.sub,
            m.psub,
            m.multi,
            cmd,
            m.user,
            m.resp,
            m.lib_name,
            m.lib_ver,
        )
    }
}

/// Every live connection of the node, by id.
#[derive(Default)]
pub(crate) struct Registry {
    clients: Mutex<BTreeMap<u64, Arc<Client>>>,
}

impl Registry {
    pub fn add(
        &self,
        id: u64,
        addr: SocketAddr,
        laddr: Option<SocketAddr>,
        meta: Meta,
    ) -> Arc<Client> {
        let c = Arc::new(Client {
            id,
            addr,
            laddr,
            created: Instant::now(),
            meta: Mutex::new(meta),
            blocked: AtomicBool::new(false),
            kill: watch::channel(false).0,
            unblock: watch::channel((0, false)).0,
        });
        lock(&self.clients).insert(id, c.clone());
        c
    }

    pub fn remove(&self, id: u64) {
        lock(&self.clients).remove(&id);
    }

    pub fn get(&self, id: u64) -> Option<Arc<Client>> {
        lock(&self.clients).get(&id).cloned()
    }

    /// Every connection, by id.
    pub fn all(&self) -> Vec<Arc<Client>> {
        lock(&self.clients).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_per_sec_counts_the_last_whole_second() {
        let s = Stats::new();
        for _ in 0..5 {
            s.command(false);
        }
        s.command(true);
        assert_eq!(s.commands.load(Ordering::Relaxed), 6);
        assert_eq!(s.error_replies.load(Ordering::Relaxed), 1);
        // Still in second 0: the second before it had none.
        assert_eq!(s.ops_per_sec(), 0);
    }

    #[test]
    fn kill_and_unblock_reach_the_connection() {
        let r = Registry::default();
        let meta = Meta {
            name: b"n".to_vec(),
            ..Meta::fresh("default".into())
        };
        let c = r.add(7, "127.0.0.1:5000".parse().unwrap(), None, meta);
        let rx = c.killed();
        assert!(!*rx.borrow());
        r.get(7).unwrap().kill();
        assert!(*rx.borrow() && c.is_killed());
        assert!(!c.unblock(false), "not blocked: nothing to unblock");
        let mut u = c.unblocks();
        c.blocked.store(true, Ordering::Release);
        assert!(c.unblock(true));
        assert!(u.has_changed().unwrap());
        assert_eq!(*u.borrow_and_update(), (1, true));
        let line = c.line(Instant::now());
        assert!(
            line.starts_with("id=7 addr=127.0.0.1:5000 laddr= name=n age=0 idle=0 flags=b "),
            "{line}"
        );
        assert!(line.contains(" cmd=NULL user=default "), "{line}");
        r.remove(7);
        assert!(r.get(7).is_none() && r.all().is_empty());
    }
}
