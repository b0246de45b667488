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
use fenced_core::kv::{
    command_class, command_table, lookup, Argv, CommandClass, CommandSpec, KeySpec, KvCommand,
    KvEvent, Reply, Restriction,
};
use fenced_core::limits::DEDUP_WINDOW;
use fenced_core::RequestId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::broadcast;

use crate::acl::User;
use crate::frame::{encode, encode_push, parse_request, Proto};
use crate::{BackendError, LockOp, LockOpReply, Shared};

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

/// `[WAIT ms]` after `LOCK.ACQUIRE name owner ttl`.
fn acquire_wait(rest: &[Vec<u8>]) -> Result<u64, Reply> {
    match rest {
        [] => Ok(0),
        [w, ms] if w.eq_ignore_ascii_case(b"WAIT") => parse_u64(ms),
        _ => Err(Reply::err("ERR syntax error")),
    }
}

/// `argv` as a [`LockOp`] if it is a `LOCK.*` write that does not wait (`Err`: its
/// arguments are bad, and this is the reply).
fn lock_op(argv: &Argv) -> Option<Result<LockOp, Reply>> {
    lock_op_of(&upper(&argv[0]), &argv[1..])
}

fn lock_op_of(name: &str, a: &[Vec<u8>]) -> Option<Result<LockOp, Reply>> {
    let parsed = || -> Result<Option<LockOp>, Reply> {
        Ok(match name {
            "LOCK.ACQUIRE" => {
                let (name, owner, ttl_ms) = (text(&a[0])?, text(&a[1])?, parse_u64(&a[2])?);
                (acquire_wait(&a[3..])? == 0).then_some(LockOp::Acquire {
                    name,
                    owner,
                    ttl_ms,
                })
            }
            "LOCK.RELEASE" => Some(LockOp::Release {
                name: text(&a[0])?,
                owner: text(&a[1])?,
                token: parse_u64(&a[2])?,
            }),
            "LOCK.RENEW" => Some(LockOp::Renew {
                name: text(&a[0])?,
                owner: text(&a[1])?,
                token: parse_u64(&a[2])?,
                ttl_ms: parse_u64(&a[3])?,
            }),
            _ => None,
        })
    };
    parsed().transpose()
}

