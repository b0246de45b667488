//! The lock family (`LOCK.*`, `SESSION.*`; docs/resp.md, "The lock family"): their
//! arguments, the lock-table commands they become, and how the answers render.
//!
//! A lock-family write that does not wait is a [`Parsed::Write`] with `wait_ms` 0; a run of
//! them in a pipeline is proposed together by [`Connection::process`], in order, each with
//! its own request id. A waiting acquire, the two `INFO`s and `SESSION.CLOSE` (which checks
//! the session's locks against a restricted user first) are served one at a time by
//! [`Connection::lock_cmd`].

use fenced_core::kv::{Argv, Reply};
use fenced_core::{
    AcquireSpec, Command, CoreError, LockKind, Mode, RequestId, Response, StateMachine,
};

use super::{backend_error, parse_u64, text, upper, Connection};
use crate::BackendError;

/// How a lock-family answer renders (which command it answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// An acquire: the token, or nil.
    Token,
    /// `LOCK.RELEASE`, `LOCK.MRELEASE`, `LOCK.FORCEUNLOCK`: 1, or 0 if not held.
    Released,
    /// `LOCK.RENEW`: 1, or 0 if not held with that token.
    Renewed,
    /// `SESSION.OPEN`: the session id.
    Opened,
    /// `SESSION.KEEPALIVE`: the lease left, or nil if the session is gone.
    Alive,
    /// `SESSION.CLOSE`: 1, or 0 if it did not exist.
    Closed,
}

/// A lock-family command, parsed.
pub(super) enum Parsed {
    /// A command through the log. `reqid` is the client's own `REQID`, if given.
    Write {
        cmd: Command,
        wait_ms: u64,
        shape: Shape,
        reqid: Option<(u64, u64)>,
    },
    /// `LOCK.INFO name`.
    LockInfo(String),
    /// `SESSION.INFO id`.
    SessionInfo(u64),
}

impl Parsed {
    /// A write that does not wait and needs no look first: it may join a pipelined run.
    pub(super) fn batchable(&self) -> bool {
        matches!(self, Parsed::Write { wait_ms: 0, shape, .. } if *shape != Shape::Closed)
    }
}

/// The options after an acquire's positional arguments (or only `REQID` for the others).
#[derive(Default)]
struct Options {
    wait_ms: u64,
    session: Option<u64>,
    delay_ms: u64,
    reqid: Option<(u64, u64)>,
}

fn syntax() -> Reply {
    Reply::err("ERR syntax error")
}

/// Parse `[WAIT ms] [SESSION id] [DELAY ms] [REQID client seq]` (each at most once; only
/// `REQID` unless `acquire`).
fn options(mut rest: &[Vec<u8>], acquire: bool) -> Result<Options, Reply> {
    let mut o = Options::default();
    let mut seen = Vec::new();
    while let Some(word) = rest.first() {
        let word = upper(word);
        if seen.contains(&word) {
            return Err(Reply::err(format!("ERR {word} given twice")));
        }
        match (word.as_str(), rest) {
            ("WAIT", [_, ms, ..]) if acquire => o.wait_ms = parse_u64(ms)?,
            ("DELAY", [_, ms, ..]) if acquire => o.delay_ms = parse_u64(ms)?,
            ("SESSION", [_, id, ..]) if acquire => {
                let id = parse_u64(id)?;
                if id == 0 {
                    return Err(Reply::err("ERR session id must be nonzero"));
                }
                o.session = Some(id);
            }
            ("REQID", [_, client, seq, ..]) => {
                let (client, seq) = (parse_u64(client)?, parse_u64(seq)?);
                if client == 0 || seq == 0 {
                    return Err(Reply::err(
                        "ERR REQID needs a nonzero client id and a nonzero seq",
                    ));
                }
                o.reqid = Some((client, seq));
                rest = &rest[1..];
            }
            _ => return Err(syntax()),
        }
        seen.push(word);
        rest = &rest[2..];
    }
    Ok(o)
}

