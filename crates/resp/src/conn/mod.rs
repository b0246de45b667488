//! One RESP connection: reads pipelined requests, serves them in order, writes the replies.
//!
//! A pipeline's run of consecutive keyspace writes is proposed as **one** log entry
//! ([`KvCommand::Batch`]) and a run of consecutive reads shares **one** read barrier, so
//! pipelining pays one Raft round per run instead of one per command while keeping Redis's
//! in-order semantics. Every proposal carries a fresh `(client_id, seq)` of this connection,
//! so the node's internal retries (leader changes) never apply a command twice.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use fenced_core::kv::{command_class, Argv, CommandClass, KvCommand, KvEvent, Reply, Restriction};
use fenced_core::limits::DEDUP_WINDOW;
use fenced_core::RequestId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast;

use crate::acl::User;
use crate::frame::{encode, parse_request, Proto};
use crate::{BackendError, Shared};

mod lock;
mod pubsub;
mod server;

use lock::Parsed;
use pubsub::{push_message, recv, recv_lost, Lagged, SESSION_CHECK};

/// Most requests taken from the read buffer before replying.
const MAX_PIPELINE: usize = 1024;
/// Longest `BLPOP`/`BRPOP` wait (`0` = "forever" is capped here, then nil like a timeout).
const MAX_BLOCK: Duration = Duration::from_secs(24 * 3600);

const NOAUTH: &str = "NOAUTH Authentication required.";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NOT_INT: &str = "ERR value is not an integer or out of range";

struct Multi {
    cmds: Vec<Argv>,
    dirty: bool,
}

/// A client's byte stream: plain TCP or TLS over it.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub struct Connection {
    shared: Arc<Shared>,
    socket: Box<dyn Stream>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    rbuf: BytesMut,
    out: Vec<u8>,
    st: State,
}

struct State {
    proto: Proto,
    /// The authenticated user; `None` until `AUTH`/`HELLO … AUTH` (unless `default` is
    /// `on nopass`).
    user: Option<Arc<User>>,
    id: u64,
    name: Option<Vec<u8>>,
    client_id: u64,
    seq: u64,
    multi: Option<Multi>,
    watches: Vec<(Vec<u8>, u64)>,
    channels: BTreeSet<Vec<u8>>,
    patterns: BTreeSet<Vec<u8>>,
    events: Option<broadcast::Receiver<KvEvent>>,
    /// Ended grants, while subscribed (the lock-loss channels, `pubsub.rs`).
    lost: Option<broadcast::Receiver<fenced_core::Event>>,
    /// Sessions whose `session_gone` this connection was sent.
    gone: BTreeSet<u64>,
    closing: bool,
}

impl State {
    fn subscribed(&self) -> bool {
        !self.channels.is_empty() || !self.patterns.is_empty()
    }
    fn next_rid(&mut self) -> RequestId {
        self.seq += 1;
        RequestId {
            client_id: self.client_id,
            seq: self.seq,
        }
    }
}

fn backend_error(e: BackendError) -> Reply {
    match e {
        BackendError::Unavailable(m) => Reply::err(format!("TRYAGAIN cluster unavailable: {m}")),
        BackendError::Unknown(m) => Reply::err(format!("TIMEOUT outcome unknown: {m}")),
        BackendError::Rejected(m) => Reply::err(format!("ERR {m}")),
        BackendError::Busy(m) => Reply::err(format!("BUSY {m}")),
        BackendError::Corrupt(m) => Reply::err(format!("CORRUPT {m}")),
    }
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

fn parse_u64(b: &[u8]) -> Result<u64, Reply> {
    std::str::from_utf8(b)
        .ok()
        .filter(|s| !s.starts_with('+'))
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| Reply::err(NOT_INT))
}

/// `cmd` as the state machine must run it: wrapped in [`KvCommand::Restricted`] when the
/// user has limits to enforce there, so that scripts cannot get around them.
fn restricted(limits: Option<Restriction>, cmd: KvCommand) -> KvCommand {
    match limits {
        Some(limits) => KvCommand::Restricted {
            limits,
            cmd: Box::new(cmd),
        },
        None => cmd,
    }
}

/// `argv` is a lock-family write that may join a pipelined run ([`Parsed::batchable`]).
fn batchable(argv: &Argv) -> bool {
    matches!(lock::parse(argv), Some(Ok(p)) if p.batchable())
}

fn text(b: &[u8]) -> Result<String, Reply> {
    String::from_utf8(b.to_vec()).map_err(|_| Reply::err("ERR lock names and owners must be UTF-8"))
}

