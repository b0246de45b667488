//! `fenced.v1.Session`: open, keep alive, close, and the watch stream of lock-loss events.
//!
//! Sessions belong to no user (the state machine does not record who opened one): every call
//! needs permission to take locks (`LOCK.ACQUIRE`); closing a session releases its locks, so
//! a key-restricted user may close only a session whose locks its patterns cover (etcd's rule
//! for revoking a lease), and its watch stream leaves out events of other locks.

use std::pin::Pin;
use std::time::Duration;

use fenced_core::{Command, Event, Response};
use fenced_proto::v1 as pb;
use tokio_stream::Stream;
use tonic::{Request, Status};

use fenced_proto::v1::session_server::Session;

use super::{request_id, unexpected, Api, Reply};

/// How often a lock-loss watch checks that its session still exists (it may end without an
/// event reaching this node, e.g. when the node catches up by snapshot, and its deadline may
/// pass on the leader's clock before any tick is applied).
const WATCH_CHECK: Duration = Duration::from_millis(500);

/// Session `session` is gone: on the applied state already (for good), or as of a
/// linearizable read judged at its own time (its deadline passed on the leader's clock).
/// `false` if the read fails or takes longer than [`WATCH_CHECK`]: nothing is reported then.
async fn session_gone(node: &crate::node::Node, session: u64) -> bool {
    if node.local(|sm| sm.session_info(session, sm.now()).is_none()) {
        return true;
    }
    let read = node.read_timed(|sm, now| sm.session_info(session, now).is_none());
    matches!(tokio::time::timeout(WATCH_CHECK, read).await, Ok(Ok(true)))
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Session for Api {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let session = req.into_inner().session;
        let node = self.node.clone();
        let mut released = node.hub().watch_released();
        // The session must exist now (linearizable), or the watch ends at once. Judged at
        // the read's time: a session whose deadline passed on the leader's clock is gone,
        // though no tick removed it yet.
        let (exists, owner) = node
            .read_timed(|sm, now| {
                (
                    sm.session_info(session, now).is_some(),
                    sm.session_owner(session).map(str::to_owned),
                )
            })
            .await?;
        if !user.is_admin() && owner.is_some_and(|o| o != user.name()) {
            return Err(Status::permission_denied(
                fenced_core::CoreError::NotSessionOwner { session }.to_string(),
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let gone = pb::SessionEvent {
                reason: "session_gone".into(),
                ..Default::default()
            };
            if !exists {
                let _ = tx.send(Ok(gone)).await;
                return;
            }
            let mut check = tokio::time::interval(WATCH_CHECK);
            loop {
                let event = tokio::select! {
                    e = released.recv() => e,
                    _ = check.tick() => {
                        if session_gone(&node, session).await {
                            let _ = tx.send(Ok(gone)).await;
                            return;
                        }
                        continue;
                    }
                    () = tx.closed() => return,
                };
                let msg = match event {
                    Ok(Event::LockReleased {
                        name,
                        owner,
                        session: Some(s),
                        token,
                        reason,
                    }) if s == session
                        && user.permit("LOCK.ACQUIRE", &[name.as_bytes()]).is_ok() =>
                    {
                        pb::SessionEvent {
                            name,
                            token,
                            owner,
                            reason: reason.name().into(),
                        }
                    }
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => pb::SessionEvent {
                        reason: "lagged".into(),
                        ..Default::default()
                    },
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        let stream: WatchStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(stream))
    }

    async fn open(&self, req: Request<pb::OpenSessionRequest>) -> Reply<pb::OpenSessionResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        match self
            .node
            .propose(
                Some(rid),
                Command::OpenSession { ttl_ms: r.ttl_ms }.as_user(user.name(), user.is_admin()),
            )
            .await?
        {
            Response::SessionOpened { session, .. } => Ok(self.reply(pb::OpenSessionResponse {
                session,
                ttl_ms: r.ttl_ms,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn keep_alive(&self, req: Request<pb::KeepAliveRequest>) -> Reply<pb::KeepAliveResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        match self
            .node
            .propose(
                Some(rid),
                Command::KeepAlive { session: r.session }.as_user(user.name(), user.is_admin()),
            )
            .await?
        {
            Response::SessionAlive { deadline_ms } => Ok(self.reply(pb::KeepAliveResponse {
                alive: true,
                ttl_ms: self.remaining(deadline_ms),
            })),
            Response::NoSuchSession => Ok(self.reply(pb::KeepAliveResponse::default())),
            other => Err(unexpected(other)),
        }
    }

    async fn close(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        let user = self.users.permit(&req, "LOCK.ACQUIRE", &[])?;
        let r = req.into_inner();
        if !user.all_keys() {
            // Its locks and the etcd keys attached to it as a lease, as of a linearizable
            // read (one taken meanwhile goes too): etcd's rule for revoking a lease.
            let (locks, attached) = self
                .node
                .read_timed(|sm, now| {
                    (
                        sm.session_info(r.session, now)
                            .map(|i| i.locks)
                            .unwrap_or_default(),
                        sm.lease_keys(r.session),
                    )
                })
                .await?;
            let keys: Vec<&[u8]> = locks.iter().map(|l| l.as_bytes()).collect();
            user.permit("LOCK.RELEASE", &keys)
                .map_err(crate::users::denied)?;
            // Only when there are some: a lock-only user (no `DEL`) closes a session
            // without keys.
            if !attached.is_empty() {
                let attached: Vec<&[u8]> = attached.iter().map(Vec::as_slice).collect();
                user.permit("DEL", &attached)
                    .map_err(crate::users::denied)?;
            }
        }
        let rid = request_id(&user, r.request)?;
        let closed = match self
            .node
            .propose(
                Some(rid),
                Command::CloseSession { session: r.session }.as_user(user.name(), user.is_admin()),
            )
            .await?
        {
            Response::SessionClosed => true,
            Response::NoSuchSession => false,
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(pb::CloseSessionResponse { closed }))
    }
}