/// `numnames name…` followed by options: the names and what follows them.
fn counted_names(a: &[Vec<u8>]) -> Result<(Vec<String>, &[Vec<u8>]), Reply> {
    let n = parse_u64(&a[0])? as usize;
    if n == 0 || n > a.len() - 1 {
        return Err(Reply::err(
            "ERR numnames must be at least 1 and at most the number of names given",
        ));
    }
    let names = a[1..=n].iter().map(|x| text(x)).collect::<Result<_, _>>()?;
    Ok((names, &a[n + 1..]))
}

/// An acquire of `names` in `mode`: the plain [`Command::Acquire`] when it is one, else
/// [`Command::AcquireWith`] (what gRPC's `Lock.Acquire` does).
fn acquire(names: Vec<String>, owner: String, mode: Mode, ttl_ms: u64, o: &Options) -> Command {
    if mode == Mode::Exclusive && names.len() == 1 && o.delay_ms == 0 {
        let name = names.into_iter().next().unwrap_or_default();
        Command::Acquire {
            name,
            owner,
            ttl_ms,
            session: o.session,
            wait_ms: o.wait_ms,
        }
    } else {
        Command::AcquireWith(Box::new(AcquireSpec {
            names,
            owner,
            mode,
            ttl_ms,
            session: o.session,
            wait_ms: o.wait_ms,
            lock_delay_ms: o.delay_ms,
        }))
    }
}

/// `argv` as a lock-family command, if it is one (`Err`: bad arguments, and this is the
/// reply). Arity was checked by the command table.
pub(super) fn parse(argv: &Argv) -> Option<Result<Parsed, Reply>> {
    let name = upper(&argv[0]);
    let a = &argv[1..];
    let write = |cmd, o: Options, shape| Parsed::Write {
        cmd,
        wait_ms: o.wait_ms,
        shape,
        reqid: o.reqid,
    };
    let parsed = || -> Result<Option<Parsed>, Reply> {
        Ok(Some(match name.as_str() {
            "LOCK.ACQUIRE" | "LOCK.READ" | "LOCK.WRITE" => {
                let mode = match name.as_str() {
                    "LOCK.READ" => Mode::Read,
                    "LOCK.WRITE" => Mode::Write,
                    _ => Mode::Exclusive,
                };
                let (lock, owner, ttl) = (text(&a[0])?, text(&a[1])?, parse_u64(&a[2])?);
                let o = options(&a[3..], true)?;
                write(acquire(vec![lock], owner, mode, ttl, &o), o, Shape::Token)
            }
            "LOCK.PERMIT" => {
                let (lock, owner) = (text(&a[0])?, text(&a[1])?);
                let permits = u32::try_from(parse_u64(&a[2])?)
                    .map_err(|_| Reply::err("ERR permits must be in 1..=65536"))?;
                let ttl = parse_u64(&a[3])?;
                let o = options(&a[4..], true)?;
                let mode = Mode::Permit { permits };
                write(acquire(vec![lock], owner, mode, ttl, &o), o, Shape::Token)
            }
            "LOCK.MACQUIRE" => {
                let (owner, ttl) = (text(&a[0])?, parse_u64(&a[1])?);
                let (names, rest) = counted_names(&a[2..])?;
                let o = options(rest, true)?;
                let cmd = acquire(names, owner, Mode::Exclusive, ttl, &o);
                write(cmd, o, Shape::Token)
            }
            "LOCK.RELEASE" => {
                let (lock, owner, token) = (text(&a[0])?, text(&a[1])?, parse_u64(&a[2])?);
                let o = options(&a[3..], false)?;
                let cmd = Command::Release {
                    name: lock,
                    owner,
                    token,
                };
                write(cmd, o, Shape::Released)
            }
            "LOCK.MRELEASE" => {
                let (owner, token) = (text(&a[0])?, parse_u64(&a[1])?);
                let (names, rest) = counted_names(&a[2..])?;
                let o = options(rest, false)?;
                let cmd = Command::ReleaseAll {
                    names,
                    owner,
                    token,
                };
                write(cmd, o, Shape::Released)
            }
            "LOCK.RENEW" => {
                let (lock, owner) = (text(&a[0])?, text(&a[1])?);
                let (token, ttl_ms) = (parse_u64(&a[2])?, parse_u64(&a[3])?);
                let o = options(&a[4..], false)?;
                let cmd = Command::Renew {
                    name: lock,
                    owner,
                    token,
                    ttl_ms,
                };
                write(cmd, o, Shape::Renewed)
            }
            "LOCK.FORCEUNLOCK" => {
                let lock = text(&a[0])?;
                let o = options(&a[1..], false)?;
                write(Command::ForceUnlock { name: lock }, o, Shape::Released)
            }
            "SESSION.OPEN" => {
                let ttl_ms = parse_u64(&a[0])?;
                let o = options(&a[1..], false)?;
                write(Command::OpenSession { ttl_ms }, o, Shape::Opened)
            }
            "SESSION.KEEPALIVE" | "SESSION.CLOSE" => {
                let session = parse_u64(&a[0])?;
                let o = options(&a[1..], false)?;
                if name == "SESSION.CLOSE" {
                    write(Command::CloseSession { session }, o, Shape::Closed)
                } else {
                    write(Command::KeepAlive { session }, o, Shape::Alive)
                }
            }
            "LOCK.INFO" => Parsed::LockInfo(text(&a[0])?),
            "SESSION.INFO" => Parsed::SessionInfo(parse_u64(&a[0])?),
            _ => return Ok(None),
        }))
    };
    parsed().transpose()
}

