//! The public gRPC API, `fenced.v1`: one file per service ([`lock`], [`session`], [`kv`],
//! [`cluster`], [`auth`]), each a thin translation between protobuf messages and [`Node`]
//! calls. Every handler first asks [`Users`] whether its caller may do it:
//! `self.users.permit(&req, "LOCK.ACQUIRE", &names)` for calls on locks and keys,
//! `self.users.require_admin(&req, "Cluster.MemberAdd")` for administrative ones.
//!
//! [`etcd`] serves etcd's v3 API (`etcdserverpb`) on the same port.

mod auth;
mod cluster;
pub mod etcd;
mod kv;
mod limiter;
mod lock;
mod session;

use fenced_core::{RequestId, Response};
use std::sync::Arc;

use fenced_proto::v1 as pb;
use fenced_proto::v1::auth_server::AuthServer;
use fenced_proto::v1::cluster_server::ClusterServer;
use fenced_proto::v1::kv_server::KvServer;
use fenced_proto::v1::limiter_server::LimiterServer;
use fenced_proto::v1::lock_server::LockServer;
use fenced_proto::v1::session_server::SessionServer;
use tonic::Status;

use crate::error::NodeError;
use crate::node::Node;
use crate::users::Users;
use fenced_resp::acl::User;

/// Largest client API message (requests are small; this bounds a malicious one).
const MAX_CLIENT_MESSAGE: usize = 1024 * 1024;

pub(crate) type Reply<T> = Result<tonic::Response<T>, Status>;

pub fn lock_server(node: Node, users: Arc<Users>) -> LockServer<Api> {
    LockServer::new(Api { node, users }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn session_server(node: Node, users: Arc<Users>) -> SessionServer<Api> {
    SessionServer::new(Api { node, users }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn kv_server(node: Node, users: Arc<Users>) -> KvServer<Api> {
    KvServer::new(Api { node, users }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn limiter_server(node: Node, users: Arc<Users>) -> LimiterServer<Api> {
    LimiterServer::new(Api { node, users }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub fn cluster_server(node: Node, users: Arc<Users>) -> ClusterServer<Api> {
    ClusterServer::new(Api { node, users })
}

pub fn auth_server(node: Node, users: Arc<Users>) -> AuthServer<Api> {
    AuthServer::new(Api { node, users }).max_decoding_message_size(MAX_CLIENT_MESSAGE)
}

pub struct Api {
    node: Node,
    /// Who calls, and what they may do ([`Users::permit`], [`Users::require_admin`]).
    users: Arc<Users>,
}

/// A call's lock names as the keys of [`Users::permit`]: `names` if given, else `name`.
fn lock_keys<'a>(name: &'a str, names: &'a [String]) -> Vec<&'a [u8]> {
    if names.is_empty() {
        vec![name.as_bytes()]
    } else {
        names.iter().map(|n| n.as_bytes()).collect()
    }
}

/// The request id of a call; calls without one get a random one-off id (drawn through
/// [`fenced_raft_types::rng`]), so that retries inside the cluster are still deduplicated.
///
/// A client's id is namespaced by the caller's user ([`User::request_id`]), so a client of
/// another user sending the same `client_id` neither reads nor replays its stored answers.
fn request_id(user: &User, id: Option<pb::RequestId>) -> Result<RequestId, Status> {
    match id {
        Some(pb::RequestId { client_id, seq }) if client_id != 0 && seq != 0 => {
            Ok(user.request_id(client_id, seq))
        }
        Some(_) => Err(Status::invalid_argument(
            "request id needs a nonzero client_id and seq",
        )),
        None => Ok(RequestId {
            client_id: fenced_raft_types::rng::nonzero_u64(),
            seq: 1,
        }),
    }
}

fn unexpected(r: Response) -> Status {
    match r {
        Response::Rejected(e) => NodeError::Rejected(e).into(),
        other => Status::internal(format!("unexpected state machine response {other:?}")),
    }
}

fn opt_session(s: u64) -> Option<u64> {
    (s != 0).then_some(s)
}

impl Api {
    /// A reply to a client call, with the leader's address in `x-fenced-leader` when this node
    /// is a follower, so that clients can go to the leader and skip the forwarding hop.
    fn reply<T>(&self, msg: T) -> tonic::Response<T> {
        let mut r = tonic::Response::new(msg);
        if let Some(addr) = self.node.leader_hint().and_then(|a| a.parse().ok()) {
            r.metadata_mut().insert(crate::error::LEADER_HINT, addr);
        }
        r
    }

    /// Lease left until `deadline_ms`, for the answer to a proposal this node just made.
    fn remaining(&self, deadline_ms: u64) -> u64 {
        deadline_ms.saturating_sub(self.node.log_time())
    }

    fn granted(
        &self,
        token: u64,
        holds: u32,
        deadline_ms: Option<u64>,
        session: Option<u64>,
    ) -> pb::AcquireResponse {
        let deadline = deadline_ms.or_else(|| {
            session.and_then(|s| {
                self.node
                    .local(|sm| sm.session_info(s, sm.now()).map(|i| i.deadline_ms))
            })
        });
        pb::AcquireResponse {
            granted: true,
            token,
            holds,
            deadline_ms: deadline_ms.unwrap_or(0),
            ttl_ms: deadline.map_or(0, |d| self.remaining(d)),
        }
    }
}
