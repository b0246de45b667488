//! `fenced.v1.Lock`: acquire (with wait), release, renew, info, force-unlock.

use fenced_core::{AcquireSpec, Command, LockKind, Mode, Response};
use fenced_proto::v1 as pb;
use tonic::{Request, Status};

use fenced_proto::v1::lock_server::Lock;

use super::{lock_keys, opt_session, request_id, unexpected, Api, Reply};

#[tonic::async_trait]
impl Lock for Api {
    async fn acquire(&self, req: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let m = req.get_ref();
        let user = self
            .users
            .permit(&req, "LOCK.ACQUIRE", &lock_keys(&m.name, &m.names))?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        let session = opt_session(r.session);
        let mode = match pb::LockMode::try_from(r.mode) {
            Ok(pb::LockMode::Exclusive) => Mode::Exclusive,
            Ok(pb::LockMode::Read) => Mode::Read,
            Ok(pb::LockMode::Write) => Mode::Write,
            Ok(pb::LockMode::Permit) => Mode::Permit { permits: r.permits },
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown lock mode {}",
                    r.mode
                )))
            }
        };
        let cmd = if mode == Mode::Exclusive && r.names.is_empty() && r.lock_delay_ms == 0 {
            Command::Acquire {
                name: r.name,
                owner: r.owner,
                ttl_ms: r.ttl_ms,
                session,
                wait_ms: r.wait_ms,
            }
        } else {
            Command::AcquireWith(Box::new(AcquireSpec {
                names: if r.names.is_empty() {
                    vec![r.name]
                } else {
                    r.names
                },
                owner: r.owner,
                mode,
                ttl_ms: r.ttl_ms,
                session,
                wait_ms: r.wait_ms,
                lock_delay_ms: r.lock_delay_ms,
            }))
        };
        let cmd = cmd.as_user(user.name(), user.is_admin());
        let not_granted = pb::AcquireResponse::default();
        let resolved = self.node.acquire(rid, cmd, r.wait_ms, false).await?;
        let out = match resolved {
            Response::Granted {
                token,
                holds,
                deadline_ms,
            } => self.granted(token, holds, deadline_ms, session),
            Response::NotGranted => not_granted,
            Response::Pending => return Err(Status::unavailable(
                "outcome unknown: the wait did not resolve in time; retry with the same request id",
            )),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let m = req.get_ref();
        let user = self
            .users
            .permit(&req, "LOCK.RELEASE", &lock_keys(&m.name, &m.names))?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        let cmd = if r.names.is_empty() {
            Command::Release {
                name: r.name,
                owner: r.owner,
                token: r.token,
            }
        } else {
            Command::ReleaseAll {
                names: r.names,
                owner: r.owner,
                token: r.token,
            }
        };
        let out = match self.node.propose(Some(rid), cmd).await? {
            Response::Released { holds } => pb::ReleaseResponse {
                released: true,
                holds,
            },
            Response::NotHeld => pb::ReleaseResponse::default(),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let user = self
            .users
            .permit(&req, "LOCK.RENEW", &[req.get_ref().name.as_bytes()])?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        let cmd = Command::Renew {
            name: r.name,
            owner: r.owner,
            token: r.token,
            ttl_ms: r.ttl_ms,
        };
        let out = match self.node.propose(Some(rid), cmd).await? {
            Response::Renewed { deadline_ms } => pb::RenewResponse {
                renewed: true,
                deadline_ms,
            },
            Response::NotHeld => pb::RenewResponse::default(),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(out))
    }

    async fn info(&self, req: Request<pb::InfoRequest>) -> Reply<pb::InfoResponse> {
        self.users
            .permit(&req, "LOCK.INFO", &[req.get_ref().name.as_bytes()])?;
        let name = req.into_inner().name;
        // The lease left counts from a log time committed at or after the leader's clock at
        // the read: never more than the leader would decide, and never given back later.
        let (info, waiters, now) = self
            .node
            .read_timed(|sm, now| (sm.lock_info(&name), sm.waiter_count(&name), now))
            .await?;
        let Some(i) = info else {
            return Ok(self.reply(pb::InfoResponse {
                waiters: waiters as u32,
                ..Default::default()
            }));
        };
        let (kind, permits) = match i.kind {
            LockKind::Exclusive => ("exclusive", 0),
            LockKind::ReadWrite => ("read-write", 0),
            LockKind::Semaphore { permits } => ("semaphore", permits),
        };
        let holders = i
            .holders
            .iter()
            .map(|h| pb::Holder {
                owner: h.owner.clone(),
                token: h.token,
                holds: h.holds,
                ttl_ms: h.deadline_ms.saturating_sub(now),
                session: h.session.unwrap_or(0),
                mode: proto_mode(h.mode) as i32,
            })
            .collect();
        Ok(self.reply(pb::InfoResponse {
            held: true,
            owner: i.owner,
            token: i.token,
            holds: i.holds,
            ttl_ms: i.deadline_ms.saturating_sub(now),
            session: i.session.unwrap_or(0),
            waiters: i.waiters as u32,
            kind: kind.into(),
            permits,
            holders,
        }))
    }

    async fn force_unlock(
        &self,
        req: Request<pb::ForceUnlockRequest>,
    ) -> Reply<pb::ForceUnlockResponse> {
        // An administrator's call, who may also release this lock (`LOCK.RELEASE` on it).
        let admin = self.users.require_admin(&req, "Lock.ForceUnlock")?;
        admin
            .permit("LOCK.RELEASE", &[req.get_ref().name.as_bytes()])
            .map_err(crate::users::denied)?;
        let r = req.into_inner();
        let rid = request_id(&admin, r.request)?;
        let released = match self
            .node
            .propose(Some(rid), Command::ForceUnlock { name: r.name })
            .await?
        {
            Response::Released { .. } => true,
            Response::NotHeld => false,
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(pb::ForceUnlockResponse { released }))
    }
}

pub(super) fn proto_mode(m: Mode) -> pb::LockMode {
    match m {
        Mode::Exclusive => pb::LockMode::Exclusive,
        Mode::Read => pb::LockMode::Read,
        Mode::Write => pb::LockMode::Write,
        Mode::Permit { .. } => pb::LockMode::Permit,
    }
}