/// The reply to a lock-family write: `r` rendered as `shape` says. `log_time` is the node's
/// log time (a keep-alive's lease left is its deadline minus it).
pub(super) fn render(shape: Shape, r: Result<Response, BackendError>, log_time: u64) -> Reply {
    let r = match r {
        Ok(r) => r,
        Err(e) => return backend_error(e),
    };
    match (shape, r) {
        (Shape::Token, Response::Granted { token, .. }) => Reply::Int(token as i64),
        (Shape::Token, Response::NotGranted) => Reply::Nil,
        (Shape::Token, Response::Pending) => backend_error(BackendError::Unknown(
            "the wait's outcome could not be learnt in time".into(),
        )),
        (Shape::Released, Response::Released { .. })
        | (Shape::Renewed, Response::Renewed { .. }) => Reply::Int(1),
        (Shape::Released | Shape::Renewed, Response::NotHeld) => Reply::Int(0),
        (Shape::Opened, Response::SessionOpened { session, .. }) => Reply::Int(session as i64),
        (Shape::Alive, Response::SessionAlive { deadline_ms }) => {
            Reply::Int(deadline_ms.saturating_sub(log_time) as i64)
        }
        (Shape::Alive, Response::NoSuchSession) => Reply::Nil,
        (Shape::Closed, Response::SessionClosed) => Reply::Int(1),
        (Shape::Closed, Response::NoSuchSession) => Reply::Int(0),
        (_, Response::Rejected(e @ CoreError::NotSessionOwner { .. })) => {
            Reply::err(format!("NOPERM {e}"))
        }
        (_, Response::Rejected(e)) => Reply::err(format!("ERR {e}")),
        (_, other) => Reply::err(format!("ERR internal: unexpected answer {other:?}")),
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Exclusive => "exclusive",
        Mode::Read => "read",
        Mode::Write => "write",
        Mode::Permit { .. } => "permit",
    }
}

