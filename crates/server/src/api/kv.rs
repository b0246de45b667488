//! `fenced.v1.Kv`: fenced writes (`FencedPut`, the typed face of `FENCE.SET`) and reads.

use fenced_core::kv::Reply as KvReply;
use fenced_core::{Command, Response};
use fenced_proto::v1 as pb;
use tonic::{Request, Status};

use fenced_proto::v1::kv_server::Kv;

use super::{request_id, unexpected, Api, Reply};

#[tonic::async_trait]
impl Kv for Api {
    async fn fenced_put(&self, req: Request<pb::FencedPutRequest>) -> Reply<pb::FencedPutResponse> {
        let user = self
            .users
            .permit(&req, "FENCE.SET", &[req.get_ref().key.as_bytes()])?;
        let r = req.into_inner();
        let rid = request_id(&user, r.request)?;
        let cmd = Command::FencedPut {
            key: r.key.into_bytes(),
            value: r.value,
            token: r.token,
        };
        let (accepted, highest) = match self.node.propose(Some(rid), cmd).await? {
            Response::Fenced { accepted, highest } => (accepted, highest),
            other => return Err(unexpected(other)),
        };
        Ok(self.reply(pb::FencedPutResponse { accepted, highest }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        self.users
            .permit(&req, "GET", &[req.get_ref().key.as_bytes()])?;
        let key = req.into_inner().key.into_bytes();
        // Expiry is judged at a log time committed at or after the leader's clock at the read.
        let (value, fence) = self
            .node
            .read_timed(|sm, now| {
                let argv = [b"GET".to_vec(), key.clone()];
                (sm.kv().read(now, &argv), sm.kv().fence(&key))
            })
            .await?;
        let out = match value {
            Some(KvReply::Bulk(v)) => pb::GetResponse {
                found: true,
                value: v,
                fence,
            },
            Some(KvReply::Error(e)) => return Err(Status::failed_precondition(e)),
            _ => pb::GetResponse {
                fence,
                ..Default::default()
            },
        };
        Ok(self.reply(out))
    }
}
