//! `etcdserverpb.Cluster`: `MemberList` (what `etcdctl member list` shows); membership
//! changes go through `fenced member …`, which keeps fenced's own checks (ids, incarnations,
//! learners caught up before promotion).

use fenced_proto::etcd::etcdserverpb as epb;
use tonic::{Request, Status};

use epb::cluster_server::Cluster;

use super::{EtcdApi, Reply};
use crate::membership::members;

/// The refusal of an etcd membership change.
fn use_fenced_member(call: &str, instead: &str) -> Status {
    Status::unimplemented(format!(
        "fenced does not change membership through etcd's Cluster.{call}: use `{instead}` \
         (docs/operations.md, \"Replace a node\")"
    ))
}

#[tonic::async_trait]
impl Cluster for EtcdApi {
    async fn member_add(
        &self,
        _req: Request<epb::MemberAddRequest>,
    ) -> Reply<epb::MemberAddResponse> {
        Err(use_fenced_member(
            "MemberAdd",
            "fenced member add ID HOST:PORT --learner",
        ))
    }

    async fn member_remove(
        &self,
        _req: Request<epb::MemberRemoveRequest>,
    ) -> Reply<epb::MemberRemoveResponse> {
        Err(use_fenced_member("MemberRemove", "fenced member remove ID"))
    }

    async fn member_update(
        &self,
        _req: Request<epb::MemberUpdateRequest>,
    ) -> Reply<epb::MemberUpdateResponse> {
        Err(use_fenced_member(
            "MemberUpdate",
            "fenced member remove ID, then fenced member add ID NEW-ADDR",
        ))
    }

    async fn member_promote(
        &self,
        _req: Request<epb::MemberPromoteRequest>,
    ) -> Reply<epb::MemberPromoteResponse> {
        Err(use_fenced_member(
            "MemberPromote",
            "fenced member promote ID",
        ))
    }

    /// The members as this node's membership config has them (`linearizable` is not waited
    /// for). Each member's one address serves clients and Raft alike, so `clientURLs` and
    /// `peerURLs` are the same URL (`https://` with `--tls-*`); `name` is `fenced-<id>`.
    /// Open to every caller, like `Maintenance.Status`.
    async fn member_list(
        &self,
        _req: Request<epb::MemberListRequest>,
    ) -> Reply<epb::MemberListResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let scheme = if self.tls { "https" } else { "http" };
        let members = members(&m)
            .into_iter()
            .map(|v| {
                let url = format!("{scheme}://{}", v.addr);
                epb::Member {
                    id: v.id,
                    name: format!("fenced-{}", v.id),
                    peer_ur_ls: vec![url.clone()],
                    client_ur_ls: vec![url],
                    is_learner: !v.voter,
                }
            })
            .collect();
        Ok(tonic::Response::new(epb::MemberListResponse {
            // etcd's cluster answers carry no revision (its cluster server's header has
            // only the cluster and member ids and the term).
            header: self.header(0),
            members,
        }))
    }
}
