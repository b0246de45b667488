//! etcd's v3 gRPC API (`etcdserverpb`) on fenced's gRPC port, over the etcd keyspace of the
//! state machine ([`fenced_core::etcd`]): `etcdctl --endpoints=<any node's gRPC address>` and
//! etcd client libraries work unchanged. One file per service: [`kv`] (`KV`), [`maintenance`]
//! (`Maintenance.Status`/`Alarm`), [`cluster`] (`Cluster.MemberList`), [`auth`]
//! (`Auth.Authenticate`), [`watch`] (`Watch`), [`lease`] (`Lease`: a lease is a fenced
//! session), [`lock`] (`v3lockpb.Lock`) and [`election`] (`v3electionpb.Election`) on
//! fenced's lock table; [`convert`] translates messages, [`perm`] asks fenced's users.
//!
//! * **Headers.** Every answer's `header` is [`EtcdApi::header`]: `cluster_id` = fenced's
//!   persisted cluster id, `member_id` = this node's id, `raft_term` = its current term,
//!   `revision` = the store revision the answer is at (a write's own revision; a read's state
//!   revision). fenced's store revision counts every applied command (locks, expiry ticks…),
//!   so etcd revisions are increasing but not contiguous (`fenced_core::etcd`'s docs).
//! * **Writes** (`Put`, `DeleteRange`, a `Txn` that may write, `Compact`) go through the log
//!   like every command, from any node: a follower forwards them to the leader
//!   ([`Node::propose`]), which checks the apply-rules gate first ([`Node::admit`]). etcd
//!   clients send no request id, so they are proposed **without a dedup record**: a write
//!   retried after its reply was lost (a leader crash) may apply twice — as in etcd. fenced
//!   itself retries such a write only when it certainly had no effect; otherwise the client
//!   gets `UNAVAILABLE` "outcome unknown".
//! * **Reads** (`Range`, a read-only `Txn`) take the read barrier (etcd keys do not expire by
//!   time, so no committed-time tick) and run on an O(1) clone of the state
//!   ([`Node::read_clone`]), never holding the state lock during a large range.
//!   `serializable` reads skip the barrier: this node's state as it is, possibly stale.
//! * **Errors** are etcd's codes and texts ([`status_of`]), which clients match.
//! * **Users.** With users (`--acl-file`/`--requirepass`), etcd clients log in with
//!   `Auth.Authenticate` and send the token as the `token` metadata, which
//!   [`Users::caller`] accepts as well as fenced's `authorization: Bearer`. Each call is
//!   checked against fenced's key patterns as the command it stands for (docs/operations.md).

mod auth;
mod cluster;
mod convert;
mod election;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod perm;
mod queue;
mod watch;

use std::sync::Arc;

use fenced_core::etcd::EtcdError;
use fenced_core::{CoreError, Response};
use fenced_proto::etcd::etcdserverpb as epb;
use tonic::{Code, Status};

use crate::error::NodeError;
use crate::node::Node;
use crate::users::Users;

/// Largest etcd request message: etcd's `--max-request-bytes` (1.5 MiB, checked again on the
/// request's contents by the keyspace) plus its gRPC overhead allowance (512 KiB).
pub const MAX_ETCD_MESSAGE: usize = fenced_core::etcd::MAX_REQUEST_BYTES + 512 * 1024;

/// The version `Maintenance.Status` reports: the etcd API level served, with fenced's version
/// as semver build metadata.
pub const VERSION: &str = concat!("3.5.0+fenced.", env!("CARGO_PKG_VERSION"));

pub(crate) type Reply<T> = Result<tonic::Response<T>, Status>;

/// The etcd services' handler.
#[derive(Clone)]
pub struct EtcdApi {
    node: Node,
    users: Arc<Users>,
    /// Whether clients reach this port with TLS (the scheme of the member URLs).
    tls: bool,
    /// The `LeaseKeepAlive` coalescer (`lease`), shared by the clones of one service.
    keep_alives: lease::SharedKeepAlives,
    /// Request ids of `Lock` and `Campaign` calls, shared by the clones of one service.
    lock_ids: Arc<lock::LockIds>,
}

impl EtcdApi {
    fn new(node: Node, users: Arc<Users>, tls: bool) -> EtcdApi {
        let keep_alives = Arc::new(lease::KeepAlives::new(node.clone()));
        EtcdApi {
            node,
            users,
            tls,
            keep_alives,
            lock_ids: Arc::new(lock::LockIds::new()),
        }
    }
}