/// `LOCK.INFO name` on `sm` at log time `now`.
pub(super) fn lock_info(sm: &StateMachine, now: u64, name: &str) -> Reply {
    let Some(i) = sm.lock_info(name) else {
        return Reply::NilArray;
    };
    let (kind, permits) = match i.kind {
        LockKind::Exclusive => ("exclusive", 0),
        LockKind::ReadWrite => ("read-write", 0),
        LockKind::Semaphore { permits } => ("semaphore", permits),
    };
    let int = |n: u64| Reply::Int(i64::try_from(n).unwrap_or(i64::MAX));
    let holders = i
        .holders
        .iter()
        .map(|h| {
            Reply::Map(vec![
                (Reply::bulk("owner"), Reply::bulk(h.owner.as_str())),
                (Reply::bulk("token"), int(h.token)),
                (Reply::bulk("holds"), int(h.holds.into())),
                (
                    Reply::bulk("ttl_ms"),
                    int(h.deadline_ms.saturating_sub(now)),
                ),
                (Reply::bulk("session"), int(h.session.unwrap_or(0))),
                (Reply::bulk("mode"), Reply::bulk(mode_name(h.mode))),
            ])
        })
        .collect();
    Reply::Map(vec![
        (Reply::bulk("owner"), Reply::bulk(i.owner.as_str())),
        (Reply::bulk("token"), int(i.token)),
        (Reply::bulk("holds"), int(i.holds.into())),
        (
            Reply::bulk("ttl_ms"),
            int(i.deadline_ms.saturating_sub(now)),
        ),
        (Reply::bulk("session"), int(i.session.unwrap_or(0))),
        (Reply::bulk("kind"), Reply::bulk(kind)),
        (Reply::bulk("permits"), int(permits.into())),
        (Reply::bulk("waiters"), int(i.waiters as u64)),
        (Reply::bulk("holders"), Reply::Array(holders)),
    ])
}

/// `SESSION.INFO id` on `sm` at log time `now`.
pub(super) fn session_info(sm: &StateMachine, now: u64, id: u64) -> Reply {
    let Some(s) = sm.session_info(id, now) else {
        return Reply::NilArray;
    };
    Reply::Map(vec![
        (Reply::bulk("session"), Reply::Int(s.id as i64)),
        (
            Reply::bulk("ttl_ms"),
            Reply::Int(s.deadline_ms.saturating_sub(now) as i64),
        ),
        (
            Reply::bulk("locks"),
            Reply::Array(s.locks.iter().map(|l| Reply::bulk(l.as_str())).collect()),
        ),
    ])
}

impl Connection {
    /// The request id a lock-family write goes under: the client's own `REQID`, namespaced
    /// by the user ([`crate::acl::User::request_id`]), else the connection's next one.
    pub(super) fn lock_rid(&mut self, reqid: Option<(u64, u64)>) -> RequestId {
        match (reqid, &self.st.user) {
            (Some((client, seq)), Some(user)) => user.request_id(client, seq),
            _ => self.st.next_rid(),
        }
    }

    /// `cmd` as this connection's user sends it ([`Command::as_user`]): a session it opens
    /// belongs to the user, and another user's session is refused to it.
    pub(super) fn as_user(&self, cmd: Command) -> Command {
        match &self.st.user {
            Some(user) => cmd.as_user(user.name(), user.is_admin()),
            None => cmd,
        }
    }