fn lock_reply(r: Result<LockOpReply, BackendError>) -> Reply {
    match r {
        Ok(LockOpReply::Acquired(t)) => t.map_or(Reply::Nil, |t| Reply::Int(t as i64)),
        Ok(LockOpReply::Done(ok)) => Reply::Int(ok as i64),
        Err(e) => backend_error(e),
    }
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
                closing: false,
            },
        }
    }

    /// Serve until the client leaves, a protocol error, the idle timeout, or shutdown.
    pub async fn run(mut self) {
        let mut shutdown = self.shared.shutdown.clone();
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
                Stop,
            }
            let woke = tokio::select! {
                r = self.socket.read_buf(&mut self.rbuf) => Woke::Read(r),
                ev = recv(&mut self.st.events) => Woke::Event(ev),
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
                CommandClass::Lock if lock_op(&reqs[i]).is_some() => {
                    // A run of LOCK.* writes that do not wait: proposed together, in order,
                    // each with its own request id — no more of them than the state
                    // machine's dedup window, so every retry still finds its first outcome.
                    let mut ops = Vec::new();
                    let mut j = i;
                    while j < reqs.len() && ops.len() < DEDUP_WINDOW as usize {
                        if j > i && !matches!(self.gate(&reqs[j]), Ok(CommandClass::Lock)) {
                            break;
                        }
                        match lock_op(&reqs[j]) {
                            Some(Ok(op)) => ops.push((self.st.next_rid(), op)),
                            // Bad arguments first in the run: answered alone.
                            Some(Err(e)) if ops.is_empty() => {
                                self.answer(&reqs[j], Some(&e), since);
                                j += 1;
                                break;
                            }
                            _ => break,
                        }
                        j += 1;
                    }
                    if !ops.is_empty() {
                        let n = ops.len();
                        let mut replies = self.shared.backend.lock_batch(ops).await.into_iter();
                        // `ops` are `reqs[i..i + n]`: the run stops at the first that is not one.
                        for argv in &reqs[i..i + n] {
                            let r = match replies.next() {
                                Some(r) => lock_reply(r),
                                None => Reply::err(format!(
                                    "ERR internal: fewer replies than {n} lock commands"
                                )),
                            };
                            self.answer(argv, Some(&r), since);
                        }
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
            CommandClass::Lock => self.lock_cmd(&name, a).await.unwrap_or_else(|e| e),
            CommandClass::Blocking => self.blocking_pop(argv.clone()).await,
            CommandClass::Connection => return self.connection_cmd(&name, a).await,
            // Reads and writes are batched by `process`.
            CommandClass::Read => self.read_batch(vec![argv.clone()]).await.remove(0),
            CommandClass::Write => self.write_batch(vec![argv.clone()]).await.remove(0),
        })
    }

    /// `LOCK.*` one at a time: a waiting `LOCK.ACQUIRE` and `LOCK.INFO` (the others come in
    /// runs through [`Connection::process`]).
    async fn lock_cmd(&mut self, name: &str, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let backend = self.shared.backend.clone();
        let r = match name {
            "LOCK.ACQUIRE" => {
                let (lock, owner, ttl) = (text(&a[0])?, text(&a[1])?, parse_u64(&a[2])?);
                let wait = acquire_wait(&a[3..])?;
                let rid = self.st.next_rid();
                backend
                    .lock_acquire(rid, lock, owner, ttl, wait)
                    .await
                    .map(|t| t.map_or(Reply::Nil, |t| Reply::Int(t as i64)))
            }
            "LOCK.RELEASE" | "LOCK.RENEW" => {
                let op = match lock_op_of(name, a) {
                    Some(op) => op?,
                    None => return Err(Reply::err("ERR syntax error")),
                };
                let rid = self.st.next_rid();
                let mut out = backend.lock_batch(vec![(rid, op)]).await;
                return Ok(match out.pop() {
                    Some(r) => lock_reply(r),
                    None => Reply::err("ERR internal: no reply"),
                });
            }
            _ => backend.lock_info(text(&a[0])?).await.map(|v| match v {
                None => Reply::NilArray,
                Some(v) => Reply::Array(vec![
                    Reply::bulk("owner"),
                    Reply::bulk(v.owner),
                    Reply::bulk("token"),
                    Reply::Int(v.token as i64),
                    Reply::bulk("holds"),
                    Reply::Int(v.holds as i64),
                    Reply::bulk("ttl_ms"),
                    Reply::Int(v.ttl_ms as i64),
                ]),
            }),
        };
        Ok(r.unwrap_or_else(backend_error))
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

    /// Connection, server, transaction and pub/sub commands. `None`: the replies were
    /// written already (pub/sub confirmations).
    async fn connection_cmd(&mut self, name: &str, a: &[Vec<u8>]) -> Option<Reply> {
        let st = &mut self.st;
        Some(match name {
            "PING" => {
                if st.subscribed() && st.proto == Proto::Resp2 {
                    Reply::Array(vec![
                        Reply::bulk("pong"),
                        Reply::bulk(a.first().cloned().unwrap_or_default()),
                    ])
                } else {
                    match a {
                        [] => Reply::Status("PONG".into()),
                        [m] => Reply::Bulk(m.clone()),
                        _ => Reply::err("ERR wrong number of arguments for 'ping' command"),
                    }
                }
            }
            "ECHO" => Reply::Bulk(a[0].clone()),
            "QUIT" => {
                st.closing = true;
                Reply::ok()
            }
            "RESET" => {
                st.multi = None;
                st.watches.clear();
                st.proto = Proto::Resp2;
                st.name = None;
                st.user = self.shared.config.acl.initial_user();
                self.cleanup();
                self.st.events = None;
                Reply::Status("RESET".into())
            }
            "SELECT" => match a[0].as_slice() {
                b"0" => Reply::ok(),
                _ => Reply::err("ERR DB index is out of range"),
            },
            "AUTH" => self.auth(a),
            "ACL" => match &st.user {
                Some(me) => self.shared.config.acl.command(me, a),
                None => Reply::err(NOAUTH),
            },
            "HELLO" => self.hello(a),
            "CLIENT" => self.client_cmd(a),
            "INFO" => Reply::Bulk(self.info().into_bytes()),
            "COMMAND" => command_cmd(a),
            "CONFIG" => config_cmd(a),
            "MULTI" => {
                if st.multi.is_some() {
                    Reply::err("ERR MULTI calls can not be nested")
                } else {
                    st.multi = Some(Multi {
                        cmds: Vec::new(),
                        dirty: false,
                    });
                    Reply::ok()
                }
            }
            "DISCARD" => match st.multi.take() {
                None => Reply::err("ERR DISCARD without MULTI"),
                Some(_) => {
                    st.watches.clear();
                    Reply::ok()
                }
            },
            "EXEC" => match st.multi.take() {
                None => Reply::err("ERR EXEC without MULTI"),
                Some(m) => {
                    let watches = std::mem::take(&mut self.st.watches);
                    if m.dirty {
                        Reply::err("EXECABORT Transaction discarded because of previous errors.")
                    } else {
                        let limits = self.limits_for(&m.cmds);
                        let cmd = restricted(
                            limits,
                            KvCommand::Multi {
                                watches,
                                cmds: m.cmds,
                            },
                        );
                        let rid = self.st.next_rid();
                        match self.shared.backend.write(rid, cmd).await {
                            Ok(mut r) if r.replies.len() == 1 => r.replies.remove(0),
                            Ok(_) => Reply::err("ERR internal: bad EXEC reply"),
                            Err(e) => backend_error(e),
                        }
                    }
                }
            },
            "WATCH" => {
                if st.multi.is_some() {
                    return Some(Reply::err("ERR WATCH inside MULTI is not allowed"));
                }
                let keys: Vec<Vec<u8>> = a.to_vec();
                let f = {
                    let keys = keys.clone();
                    Box::new(move |sm: &fenced_core::StateMachine, now| {
                        keys.iter()
                            .map(|k| Reply::Int(sm.kv().mod_revision(k, now) as i64))
                            .collect()
                    })
                };
                match self.shared.backend.read(f).await {
                    Ok(revs) => {
                        for (k, r) in keys.into_iter().zip(revs) {
                            if let Reply::Int(r) = r {
                                self.st.watches.push((k, r as u64));
                            }
                        }
                        Reply::ok()
                    }
                    Err(e) => backend_error(e),
                }
            }
            "UNWATCH" => {
                st.watches.clear();
                Reply::ok()
            }
            "SUBSCRIBE" | "PSUBSCRIBE" => {
                let pattern = name == "PSUBSCRIBE";
                if st.events.is_none() {
                    st.events = Some(self.shared.backend.events());
                }
                for ch in a {
                    let set = if pattern {
                        &mut st.patterns
                    } else {
                        &mut st.channels
                    };
                    if set.insert(ch.clone()) {
                        self.shared.subs.add(pattern, ch);
                    }
                    let count = (st.channels.len() + st.patterns.len()) as i64;
                    let kind = if pattern { "psubscribe" } else { "subscribe" };
                    encode_push(
                        &[
                            Reply::bulk(kind),
                            Reply::Bulk(ch.clone()),
                            Reply::Int(count),
                        ],
                        st.proto,
                        &mut self.out,
                    );
                }
                return None;
            }
            "UNSUBSCRIBE" | "PUNSUBSCRIBE" => {
                let pattern = name == "PUNSUBSCRIBE";
                let kind = if pattern {
                    "punsubscribe"
                } else {
                    "unsubscribe"
                };
                let names: Vec<Vec<u8>> = if a.is_empty() {
                    if pattern {
                        st.patterns.iter().cloned().collect()
                    } else {
                        st.channels.iter().cloned().collect()
                    }
                } else {
                    a.to_vec()
                };
                if names.is_empty() {
                    let count = (st.channels.len() + st.patterns.len()) as i64;
                    encode_push(
                        &[Reply::bulk(kind), Reply::Nil, Reply::Int(count)],
                        st.proto,
                        &mut self.out,
                    );
                }
                for ch in names {
                    let set = if pattern {
                        &mut st.patterns
                    } else {
                        &mut st.channels
                    };
                    if set.remove(&ch) {
                        self.shared.subs.remove(pattern, &ch);
                    }
                    let count = (st.channels.len() + st.patterns.len()) as i64;
                    encode_push(
                        &[Reply::bulk(kind), Reply::Bulk(ch), Reply::Int(count)],
                        st.proto,
                        &mut self.out,
                    );
                }
                if !st.subscribed() {
                    st.events = None;
                }
                return None;
            }
            other => Reply::err(format!(
                "ERR unknown command '{}'",
                other.to_ascii_lowercase()
            )),
        })
    }

    fn check_password(&self, user: &[u8], pass: &[u8]) -> Result<Arc<User>, Reply> {
        self.shared
            .config
            .acl
            .authenticate(user, pass)
            .ok_or_else(|| Reply::err(WRONGPASS))
    }

    fn auth(&mut self, a: &[Vec<u8>]) -> Reply {
        let r = match a {
            // Redis: the one-argument form is an error while `default` needs no password.
            [_] if self.shared.config.acl.default_is_nopass() => Err(Reply::err(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            )),
            [pass] => self.check_password(b"default", pass),
            [user, pass] => self.check_password(user, pass),
            _ => Err(Reply::err("ERR syntax error")),
        };
        match r {
            Ok(user) => {
                self.st.user = Some(user);
                Reply::ok()
            }
            Err(e) => e,
        }
    }

    fn hello(&mut self, a: &[Vec<u8>]) -> Reply {
        let mut proto = self.st.proto;
        let mut i = 0;
        if let Some(v) = a.first() {
            proto = match v.as_slice() {
                b"2" => Proto::Resp2,
                b"3" => Proto::Resp3,
                _ => {
                    return match std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                    {
                        Some(_) => Reply::err("NOPROTO unsupported protocol version"),
                        None => {
                            Reply::err("ERR Protocol version is not an integer or out of range")
                        }
                    }
                }
            };
            i = 1;
        }
        let mut name = None;
        while i < a.len() {
            if a[i].eq_ignore_ascii_case(b"AUTH") && i + 2 < a.len() {
                match self.check_password(&a[i + 1], &a[i + 2]) {
                    Ok(user) => self.st.user = Some(user),
                    Err(e) => return e,
                }
                i += 3;
            } else if a[i].eq_ignore_ascii_case(b"SETNAME") && i + 1 < a.len() {
                name = Some(a[i + 1].clone());
                i += 2;
            } else {
                return Reply::err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&a[i])
                ));
            }
        }
        if self.st.user.is_none() {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
        }
        self.st.proto = proto;
        if name.is_some() {
            self.st.name = name;
        }
        let s = |x: &str| Reply::bulk(x);
        Reply::Map(vec![
            (s("server"), s("redis")),
            (s("version"), s("7.2.0")),
            (
                s("proto"),
                Reply::Int(if proto == Proto::Resp3 { 3 } else { 2 }),
            ),
            (s("id"), Reply::Int(self.st.id as i64)),
            (s("mode"), s("standalone")),
            (s("role"), s("master")),
            (s("modules"), Reply::Array(vec![])),
        ])
    }

    fn client_line(&self) -> String {
        format!(
            "id={} addr={} laddr={} fd=0 name={} db=0 user={} resp={} lib-name= lib-ver=\n",
            self.st.id,
            self.peer,
            self.local.map(|a| a.to_string()).unwrap_or_default(),
            String::from_utf8_lossy(self.st.name.as_deref().unwrap_or_default()),
            self.st.user.as_ref().map_or("default", |u| u.name()),
            if self.st.proto == Proto::Resp3 { 3 } else { 2 },
        )
    }

    fn client_cmd(&mut self, a: &[Vec<u8>]) -> Reply {
        match upper(&a[0]).as_str() {
            "ID" => Reply::Int(self.st.id as i64),
            "SETNAME" if a.len() == 2 => {
                if a[1].iter().any(|c| *c <= b' ') {
                    return Reply::err(
                        "ERR Client names cannot contain spaces, newlines or special characters.",
                    );
                }
                self.st.name = (!a[1].is_empty()).then(|| a[1].clone());
                Reply::ok()
            }
            "GETNAME" => self.st.name.clone().map_or(Reply::Nil, Reply::Bulk),
            "SETINFO" | "NO-EVICT" | "NO-TOUCH" | "REPLY" => Reply::ok(),
            "INFO" => Reply::Bulk(self.client_line().into_bytes()),
            "LIST" => Reply::Bulk(self.client_line().into_bytes()),
            _ => Reply::err(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(&a[0])
            )),
        }
    }

    fn info(&self) -> String {
        let mut s = String::from(
            "# Server\r\nredis_version:7.2.0\r\nredis_mode:standalone\r\nfenced:1\r\n",
        );
        for (k, v) in self.shared.backend.info() {
            s.push_str(&format!("{k}:{v}\r\n"));
        }
        s.push_str("\r\n# Clients\r\n");
        s.push_str(&format!(
            "connected_clients:{}\r\n",
            self.shared.live.load(Ordering::Relaxed)
        ));
        s.push_str("\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
        s.push_str("\r\n# Keyspace\r\n");
        s
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        self.cleanup();
    }
}

