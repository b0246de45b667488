//! `etcdserverpb.KV`: `Range`, `Put`, `DeleteRange`, `Txn`, `Compact` (module docs of
//! [`super`] for headers, writes, reads and errors).

use fenced_core::etcd::{self as core, OP_OVERHEAD};
use fenced_core::{Command, EtcdCommand, EtcdReply, Response, StateMachine};
use fenced_proto::etcd::etcdserverpb as epb;
use fenced_resp::acl::User;
use tonic::{Request, Status};

use epb::kv_server::Kv;

use super::convert::{self, range_request, txn_request};
use super::perm::{permit_delete, permit_put, permit_range, permit_txn};
use super::{etcd_status, not_etcd, rev_in, status_of, EtcdApi, Reply};

#[tonic::async_trait]
impl Kv for EtcdApi {
    async fn range(&self, req: Request<epb::RangeRequest>) -> Reply<epb::RangeResponse> {
        let user = self.users.caller(&req)?;
        let r = req.into_inner();
        let serializable = r.serializable;
        let range = range_request(r)?;
        permit_range(&user, "GET", &range.range)?;
        let scan = !range.range.range_end.is_empty();
        let (revision, out) = self
            .read(serializable, scan, move |sm| {
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
        permit_put(&user, &r)?;
        // Refused before it reaches the log (the keyspace would refuse it too, at a revision).
        if r.key.is_empty() {
            return Err(etcd_status(&core::EtcdError::EmptyKey));
        }
        too_large(r.key.len() + r.value.len() + OP_OVERHEAD)?;
        let (revision, reply) = self.write_as(&user, EtcdCommand::Put(r)).await?;
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
        permit_delete(&user, &r)?;
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
            let scan = scans(&txn);
            let (revision, out) = self
                .read(serializable, scan, move |sm| {
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
        let (revision, reply) = self.write_as(&user, EtcdCommand::Txn(txn)).await?;
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
    /// `serializable`, on a clone of this node's state as it is. A read of a range (`scan`:
    /// up to the whole keyspace, ~200 ms for 100 k keys) runs on a blocking thread, so that
    /// it never stalls the runtime's workers (Raft heartbeats among them); a point read runs
    /// in place.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        serializable: bool,
        scan: bool,
        f: impl FnOnce(&StateMachine) -> T + Send + 'static,
    ) -> Result<T, Status> {
        let sm = if serializable {
            self.node.serving().map_err(status_of)?;
            self.node.local(StateMachine::clone)
        } else {
            self.node
                .read_clone(StateMachine::clone)
                .await
                .map_err(status_of)?
        };
        if !scan {
            return Ok(f(&sm));
        }
        tokio::task::spawn_blocking(move || f(&sm))
            .await
            .map_err(|e| Status::internal(format!("the range read failed: {e}")))
    }

    /// Propose an etcd command (through the leader, without a request id: module docs):
    /// its revision and reply, or etcd's error.
    pub(super) async fn write(&self, cmd: EtcdCommand) -> Result<(u64, EtcdReply), Status> {
        self.propose_write(Command::Etcd(cmd)).await
    }

    /// [`write`](Self::write) as `user` sends it: a lease it names must be the user's own
    /// ([`Command::as_user`]).
    pub(super) async fn write_as(
        &self,
        user: &User,
        cmd: EtcdCommand,
    ) -> Result<(u64, EtcdReply), Status> {
        self.propose_write(Command::Etcd(cmd).as_user(user.name(), user.is_admin()))
            .await
    }

    async fn propose_write(&self, cmd: Command) -> Result<(u64, EtcdReply), Status> {
        match self.node.propose(None, cmd).await.map_err(status_of)? {
            Response::Etcd {
                revision, reply, ..
            } => Ok((revision, reply)),
            other => Err(not_etcd(other)),
        }
    }
}

/// Whether a txn reads a range of keys anywhere (its compares included).
fn scans(txn: &core::TxnRequest) -> bool {
    txn.compare.iter().any(|c| !c.range.range_end.is_empty())
        || txn.success.iter().chain(&txn.failure).any(|op| match op {
            core::RequestOp::Range(r) => !r.range.range_end.is_empty(),
            core::RequestOp::Txn(t) => scans(t),
            core::RequestOp::Put(_) | core::RequestOp::DeleteRange(_) => false,
        })
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
