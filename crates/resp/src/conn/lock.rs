//! The native lock commands (`LOCK.*`): their arguments, replies, and the ones served one at
//! a time (a waiting `LOCK.ACQUIRE`, `LOCK.INFO`); runs of those that do not wait are
//! proposed together by [`Connection::process`].

use fenced_core::kv::{Argv, Reply};

use super::{backend_error, parse_u64, text, upper, Connection};
use crate::{BackendError, LockOp, LockOpReply};
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
pub(super) fn lock_op(argv: &Argv) -> Option<Result<LockOp, Reply>> {
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

pub(super) fn lock_reply(r: Result<LockOpReply, BackendError>) -> Reply {
    match r {
        Ok(LockOpReply::Acquired(t)) => t.map_or(Reply::Nil, |t| Reply::Int(t as i64)),
        Ok(LockOpReply::Done(ok)) => Reply::Int(ok as i64),
        Err(e) => backend_error(e),
    }
}

impl Connection {
    /// `LOCK.*` one at a time: a waiting `LOCK.ACQUIRE` and `LOCK.INFO` (the others come in
    /// runs through [`Connection::process`]).
    pub(super) async fn lock_cmd(&mut self, name: &str, a: &[Vec<u8>]) -> Result<Reply, Reply> {
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
}
