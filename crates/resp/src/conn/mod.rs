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

use bytes::{Buf, BufMut, BytesMut};
use fenced_core::kv::{command_class, Argv, CommandClass, KvCommand, KvEvent, Reply, Restriction};
use fenced_core::limits::DEDUP_WINDOW;
use fenced_core::RequestId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast;

use crate::acl::User;
use crate::clients::{Client, Meta};
use crate::frame::{encode, parse_request, FrameError, Proto};
use crate::{BackendError, Shared};

mod blocking;
mod client;
mod lock;
mod pubsub;
mod server;

use lock::Parsed;
use pubsub::{recv, recv_lost, reserved_publish, Lagged, SESSION_CHECK};

/// Most requests taken from the read buffer before replying.
const MAX_PIPELINE: usize = 1024;
/// A connection's own unparsed input up to this size never counts as what takes the node
/// over [`crate::Config::max_query_buffer_total`] (one read of ordinary requests; the
/// buffer's first allocation): the connection that is closed is one with a large request
/// in progress.
const SMALL_INPUT: usize = 16 * 1024;
/// Most bytes taken from the socket in one read.
const READ_CHUNK: usize = 64 * 1024;
/// A read buffer grown past this (by a large request) is given back once it is empty.
const SHRINK_ABOVE: usize = 1024 * 1024;
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
    local: Option<SocketAddr>,
    rbuf: BytesMut,
    /// What this connection adds to the node's count of unparsed input
    /// ([`crate::Shared::buffered`]): `rbuf`'s length when last brought up to date.
    accounted: usize,
    out: Vec<u8>,
    st: State,
    /// This connection in the node's registry (`CLIENT LIST`/`KILL`/`UNBLOCK`).
    client: Arc<Client>,
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
    /// `CLIENT REPLY OFF`: no replies until `CLIENT REPLY ON`.
    reply_off: bool,
    /// Replies still to suppress: `CLIENT REPLY SKIP` sets 2 (its own and the next
    /// command's).
    skip: u8,
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
        shared
            .stats
            .connections_received
            .fetch_add(1, Ordering::Relaxed);
        let client = shared.clients.add(
            id,
            peer,
            local,
            Meta::fresh(
                user.as_ref()
                    .map_or(String::new(), |u| u.name().to_string()),
            ),
        );
        Connection {
            client,
            shared,
            socket,
            local,
            rbuf: BytesMut::with_capacity(SMALL_INPUT),
            accounted: 0,
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
                reply_off: false,
                skip: 0,
            },
        }
    }

    /// Serve until the client leaves, a protocol error, the idle timeout, or shutdown.
    pub async fn run(mut self) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut killed = self.client.killed();
        let mut session_check = tokio::time::interval(SESSION_CHECK);
        session_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut reqs = Vec::new();
            // Before authentication (`user` is `None` only when the server requires it),
            // Redis's small limits apply, and one request is taken at a time: an `AUTH`
            // pipelined with a large request is served before the next one is parsed.
            let mut limits = self.shared.config.limits;
            limits.before_auth = self.st.user.is_none();
            let most = if limits.before_auth { 1 } else { MAX_PIPELINE };
            while reqs.len() < most {
                match parse_request(&self.rbuf, &limits) {
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
                        self.input_refused(&e);
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
            self.account();
            if self.rbuf.is_empty() && self.rbuf.capacity() > SHRINK_ABOVE {
                self.rbuf = BytesMut::with_capacity(SMALL_INPUT);
            }
            if !reqs.is_empty() {
                self.process(reqs).await;
                if self.flush().await.is_err() || self.st.closing || self.client.is_killed() {
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
            // At most READ_CHUNK a read, so that a read takes the node's unparsed input
            // little past its cap before `over_total` sees it.
            let mut room = (&mut self.rbuf).limit(READ_CHUNK);
            let woke = tokio::select! {
                r = self.socket.read_buf(&mut room) => Woke::Read(r),
                ev = recv(&mut self.st.events) => Woke::Event(ev),
                ev = recv_lost(&mut self.st.lost) => Woke::Lost(ev),
                _ = session_check.tick(), if watching_sessions => Woke::CheckSessions,
                _ = shutdown.wait_for(|s| *s) => Woke::Stop,
                _ = killed.wait_for(|k| *k) => Woke::Stop,
                _ = tokio::time::sleep(idle), if idle_applies => Woke::Stop,
            };
            match woke {
                Woke::Read(Ok(0) | Err(_)) | Woke::Stop => break,
                Woke::Read(Ok(n)) => {
                    self.shared
                        .stats
                        .net_in
                        .fetch_add(n as u64, Ordering::Relaxed);
                    if let Some(over) = self.over_total() {
                        encode(&Reply::err(over), self.st.proto, &mut self.out);
                        let _ = self.flush().await;
                        break;
                    }
                }
                Woke::Event(Some(KvEvent::Published { channel, message })) => {
                    self.deliver_published(&channel, &message);
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
                    self.check_sessions().await;
                    if self.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Bring the node's count of unparsed input up to date with `rbuf`; the node's total.
    fn account(&mut self) -> usize {
        let (now, before) = (self.rbuf.len(), self.accounted);
        self.accounted = now;
        let total = &self.shared.buffered;
        if now >= before {
            total.fetch_add(now - before, Ordering::Relaxed) + (now - before)
        } else {
            total
                .fetch_sub(before - now, Ordering::Relaxed)
                .saturating_sub(before - now)
        }
    }

    /// After a read: if it took the node's unparsed input over
    /// [`crate::Config::max_query_buffer_total`] and this connection has a large request in
    /// progress, the error to close it with (logged and counted here).
    fn over_total(&mut self) -> Option<String> {
        let total = self.account();
        let cap = self.shared.config.max_query_buffer_total;
        if cap == 0 || total <= cap || self.rbuf.len() <= SMALL_INPUT {
            return None;
        }
        tracing::warn!(
            peer = %self.client.addr,
            id = self.st.id,
            buffered = self.rbuf.len(),
            total,
            cap,
            "closing a RESP connection: the node's unparsed input is over --resp-query-buffer-total"
        );
        self.observe_refused("query_buffer_total");
        Some(format!(
            "ERR Protocol error: the node's unparsed input from all connections is over its \
             limit of {cap} bytes (--resp-query-buffer-total)"
        ))
    }

    /// A protocol error `e` closes the connection: logged and counted when it is one of
    /// the input limits (before authentication, the request size).
    fn input_refused(&self, e: &FrameError) {
        match e {
            FrameError::UnauthArrayLength | FrameError::UnauthBulkLength => {
                // Debug only: an unauthenticated flood must not become a flood of log lines.
                tracing::debug!(peer = %self.client.addr, id = self.st.id, "RESP: {e}");
                self.observe_refused("unauthenticated");
            }
            FrameError::TooLarge(_) => {
                tracing::warn!(
                    peer = %self.client.addr,
                    id = self.st.id,
                    "closing a RESP connection: {e}"
                );
                self.observe_refused("query_buffer");
            }
            _ => {}
        }
    }

    fn observe_refused(&self, reason: &'static str) {
        if let Some(o) = &self.shared.config.observer {
            o.input_refused(reason);
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
            self.shared
                .stats
                .net_out
                .fetch_add(self.out.len() as u64, Ordering::Relaxed);
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
    /// its own replies, like `SUBSCRIBE`). `CLIENT REPLY OFF|SKIP` suppress the reply here;
    /// pushes (pub/sub messages and confirmations) are written elsewhere and always sent,
    /// as in Redis 7.2.
    fn answer(&mut self, argv: &Argv, r: Option<&Reply>, since: Instant) {
        self.answer_as(argv, r, since, true)
    }

    /// [`Connection::answer`]; `ran`: the command ran (not refused or queued by
    /// [`Connection::gate`]), so it counts in `INFO`'s `total_commands_processed`.
    fn answer_as(&mut self, argv: &Argv, r: Option<&Reply>, since: Instant, ran: bool) {
        let silent = self.st.reply_off || self.st.skip > 0;
        self.st.skip = self.st.skip.saturating_sub(1);
        if let (Some(r), false) = (r, silent) {
            self.reply(r);
        }
        let error = r.is_some_and(Reply::is_error);
        if ran {
            self.shared.stats.command(error);
        } else if error {
            self.shared
                .stats
                .error_replies
                .fetch_add(1, Ordering::Relaxed);
        }
        self.note(argv);
        if let Some(o) = &self.shared.config.observer {
            o.command(crate::command_label(argv), !error, since.elapsed());
        }
    }

    /// Bring this connection's `CLIENT LIST` entry up to date after `argv`.
    fn note(&self, argv: &Argv) {
        const CONTAINERS: &[&str] = &[
            "CLIENT", "CONFIG", "COMMAND", "ACL", "SCRIPT", "OBJECT", "MEMORY", "LATENCY",
            "SLOWLOG", "MODULE", "CLUSTER", "DEBUG",
        ];
        let cmd = crate::command_label(argv);
        let cmd_sub = if CONTAINERS.contains(&cmd) {
            argv.get(1)
                .filter(|s| {
                    s.len() <= 32 && s.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                })
                .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        } else {
            None
        };
        let st = &self.st;
        let mut m = self.client.meta();
        m.cmd = cmd;
        m.cmd_sub = cmd_sub;
        m.last = Instant::now();
        if m.name.as_slice() != st.name.as_deref().unwrap_or_default() {
            m.name = st.name.clone().unwrap_or_default();
        }
        let user = st.user.as_ref().map_or("", |u| u.name());
        if m.user != user {
            m.user = user.to_string();
        }
        m.resp = if st.proto == Proto::Resp3 { 3 } else { 2 };
        m.sub = st.channels.len();
        m.psub = st.patterns.len();
        m.multi = st.multi.as_ref().map_or(-1, |x| x.cmds.len() as i64);
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
                    self.answer_as(&reqs[i], Some(&r), since, false);
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
                                let cmd = self.as_user(cmd);
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
                    // Only a keep-alive's answer counts from the node's log time.
                    let now = if shapes.contains(&lock::Shape::Alive) {
                        self.shared.backend.log_time()
                    } else {
                        0
                    };
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
            Some(user) if class.is_ok() => user
                .check(argv)
                .err()
                .map(Reply::Error)
                .or_else(|| reserved_publish(argv)),
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
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        self.shared
            .buffered
            .fetch_sub(self.accounted, Ordering::Relaxed);
        self.shared.clients.remove(self.st.id);
        self.cleanup();
    }
}