impl Connection {
    pub(crate) fn new(
        shared: Arc<Shared>,
        socket: Box<dyn Stream>,
        peer: SocketAddr,
        local: Option<SocketAddr>,
    ) -> Self {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let user = shared.config.acl.initial_user();
        let client_id = shared.backend.client_id();
        shared.live.fetch_add(1, Ordering::Relaxed);
        Connection {
            shared,
            socket,
            peer,
            local,
            rbuf: BytesMut::with_capacity(16 * 1024),
            out: Vec::with_capacity(16 * 1024),
            st: State {
                proto: Proto::Resp2,
                user,
                id,
                name: None,
                client_id,
                seq: 0,
                multi: None,
                watches: Vec::new(),
                channels: BTreeSet::new(),
                patterns: BTreeSet::new(),
                events: None,
                lost: None,
                gone: BTreeSet::new(),
                closing: false,
            },
        }
    }

    /// Serve until the client leaves, a protocol error, the idle timeout, or shutdown.
    pub async fn run(mut self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut session_check = tokio::time::interval(SESSION_CHECK);
        session_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut reqs = Vec::new();
            while reqs.len() < MAX_PIPELINE {
                match parse_request(&self.rbuf, &self.shared.config.limits) {
                    Ok(Some((argv, n))) => {
                        self.rbuf.advance(n);
                        if !argv.is_empty() {
                            reqs.push(argv);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        // Serve what came before, then report and close (like Redis).
                        self.process(reqs).await;
                        encode(
                            &Reply::err(format!("ERR {e}")),
                            self.st.proto,
                            &mut self.out,
                        );
                        let _ = self.flush().await;
                        return;
                    }
                }
            }
            if !reqs.is_empty() {
                self.process(reqs).await;
                if self.flush().await.is_err() || self.st.closing {
                    return;
                }
                continue;
            }
            let idle = self.shared.config.idle_timeout;
            let idle_applies = !idle.is_zero() && !self.st.subscribed();
            enum Woke {
                Read(std::io::Result<usize>),
                Event(Option<KvEvent>),
                Lost(Option<Result<fenced_core::Event, Lagged>>),
                CheckSessions,
                Stop,
            }
            let watching_sessions = self.st.watches_sessions();
            let woke = tokio::select! {
                r = self.socket.read_buf(&mut self.rbuf) => Woke::Read(r),
                ev = recv(&mut self.st.events) => Woke::Event(ev),
                ev = recv_lost(&mut self.st.lost) => Woke::Lost(ev),
                _ = session_check.tick(), if watching_sessions => Woke::CheckSessions,
                _ = shutdown.wait_for(|s| *s) => Woke::Stop,
                _ = tokio::time::sleep(idle), if idle_applies => Woke::Stop,
            };
            match woke {
                Woke::Read(Ok(0) | Err(_)) | Woke::Stop => break,
                Woke::Read(Ok(_)) => {}
                Woke::Event(Some(KvEvent::Published { channel, message })) => {
                    push_message(&self.st, &channel, &message, &mut self.out);
                    if self.flush().await.is_err() {
                        break;
                    }
                }
                Woke::Event(Some(KvEvent::Pushed { .. })) => {}
                Woke::Event(None) => self.st.events = None,
                Woke::Lost(None) => self.st.lost = None,
                Woke::Lost(Some(ev)) => {
                    self.deliver_lost(ev);
                    if self.flush().await.is_err() {
                        break;
                    }
                }
                Woke::CheckSessions => {
                    self.check_sessions();
                    if self.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    fn cleanup(&mut self) {
        for c in std::mem::take(&mut self.st.channels) {
            self.shared.subs.remove(false, &c);
        }
        for p in std::mem::take(&mut self.st.patterns) {
            self.shared.subs.remove(true, &p);
        }
        self.st.events = None;
        self.st.lost = None;
        self.st.gone.clear();
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            let r = self.socket.write_all(&self.out).await;
            self.out.clear();
            r?;
        }
        Ok(())
    }

    fn reply(&mut self, r: &Reply) {
        encode(r, self.st.proto, &mut self.out);
    }

    /// Reply `r` to `argv`, whose serving began at `since`, and tell the observer (the one
    /// place where commands are counted and timed; `r` is `None` for a command that wrote
    /// its own replies, like `SUBSCRIBE`).
    fn answer(&mut self, argv: &Argv, r: Option<&Reply>, since: Instant) {
        if let Some(r) = r {
            self.reply(r);
        }
        if let Some(o) = &self.shared.config.observer {
            let ok = !r.is_some_and(Reply::is_error);
            o.command(crate::command_label(argv), ok, since.elapsed());
        }
    }

    /// Serve a pipeline in order: runs of plain writes become one log entry, runs of reads
    /// one read barrier; everything else one at a time.
    async fn process(&mut self, reqs: Vec<Argv>) {
        let mut i = 0;
        while i < reqs.len() && !self.st.closing {
            let since = Instant::now();
            let class = match self.gate(&reqs[i]) {
                Ok(c) => c,
                Err(r) => {
                    self.answer(&reqs[i], Some(&r), since);
                    i += 1;
                    continue;
                }
            };
            match class {
                CommandClass::Write | CommandClass::Read => {
                    let mut j = i + 1;
                    while j < reqs.len() && j - i < fenced_core::kv::MAX_BATCH {
                        match self.gate(&reqs[j]) {
                            Ok(c) if c == class => j += 1,
                            _ => break,
                        }
                    }
                    let group = reqs[i..j].to_vec();
                    let replies = if class == CommandClass::Write {
                        self.write_batch(group).await
                    } else {
                        self.read_batch(group).await
                    };
                    for (argv, r) in reqs[i..j].iter().zip(&replies) {
                        self.answer(argv, Some(r), since);
                    }
                    i = j;
                }
                CommandClass::Lock if batchable(&reqs[i]) => {
                    // A run of lock-family writes that do not wait: proposed together, in
                    // order, each with its own request id — no more of them than the state
                    // machine's dedup window, so every retry still finds its first outcome.
                    let mut run = Vec::new();
                    let mut j = i;
                    while j < reqs.len() && run.len() < DEDUP_WINDOW as usize {
                        if j > i && !matches!(self.gate(&reqs[j]), Ok(CommandClass::Lock)) {
                            break;
                        }
                        match lock::parse(&reqs[j]) {
                            Some(Ok(Parsed::Write {
                                cmd,
                                wait_ms: 0,
                                shape,
                                reqid,
                            })) if !matches!(cmd, fenced_core::Command::CloseSession { .. }) => {
                                let rid = self.lock_rid(reqid);
                                run.push(((rid, cmd), shape));
                            }
                            _ => break,
                        }
                        j += 1;
                    }
                    let n = run.len();
                    let (cmds, shapes): (Vec<_>, Vec<_>) = run.into_iter().unzip();
                    let mut replies = self.shared.backend.lock_batch(cmds).await.into_iter();
                    let now = self.shared.backend.log_time();
                    // The run is `reqs[i..i + n]`: it stops at the first that is not one.
                    for (argv, shape) in reqs[i..i + n].iter().zip(shapes) {
                        let r = match replies.next() {
                            Some(r) => lock::render(shape, r, now),
                            None => Reply::err(format!(
                                "ERR internal: fewer replies than {n} lock commands"
                            )),
                        };
                        self.answer(argv, Some(&r), since);
                    }
                    i = j;
                }
                _ => {
                    let r = self.single(&reqs[i], class).await;
                    self.answer(&reqs[i], r.as_ref(), since);
                    i += 1;
                }
            }
        }
    }

    /// Decide how `argv` is served now; `Err` is the reply when it must not run (unknown
    /// command, auth, ACL permissions, subscribed context, queued in MULTI). Queuing happens
    /// here, after the permission check (so a refused command aborts the transaction).
    fn gate(&mut self, argv: &Argv) -> Result<CommandClass, Reply> {
        let name = upper(&argv[0]);
        let class = command_class(argv).map_err(|e| Reply::Error(e.to_string()));
        let refused = match &self.st.user {
            None if !matches!(name.as_str(), "AUTH" | "HELLO" | "QUIT" | "RESET") => {
                Some(Reply::err(NOAUTH))
            }
            Some(user) if class.is_ok() => user.check(argv).err().map(Reply::Error),
            _ => None,
        };
        if let Some(e) = refused {
            if let Some(m) = self.st.multi.as_mut() {
                m.dirty = true;
            }
            return Err(e);
        }
        if let Some(m) = self.st.multi.as_mut() {
            if !matches!(
                name.as_str(),
                "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "QUIT" | "RESET"
            ) {
                return match class {
                    Ok(_) => {
                        m.cmds.push(argv.clone());
                        Err(Reply::Status("QUEUED".into()))
                    }
                    Err(e) => {
                        m.dirty = true;
                        Err(e)
                    }
                };
            }
        }
        let class = class?;
        if self.st.subscribed()
            && self.st.proto == Proto::Resp2
            && !matches!(
                name.as_str(),
                "SUBSCRIBE"
                    | "UNSUBSCRIBE"
                    | "PSUBSCRIBE"
                    | "PUNSUBSCRIBE"
                    | "PING"
                    | "QUIT"
                    | "RESET"
            )
        {
            return Err(Reply::err(format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
                name.to_ascii_lowercase()
            )));
        }
        Ok(class)
    }

    async fn write_batch(&mut self, cmds: Vec<Argv>) -> Vec<Reply> {
        let n = cmds.len();
        let publishes: Vec<Option<Vec<u8>>> = cmds
            .iter()
            .map(|a| a[0].eq_ignore_ascii_case(b"PUBLISH").then(|| a[1].clone()))
            .collect();
        let limits = self.limits_for(&cmds);
        let cmd = restricted(limits, KvCommand::Batch(cmds));
        let rid = self.st.next_rid();
        match self.shared.backend.write(rid, cmd).await {
            Ok(resp) if resp.replies.len() == n => resp
                .replies
                .into_iter()
                .zip(publishes)
                .map(|(r, p)| match (r, p) {
                    (Reply::Int(_), Some(ch)) => Reply::Int(self.shared.subs.receivers(&ch)),
                    (r, _) => r,
                })
                .collect(),
            Ok(resp) => vec![
                Reply::err(format!(
                    "ERR internal: {} replies for {n} commands",
                    resp.replies.len()
                ));
                n
            ],
            Err(e) => vec![backend_error(e); n],
        }
    }

    /// The limits the state machine must enforce on an entry of `argvs` for this
    /// connection's user (see [`User::limits_for`]).
    fn limits_for(&self, argvs: &[Argv]) -> Option<Restriction> {
        self.st.user.as_ref().and_then(|u| u.limits_for(argvs))
    }

    async fn read_batch(&mut self, cmds: Vec<Argv>) -> Vec<Reply> {
        let n = cmds.len();
        let f = Box::new(move |sm: &fenced_core::StateMachine, now| {
            cmds.iter()
                .map(|a| {
                    sm.kv()
                        .read(now, a)
                        .unwrap_or_else(|| Reply::err("ERR not a read command"))
                })
                .collect()
        });
        match self.shared.backend.read(f).await {
            Ok(r) if r.len() == n => r,
            Ok(_) => vec![Reply::err("ERR internal: reply count mismatch"); n],
            Err(e) => vec![backend_error(e); n],
        }
    }

    async fn single(&mut self, argv: &Argv, class: CommandClass) -> Option<Reply> {
        let name = upper(&argv[0]);
        let a = &argv[1..];
        Some(match class {
            CommandClass::Lock => self.lock_cmd(argv).await,
            CommandClass::Blocking => self.blocking_pop(argv.clone()).await,
            CommandClass::Connection => return self.connection_cmd(&name, a).await,
            // Reads and writes are batched by `process`.
            CommandClass::Read => self.read_batch(vec![argv.clone()]).await.remove(0),
            CommandClass::Write => self.write_batch(vec![argv.clone()]).await.remove(0),
        })
    }

    /// `BLPOP`/`BRPOP`: try to pop through the log; if every list is empty, wait (on this
    /// node) for a push to one of the keys and try again, until the timeout.
    async fn blocking_pop(&mut self, argv: Argv) -> Reply {
        let Some(secs) = argv
            .last()
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|t| t.is_finite())
        else {
            return Reply::err("ERR timeout is not a float or out of range");
        };
        if secs < 0.0 {
            return Reply::err("ERR timeout is negative");
        }
        let limit = if secs == 0.0 {
            MAX_BLOCK
        } else {
            Duration::from_secs_f64(secs).min(MAX_BLOCK)
        };
        let deadline = tokio::time::Instant::now() + limit;
        let keys: Vec<Vec<u8>> = argv[1..argv.len() - 1].to_vec();
        let mut shutdown = self.shared.shutdown.clone();
        loop {
            // Subscribe before trying, so a push right after the attempt is not missed.
            let mut rx = self.shared.backend.events();
            let r = self.write_batch(vec![argv.clone()]).await;
            match r.into_iter().next() {
                Some(Reply::NilArray) => {}
                Some(other) => return other,
                None => return Reply::NilArray,
            }
            loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Ok(KvEvent::Pushed { key }) if keys.contains(&key) => break,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return Reply::NilArray,
                    },
                    _ = tokio::time::sleep_until(deadline) => return Reply::NilArray,
                    _ = shutdown.wait_for(|s| *s) => return Reply::NilArray,
                }
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        self.cleanup();
    }
}