    /// A lock-family command served alone: a waiting acquire, `LOCK.INFO`, `SESSION.INFO`,
    /// `SESSION.CLOSE`, or one that does not wait (runs of those come through
    /// [`Connection::process`]).
    pub(super) async fn lock_cmd(&mut self, argv: &Argv) -> Reply {
        let backend = self.shared.backend.clone();
        let parsed = match parse(argv) {
            Some(Ok(p)) => p,
            Some(Err(e)) => return e,
            None => return Reply::err("ERR internal: not a lock command"),
        };
        match parsed {
            Parsed::LockInfo(name) => read_one(
                &*backend,
                Box::new(move |sm, now| vec![lock_info(sm, now, &name)]),
            )
            .await
            .unwrap_or_else(backend_error),
            Parsed::SessionInfo(id) => {
                let user = self.st.user.clone();
                read_one(
                    &*backend,
                    Box::new(move |sm, now| {
                        let other = user.as_ref().is_some_and(|u| {
                            !u.is_admin() && sm.session_owner(id).is_some_and(|o| o != u.name())
                        });
                        if other {
                            return vec![Reply::err(format!(
                                "NOPERM {}",
                                fenced_core::CoreError::NotSessionOwner { session: id }
                            ))];
                        }
                        vec![session_info(sm, now, id)]
                    }),
                )
            }
            .await
            .unwrap_or_else(backend_error),
            Parsed::Write {
                cmd,
                wait_ms,
                shape,
                reqid,
            } => {
                if let Command::CloseSession { session } = &cmd {
                    let user = self.st.user.clone();
                    if let Err(e) = may_close(&*backend, user, *session).await {
                        return e;
                    }
                }
                let cmd = self.as_user(cmd);
                let own_id = reqid.is_none() || self.st.user.is_none();
                let rid = self.lock_rid(reqid);
                let r = if wait_ms > 0 {
                    let wait = backend.lock_wait(rid, cmd, wait_ms, own_id);
                    match self.unless_gone(wait).await {
                        Some(r) => r,
                        // The client left mid-wait: the dropped wait is withdrawn.
                        None => {
                            self.st.closing = true;
                            return Reply::NilArray;
                        }
                    }
                } else {
                    let mut out = backend.lock_batch(vec![(rid, cmd)]).await;
                    out.pop()
                        .unwrap_or_else(|| Err(BackendError::Rejected("internal: no reply".into())))
                };
                // Only a keep-alive's answer counts from the node's log time.
                let now = if shape == Shape::Alive {
                    backend.log_time()
                } else {
                    0
                };
                render(shape, r, now)
            }
        }
    }
}

