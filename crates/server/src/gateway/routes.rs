//! The gateway's route table: every etcd v3 RPC at the path etcd 3.5's grpc-gateway serves it
//! (the `google.api.http` annotations of etcd's `rpc.proto`, `v3lock.proto` and
//! `v3election.proto`, which the vendored copies had stripped), under `/v3` and `/v3beta`.
//! `/v3alpha` is not served (etcd 3.5 answers it 404). Checked against a running etcd 3.5.1:
//! each of these paths answers `405` to a `GET` there and `/v3/maintenance/hashkv` is not a
//! path (etcd's `HashKV` has no route of its own; `/v3/maintenance/hash` is `Hash`).

/// The prefixes every route is served under.
pub const PREFIXES: [&str; 2] = ["/v3", "/v3beta"];

/// One route: the path after the prefix, and the gRPC service and method it calls.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub path: &'static str,
    pub service: &'static str,
    pub method: &'static str,
}

const fn r(path: &'static str, service: &'static str, method: &'static str) -> Route {
    Route {
        path,
        service,
        method,
    }
}

const KV: &str = "etcdserverpb.KV";
const WATCH: &str = "etcdserverpb.Watch";
const LEASE: &str = "etcdserverpb.Lease";
const CLUSTER: &str = "etcdserverpb.Cluster";
const MAINTENANCE: &str = "etcdserverpb.Maintenance";
const AUTH: &str = "etcdserverpb.Auth";
const LOCK: &str = "v3lockpb.Lock";
const ELECTION: &str = "v3electionpb.Election";

/// Every route, as etcd 3.5 has them (additional bindings included).
pub const ROUTES: &[Route] = &[
    r("/kv/range", KV, "Range"),
    r("/kv/put", KV, "Put"),
    r("/kv/deleterange", KV, "DeleteRange"),
    r("/kv/txn", KV, "Txn"),
    r("/kv/compaction", KV, "Compact"),
    r("/watch", WATCH, "Watch"),
    r("/lease/grant", LEASE, "LeaseGrant"),
    r("/lease/revoke", LEASE, "LeaseRevoke"),
    r("/kv/lease/revoke", LEASE, "LeaseRevoke"),
    r("/lease/keepalive", LEASE, "LeaseKeepAlive"),
    r("/lease/timetolive", LEASE, "LeaseTimeToLive"),
    r("/kv/lease/timetolive", LEASE, "LeaseTimeToLive"),
    r("/lease/leases", LEASE, "LeaseLeases"),
    r("/kv/lease/leases", LEASE, "LeaseLeases"),
    r("/cluster/member/add", CLUSTER, "MemberAdd"),
    r("/cluster/member/remove", CLUSTER, "MemberRemove"),
    r("/cluster/member/update", CLUSTER, "MemberUpdate"),
    r("/cluster/member/list", CLUSTER, "MemberList"),
    r("/cluster/member/promote", CLUSTER, "MemberPromote"),
    r("/maintenance/alarm", MAINTENANCE, "Alarm"),
    r("/maintenance/status", MAINTENANCE, "Status"),
    r("/maintenance/defragment", MAINTENANCE, "Defragment"),
    r("/maintenance/hash", MAINTENANCE, "Hash"),
    r("/maintenance/snapshot", MAINTENANCE, "Snapshot"),
    r(
        "/maintenance/transfer-leadership",
        MAINTENANCE,
        "MoveLeader",
    ),
    r("/maintenance/downgrade", MAINTENANCE, "Downgrade"),
    r("/auth/enable", AUTH, "AuthEnable"),
    r("/auth/disable", AUTH, "AuthDisable"),
    r("/auth/status", AUTH, "AuthStatus"),
    r("/auth/authenticate", AUTH, "Authenticate"),
    r("/auth/user/add", AUTH, "UserAdd"),
    r("/auth/user/get", AUTH, "UserGet"),
    r("/auth/user/list", AUTH, "UserList"),
    r("/auth/user/delete", AUTH, "UserDelete"),
    r("/auth/user/changepw", AUTH, "UserChangePassword"),
    r("/auth/user/grant", AUTH, "UserGrantRole"),
    r("/auth/user/revoke", AUTH, "UserRevokeRole"),
    r("/auth/role/add", AUTH, "RoleAdd"),
    r("/auth/role/get", AUTH, "RoleGet"),
    r("/auth/role/list", AUTH, "RoleList"),
    r("/auth/role/delete", AUTH, "RoleDelete"),
    r("/auth/role/grant", AUTH, "RoleGrantPermission"),
    r("/auth/role/revoke", AUTH, "RoleRevokePermission"),
    r("/lock/lock", LOCK, "Lock"),
    r("/lock/unlock", LOCK, "Unlock"),
    r("/election/campaign", ELECTION, "Campaign"),
    r("/election/proclaim", ELECTION, "Proclaim"),
    r("/election/leader", ELECTION, "Leader"),
    r("/election/observe", ELECTION, "Observe"),
    r("/election/resign", ELECTION, "Resign"),
];
