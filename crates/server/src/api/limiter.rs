//! `fenced.v1.Limiter`: the rate limiters of RESP's `CL.THROTTLE` / `LIMIT.*`, typed
//! ([`Command::Limit`] → [`Response::Limited`]). `Acquire` and `Reset` are replicated writes
//! decided with log time (a retry with the same request id gets the first decision); `Peek` is
//! a linearizable read judged at a log time committed at or after the leader's clock at the
//! read (`Node::read_timed`).

use fenced_core::{Command, Decision, LimitMode, LogPolicy, Policy, Response};
use fenced_proto::v1 as pb;
use tonic::{Request, Status};

use fenced_proto::v1::limiter_server::Limiter;

use super::{request_id, unexpected, Api, Reply};

/// The policy of a request; a missing one is a clear `INVALID_ARGUMENT`.
fn policy(p: Option<pb::LimitPolicy>) -> Result<Policy, Status> {
    use pb::limit_policy::Kind;
    let kind = p
        .and_then(|p| p.kind)
        .ok_or_else(|| Status::invalid_argument("a limit request needs a policy"))?;
    Ok(match kind {
        Kind::Gcra(g) => Policy::gcra(g.max_burst, g.count, g.period_ms),
        Kind::TokenBucket(b) => {
            Policy::token_bucket(b.capacity, b.refill_tokens, b.refill_period_ms)
        }
        Kind::LeakyBucket(b) => Policy::leaky_bucket(b.capacity, b.leak_tokens, b.leak_period_ms),
        Kind::FixedWindow(w) => Policy::fixed_window(w.limit, w.window_ms),
        Kind::SlidingWindow(w) => Policy::sliding_window(w.limit, w.window_ms),
        Kind::SlidingLog(l) => Policy::SlidingLog {
            policies: l
                .policies
                .into_iter()
                .map(|w| LogPolicy {
                    window_ms: w.window_ms,
                    limit: w.limit,
                })
                .collect(),
        },
    })
}

fn to_pb(d: Decision) -> pb::LimitDecision {
    pb::LimitDecision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        retry_after_ms: d
            .retry_after_ms
            .map_or(-1, |ms| ms.min(i64::MAX as u64) as i64),
        reset_after_ms: d.reset_after_ms,
        violated: d.violated.map_or(-1, |v| v.min(i32::MAX as u32) as i32),
    }
}

impl Api {
    /// A replicated limiter request (`Check` or `Reset`).
    async fn limit(
        &self,
        req: Request<pb::LimitRequest>,
        mode: LimitMode,
    ) -> Reply<pb::LimitDecision> {
        let p = policy(req.get_ref().policy.clone())?;
        let command = if mode == LimitMode::Reset {
            "LIMIT.RESET"
        } else {
            p.command()
        };
        let user = self
            .users
            .permit(&req, command, &[req.get_ref().key.as_bytes()])?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        let cmd = Command::Limit {
            key: r.key.into_bytes(),
            policy: p,
            quantity: r.quantity.max(1),
            mode,
        };
        match self.node.propose(Some(rid), cmd).await? {
            Response::Limited(d) => Ok(self.reply(to_pb(d))),
            other => Err(unexpected(other)),
        }
    }
}

#[tonic::async_trait]
impl Limiter for Api {
    async fn acquire(&self, req: Request<pb::LimitRequest>) -> Reply<pb::LimitDecision> {
        self.limit(req, LimitMode::Check).await
    }

    async fn reset(&self, req: Request<pb::LimitRequest>) -> Reply<pb::LimitDecision> {
        self.limit(req, LimitMode::Reset).await
    }

    async fn peek(&self, req: Request<pb::LimitRequest>) -> Reply<pb::LimitDecision> {
        let p = policy(req.get_ref().policy.clone())?;
        self.users
            .permit(&req, p.command(), &[req.get_ref().key.as_bytes()])?;
        let r = req.into_inner();
        let key = r.key.into_bytes();
        let decision = self
            .node
            .read_timed(|sm, now| sm.kv().limit_peek(now, &key, &p, r.quantity.max(1)))
            .await?;
        match decision {
            Ok(d) => Ok(self.reply(to_pb(d))),
            Err(e) => {
                Err(crate::error::NodeError::Rejected(fenced_core::CoreError::Limit(e)).into())
            }
        }
    }
}