async fn recv(rx: &mut Option<broadcast::Receiver<KvEvent>>) -> Option<KvEvent> {
    let Some(r) = rx.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match r.recv().await {
            Ok(e) => return Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!("a subscriber fell behind and lost {n} events");
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

fn push_message(st: &State, channel: &[u8], message: &[u8], out: &mut Vec<u8>) {
    if st.channels.contains(channel) {
        encode_push(
            &[
                Reply::bulk("message"),
                Reply::bulk(channel),
                Reply::bulk(message),
            ],
            st.proto,
            out,
        );
    }
    for p in &st.patterns {
        if fenced_core::kv::glob_match(p, channel) {
            encode_push(
                &[
                    Reply::bulk("pmessage"),
                    Reply::Bulk(p.clone()),
                    Reply::bulk(channel),
                    Reply::bulk(message),
                ],
                st.proto,
                out,
            );
        }
    }
}

fn command_info(c: &CommandSpec) -> Reply {
    let mut flags = match c.base_class() {
        CommandClass::Read => vec![Reply::Status("readonly".into())],
        CommandClass::Write | CommandClass::Lock | CommandClass::Blocking => {
            vec![Reply::Status("write".into())]
        }
        CommandClass::Connection => vec![Reply::Status("fast".into())],
    };
    let (first, last, step) = match c.keys {
        KeySpec::None | KeySpec::Whole => (0, 0, 0),
        KeySpec::Script => {
            flags.push(Reply::Status("movablekeys".into()));
            (0, 0, 0)
        }
        KeySpec::First => (1, 1, 1),
        KeySpec::All => (1, -1, 1),
        KeySpec::EveryOther => (1, -1, 2),
        KeySpec::AllButLast => (1, -2, 1),
    };
    Reply::Array(vec![
        Reply::bulk(c.name.to_ascii_lowercase()),
        Reply::Int(c.arity as i64),
        Reply::Array(flags),
        Reply::Int(first),
        Reply::Int(last),
        Reply::Int(step),
    ])
}

fn command_cmd(a: &[Vec<u8>]) -> Reply {
    let table = command_table();
    match a.first().map(|s| upper(s)).as_deref() {
        None => Reply::Array(table.iter().map(|c| command_info(c)).collect()),
        Some("COUNT") => Reply::Int(table.len() as i64),
        Some("DOCS") => Reply::Map(vec![]),
        Some("INFO") => Reply::Array(
            a[1..]
                .iter()
                .map(|n| lookup(n).map_or(Reply::Nil, command_info))
                .collect(),
        ),
        Some("LIST") => Reply::Array(
            table
                .iter()
                .map(|c| Reply::bulk(c.name.to_ascii_lowercase()))
                .collect(),
        ),
        Some(other) => Reply::err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            other.to_ascii_lowercase()
        )),
    }
}

fn config_cmd(a: &[Vec<u8>]) -> Reply {
    const KNOWN: &[(&str, &str)] = &[
        ("save", ""),
        ("appendonly", "no"),
        ("databases", "1"),
        ("maxmemory", "0"),
        ("maxmemory-policy", "noeviction"),
        ("timeout", "0"),
    ];
    match upper(&a[0]).as_str() {
        "GET" => {
            let mut out = Vec::new();
            for pat in &a[1..] {
                for (k, v) in KNOWN {
                    if fenced_core::kv::glob_match(&pat.to_ascii_lowercase(), k.as_bytes()) {
                        out.push((Reply::bulk(k), Reply::bulk(v)));
                    }
                }
            }
            Reply::Map(out)
        }
        "RESETSTAT" => Reply::ok(),
        _ => Reply::err("ERR CONFIG SET/REWRITE are not supported by fenced (configure with command-line flags)"),
    }
}
