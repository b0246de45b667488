//! `etcdserverpb.KV`: `Range`, `Put`, `DeleteRange`, `Txn`, `Compact` (module docs of
//! [`super`] for headers, writes, reads and errors).

use fenced_core::etcd::{self as core, OP_OVERHEAD};
use fenced_core::{Command, EtcdCommand, EtcdReply, Response, StateMachine};
use fenced_proto::etcd::etcdserverpb as epb;
use tonic::{Request, Status};

use epb::kv_server::Kv;

use super::convert::{self, range_request, txn_request};
use super::perm::{permit_range, permit_txn};
use super::{etcd_status, not_etcd, rev_in, status_of, EtcdApi, Reply};

#[tonic::async_trait]
impl Kv for EtcdApi {
    async fn range(&self, req: Request<epb::RangeRequest>) -> Reply<epb::RangeResponse> {
        let user = self.users.caller(&req)?;
        let r = req.into_inner();
        let serializable = r.serializable;
        let range = range_request(r)?;
        permit_range(&user, "GET", &range.range)?;
        let (revision, out) = self
            .read(serializable, move |sm| {
                (sm.revision(), sm.etcd_range(&range))
            })
            .await?;
        let out = out.map_err(|e| etcd_status(&e))?;
        Ok(tonic::Response::new(convert::range_response(
            out,
            self.header(revision),
        )))
    }

    async fn put(&self, req: Request<epb::PutRequest>) -> Reply<epb::PutResponse> {
        let user = self.users.caller(&req)?;
        let r = convert::put_request(req.into_inner());
        user.permit("SET", &[&r.key])
            .map_err(crate::users::denied)?;
        // Refused before it reaches the log (the keyspace would refuse it too, at a revision).
        if r.key.is_empty() {
            return Err(etcd_status(&core::EtcdError::EmptyKey));
        }
        too_large(r.key.len() + r.value.len() + OP_OVERHEAD)?;
        let (revision, reply) = self.write(EtcdCommand::Put(r)).await?;
        match reply {
            EtcdReply::Put(p) => Ok(tonic::Response::new(convert::put_response(
                p,
                self.header(revision),
            ))),
            other => Err(unexpected(other)),
        }
    }

    async fn delete_range(
        &self,
        req: Request<epb::DeleteRangeRequest>,
    ) -> Reply<epb::DeleteRangeResponse> {
        let user = self.users.caller(&req)?;
        let r = convert::delete_request(req.into_inner());
        permit_range(&user, "DEL", &r.range)?;
        if r.range.key.is_empty() {
            return Err(etcd_status(&core::EtcdError::EmptyKey));
        }
        let (revision, reply) = self.write(EtcdCommand::DeleteRange(r)).await?;
        match reply {
            EtcdReply::DeleteRange(d) => Ok(tonic::Response::new(convert::delete_response(
                d,
                self.header(revision),
            ))),
            other => Err(unexpected(other)),
        }
    }

    async fn txn(&self, req: Request<epb::TxnRequest>) -> Reply<epb::TxnResponse> {
        let user = self.users.caller(&req)?;
        let r = req.into_inner();
        let serializable = convert::txn_serializable(&r);
        let txn = txn_request(r)?;
        permit_txn(&user, &txn)?;
        if txn.is_read_only() {
            let (revision, out) = self
                .read(serializable, move |sm| {
                    (sm.revision(), sm.etcd_txn_read_only(&txn))
                })
                .await?;
            let out = out.map_err(|e| etcd_status(&e))?;
            return Ok(tonic::Response::new(convert::txn_response(
                out,
                self.header(revision),
            )));
        }
        too_large(txn.size())?;
        let (revision, reply) = self.write(EtcdCommand::Txn(txn)).await?;
        match reply {
            EtcdReply::Txn(t) => Ok(tonic::Response::new(convert::txn_response(
                t,
                self.header(revision),
            ))),
            other => Err(unexpected(other)),
        }
    }

    /// `physical` is ignored: the compact revision moves when the command applies (reads
    /// below it fail from then on) and the history goes in bounded steps with the next
    /// commands, on every replica.
    async fn compact(
        &self,
        req: Request<epb::CompactionRequest>,
    ) -> Reply<epb::CompactionResponse> {
        self.users.require_admin(&req, "KV.Compact")?;
        let revision = rev_in(req.into_inner().revision);
        let (at, reply) = self.write(EtcdCommand::Compact { revision }).await?;
        match reply {
            EtcdReply::Compact(_) => Ok(tonic::Response::new(epb::CompactionResponse {
                header: self.header(at),
            })),
            other => Err(unexpected(other)),
        }
    }
}

impl EtcdApi {
    /// A read: linearizable (the read barrier, then an O(1) clone of the state) or, when
    /// `serializable`, on a clone of this node's state as it is.
    async fn read<T: Send>(
        &self,
        serializable: bool,
        f: impl FnOnce(&StateMachine) -> T + Send,
    ) -> Result<T, Status> {
        if serializable {
            self.node.serving().map_err(status_of)?;
            let sm = self.node.local(StateMachine::clone);
            return Ok(f(&sm));
        }
        self.node.read_clone(f).await.map_err(status_of)
    }

    /// Propose an etcd command (through the leader, without a request id: module docs):
    /// its revision and reply, or etcd's error.
    async fn write(&self, cmd: EtcdCommand) -> Result<(u64, EtcdReply), Status> {
        match self
            .node
            .propose(None, Command::Etcd(cmd))
            .await
            .map_err(status_of)?
        {
            Response::Etcd {
                revision, reply, ..
            } => Ok((revision, reply)),
            other => Err(not_etcd(other)),
        }
    }
}

/// etcd's "request is too large" before anything is proposed.
fn too_large(size: usize) -> Result<(), Status> {
    if size > core::MAX_REQUEST_BYTES {
        return Err(etcd_status(&core::EtcdError::RequestTooLarge {
            size,
            max: core::MAX_REQUEST_BYTES,
        }));
    }
    Ok(())
}

fn unexpected(r: EtcdReply) -> Status {
    Status::internal(format!("unexpected etcd reply {r:?}"))
}