pub fn lease_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> epb::lease_server::LeaseServer<EtcdApi> {
    epb::lease_server::LeaseServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn lock_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> fenced_proto::etcd::v3lockpb::lock_server::LockServer<EtcdApi> {
    fenced_proto::etcd::v3lockpb::lock_server::LockServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn election_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> fenced_proto::etcd::v3electionpb::election_server::ElectionServer<EtcdApi> {
    fenced_proto::etcd::v3electionpb::election_server::ElectionServer::new(EtcdApi::new(
        node, users, tls,
    ))
    .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn kv_server(node: Node, users: Arc<Users>, tls: bool) -> epb::kv_server::KvServer<EtcdApi> {
    epb::kv_server::KvServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn maintenance_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> epb::maintenance_server::MaintenanceServer<EtcdApi> {
    epb::maintenance_server::MaintenanceServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn cluster_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> epb::cluster_server::ClusterServer<EtcdApi> {
    epb::cluster_server::ClusterServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn watch_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> epb::watch_server::WatchServer<EtcdApi> {
    epb::watch_server::WatchServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

pub fn auth_server(
    node: Node,
    users: Arc<Users>,
    tls: bool,
) -> epb::auth_server::AuthServer<EtcdApi> {
    epb::auth_server::AuthServer::new(EtcdApi::new(node, users, tls))
        .max_decoding_message_size(MAX_ETCD_MESSAGE)
}

impl EtcdApi {
    /// The header of an answer at store revision `revision`.
    fn header(&self, revision: u64) -> Option<epb::ResponseHeader> {
        Some(epb::ResponseHeader {
            cluster_id: self.node.gate().identity().cluster_id(),
            member_id: self.node.id(),
            revision: rev_out(revision),
            raft_term: self.node.raft().metrics().borrow().current_term,
        })
    }

    /// The header at this node's current (local) state revision.
    fn header_now(&self) -> Option<epb::ResponseHeader> {
        self.header(self.node.local(|sm| sm.revision()))
    }
}

/// A store revision as etcd's `int64`.
fn rev_out(r: u64) -> i64 {
    i64::try_from(r).unwrap_or(i64::MAX)
}

/// An etcd `int64` revision, limit or filter as fenced's: 0 and below = none (etcd treats a
/// revision or limit at or below 0 as "current" / "no limit").
fn rev_in(r: i64) -> u64 {
    u64::try_from(r).unwrap_or(0)
}

/// etcd's gRPC status for a keyspace refusal (etcd's `rpctypes`: code and exact text, which
/// clients compare).
pub fn etcd_status(e: &EtcdError) -> Status {
    let (code, msg): (Code, String) = match e {
        EtcdError::Compacted { .. } => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted".into(),
        ),
        EtcdError::FutureRevision { .. } => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision".into(),
        ),
        EtcdError::LeaseNotFound { .. } => (Code::NotFound, e.to_string()),
        // etcd's ErrGRPCLeaseTTLTooLarge.
        EtcdError::LeaseTtlTooLarge => (Code::OutOfRange, e.to_string()),
        EtcdError::LeaseIdChosen { .. } => (Code::InvalidArgument, e.to_string()),
        EtcdError::EmptyKey
        | EtcdError::KeyNotFound
        | EtcdError::ValueProvided
        | EtcdError::LeaseProvided
        | EtcdError::TooManyOps { .. }
        | EtcdError::TxnTooDeep { .. }
        | EtcdError::DuplicateKey
        | EtcdError::RequestTooLarge { .. } => (Code::InvalidArgument, e.to_string()),
        EtcdError::RangeTooLarge { .. } => (Code::ResourceExhausted, e.to_string()),
        EtcdError::RevisionNotIncreasing { .. } => (Code::Internal, e.to_string()),
        // etcd's ErrGRPCNoSpace.
        EtcdError::NoSpace => (Code::ResourceExhausted, e.to_string()),
        // etcd's ErrGRPCLeaseExist.
        EtcdError::LeaseExists { .. } => (Code::FailedPrecondition, e.to_string()),
    };
    Status::new(code, msg)
}

/// A node error as an etcd client expects it: a keyspace refusal by etcd's table, "no
/// leader" as etcd's `Unavailable` text when no leader is known, the cluster's `CORRUPT`
/// alarm as etcd's corrupt-cluster error (`rpctypes.ErrGRPCCorrupt`: `DataLoss`, with
/// `x-fenced-alarm: corrupt`; a member's own divergence alarm stays `UNAVAILABLE`, so that
/// clients try another member), the rest by fenced's one table ([`NodeError`]'s
/// `Into<Status>`).
fn status_of(e: NodeError) -> Status {
    match e {
        NodeError::Rejected(CoreError::Etcd(e)) => etcd_status(&e),
        NodeError::NotLeader { leader: None } => Status::unavailable("etcdserver: no leader"),
        e if e.cluster_corrupt() => {
            let mut s = Status::data_loss("etcdserver: corrupt cluster");
            s.metadata_mut().insert(
                crate::error::ALARM_HEADER,
                tonic::metadata::MetadataValue::from_static("corrupt"),
            );
            s
        }
        other => other.into(),
    }
}

/// The answer of a proposal that is not an etcd answer: a refusal, or a bug.
fn not_etcd(r: Response) -> Status {
    match r {
        Response::Rejected(e) => status_of(NodeError::Rejected(e)),
        other => Status::internal(format!("unexpected state machine response {other:?}")),
    }
}

/// A call fenced does not serve (yet), with why and what to use instead.
fn unimplemented(call: &str, instead: &str) -> Status {
    Status::unimplemented(format!("fenced does not serve etcd's {call}: {instead}"))
}