/// A user restricted by key patterns closes a session only if it may `LOCK.RELEASE`
/// every lock the session holds and `DEL` every etcd key attached to it as a lease (as of a
/// linearizable read), as over gRPC (etcd's rule for revoking a lease).
async fn may_close(
    backend: &dyn crate::Backend,
    user: Option<std::sync::Arc<crate::acl::User>>,
    session: u64,
) -> Result<(), Reply> {
    let Some(user) = user else {
        return Ok(());
    };
    if user.all_keys() {
        return Ok(());
    }
    let read = backend
        .read(Box::new(move |sm, now| {
            let names = sm
                .session_info(session, now)
                .map_or(Vec::new(), |i| i.locks);
            vec![
                Reply::Array(names.into_iter().map(Reply::bulk).collect()),
                Reply::Array(
                    sm.lease_keys(session)
                        .into_iter()
                        .map(Reply::bulk)
                        .collect(),
                ),
            ]
        }))
        .await
        .map_err(backend_error)?;
    let bytes = |r: Option<&Reply>| -> Vec<Vec<u8>> {
        match r {
            Some(Reply::Array(items)) => items
                .iter()
                .filter_map(|n| match n {
                    Reply::Bulk(b) => Some(b.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    let (locks, keys) = (bytes(read.first()), bytes(read.get(1)));
    let locks: Vec<&[u8]> = locks.iter().map(Vec::as_slice).collect();
    user.permit("LOCK.RELEASE", &locks)
        .map_err(|e| Reply::Error(e.resp_text()))?;
    if keys.is_empty() {
        // A lock-only user (no `DEL`) closes a session without keys.
        return Ok(());
    }
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    user.permit("DEL", &keys)
        .map_err(|e| Reply::Error(e.resp_text()))
}

/// One linearizable read (judged at a committed log time) that answers one reply.
async fn read_one(backend: &dyn crate::Backend, f: crate::ReadFn) -> Result<Reply, BackendError> {
    let mut r = backend.read(f).await?;
    r.pop()
        .ok_or_else(|| BackendError::Rejected("internal: no reply".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Argv {
        s.split(' ').map(|w| w.as_bytes().to_vec()).collect()
    }

    fn write(s: &str) -> (Command, u64, Shape, Option<(u64, u64)>) {
        match parse(&argv(s)) {
            Some(Ok(Parsed::Write {
                cmd,
                wait_ms,
                shape,
                reqid,
            })) => (cmd, wait_ms, shape, reqid),
            Some(Err(e)) => panic!("{s}: {e:?}"),
            _ => panic!("{s}: not a write"),
        }
    }

    fn err(s: &str) -> String {
        match parse(&argv(s)) {
            Some(Err(Reply::Error(e))) => e,
            _ => panic!("{s}: parsed"),
        }
    }

    #[test]
    fn acquire_forms_become_the_lock_tables_commands() {
        let (cmd, wait, shape, reqid) = write("LOCK.ACQUIRE job alice 100 WAIT 50 REQID 7 3");
        assert_eq!(
            cmd,
            Command::Acquire {
                name: "job".into(),
                owner: "alice".into(),
                ttl_ms: 100,
                session: None,
                wait_ms: 50
            }
        );
        assert_eq!((wait, shape, reqid), (50, Shape::Token, Some((7, 3))));
        let spec = |c: Command| match c {
            Command::AcquireWith(s) => *s,
            other => panic!("{other:?}"),
        };
        let s = spec(write("lock.read job r 100 session 9 delay 20").0);
        assert_eq!(
            (s.mode, s.session, s.lock_delay_ms),
            (Mode::Read, Some(9), 20)
        );
        assert_eq!(spec(write("LOCK.WRITE job w 100").0).mode, Mode::Write);
        let s = spec(write("LOCK.PERMIT pool p 3 100").0);
        assert_eq!(
            (s.mode, s.names),
            (Mode::Permit { permits: 3 }, vec!["pool".into()])
        );
        let s = spec(write("LOCK.MACQUIRE o 100 2 a b WAIT 5").0);
        assert_eq!((s.names, s.wait_ms), (vec!["a".into(), "b".into()], 5));
        // An exclusive acquire with a lock-delay needs the general form.
        assert_eq!(
            spec(write("LOCK.ACQUIRE job a 100 DELAY 5").0).lock_delay_ms,
            5
        );
    }

    #[test]
    fn the_other_writes_take_only_reqid() {
        assert_eq!(write("LOCK.RELEASE job a 5").2, Shape::Released);
        assert_eq!(
            write("LOCK.MRELEASE a 5 2 x y REQID 1 2").0,
            Command::ReleaseAll {
                names: vec!["x".into(), "y".into()],
                owner: "a".into(),
                token: 5
            }
        );
        assert_eq!(write("LOCK.RENEW job a 5 100").2, Shape::Renewed);
        assert_eq!(write("LOCK.FORCEUNLOCK job").2, Shape::Released);
        assert_eq!(write("SESSION.OPEN 1000").2, Shape::Opened);
        assert_eq!(write("SESSION.KEEPALIVE 4").2, Shape::Alive);
        assert_eq!(write("SESSION.CLOSE 4").2, Shape::Closed);
        assert!(err("LOCK.RELEASE job a 5 WAIT 10").contains("syntax"));
        assert!(!parse(&argv("SESSION.CLOSE 4")).is_some_and(|p| p.is_ok_and(|p| p.batchable())));
        assert!(
            parse(&argv("LOCK.RELEASE job a 5")).is_some_and(|p| p.is_ok_and(|p| p.batchable()))
        );
        assert!(!parse(&argv("LOCK.ACQUIRE job a 5 WAIT 1"))
            .is_some_and(|p| p.is_ok_and(|p| p.batchable())));
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        assert!(err("LOCK.ACQUIRE job a x").contains("not an integer"));
        assert!(err("LOCK.ACQUIRE job a 1 WAIT 1 WAIT 2").contains("WAIT given twice"));
        assert!(err("LOCK.ACQUIRE job a 1 SESSION 0").contains("nonzero"));
        assert!(err("LOCK.ACQUIRE job a 1 REQID 0 1").contains("nonzero"));
        assert!(err("LOCK.ACQUIRE job a 1 REQID 1").contains("syntax"));
        assert!(err("LOCK.ACQUIRE job a 1 BOGUS 1").contains("syntax"));
        assert!(err("LOCK.MACQUIRE o 100 3 a b").contains("numnames"));
        assert!(err("LOCK.MACQUIRE o 100 0 a").contains("numnames"));
        assert!(err("LOCK.PERMIT p o 99999999999 100").contains("permits"));
    }
}
