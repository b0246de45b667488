//! Requests of the public gRPC API by method and status code, with their latency: one tower
//! layer around the whole gRPC router ([`GrpcMetricsLayer`], added in `run.rs`), not code in
//! every handler.
//!
//! Only `fenced.v1` calls and etcd's (`etcdserverpb`, labelled `etcd.KV.Range` and so on) are
//! counted. The node-to-node services (`fenced.raft.v1.Raft`,
//! `fenced.raft.v1.Forward`) and `grpc.health.v1.Health` pass through untouched (one prefix
//! check); the transport has its own series (`fenced_peer_round_trip_seconds`).
//!
//! A call ends when its response body ends: the status is read from the trailers (or from
//! the headers of a trailers-only answer, which is how tonic sends errors). A call whose
//! response is dropped before it ends — the client went away — counts as `Canceled`. For the
//! two streaming methods (`Session.Watch`, `Cluster.SnapshotSave`) the duration is the
//! stream's lifetime.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tower_layer::Layer;
use tower_service::Service;

use super::{request_duration_histogram, DurationFamily, MethodCode, MethodLabel};
use prometheus_client::metrics::family::Family;

/// Only paths under this prefix are counted.
const CLIENT_API: &str = "/fenced.v1.";

/// Every method of the client API (`proto/fenced/v1/fenced.proto`): its path and its label.
/// A path under [`CLIENT_API`] that is not here counts as `unknown` (a unit test keeps the
/// list in step with the proto file).
pub const CLIENT_METHODS: &[(&str, &str)] = &[
    ("/fenced.v1.Lock/Acquire", "Lock.Acquire"),
    ("/fenced.v1.Lock/Release", "Lock.Release"),
    ("/fenced.v1.Lock/Renew", "Lock.Renew"),
    ("/fenced.v1.Lock/Info", "Lock.Info"),
    ("/fenced.v1.Lock/ForceUnlock", "Lock.ForceUnlock"),
    ("/fenced.v1.Session/Watch", "Session.Watch"),
    ("/fenced.v1.Session/Open", "Session.Open"),
    ("/fenced.v1.Session/KeepAlive", "Session.KeepAlive"),
    ("/fenced.v1.Session/Close", "Session.Close"),
    ("/fenced.v1.Cluster/Status", "Cluster.Status"),
    ("/fenced.v1.Cluster/MemberAdd", "Cluster.MemberAdd"),
    ("/fenced.v1.Cluster/MemberPromote", "Cluster.MemberPromote"),
    ("/fenced.v1.Cluster/MemberRemove", "Cluster.MemberRemove"),
    ("/fenced.v1.Cluster/SnapshotSave", "Cluster.SnapshotSave"),
    (
        "/fenced.v1.Cluster/LeaderStepDown",
        "Cluster.LeaderStepDown",
    ),
    ("/fenced.v1.Cluster/Alarm", "Cluster.Alarm"),
    ("/fenced.v1.Kv/FencedPut", "Kv.FencedPut"),
    ("/fenced.v1.Kv/Get", "Kv.Get"),
    ("/fenced.v1.Auth/Authenticate", "Auth.Authenticate"),
    ("/fenced.v1.Limiter/Acquire", "Limiter.Acquire"),
    ("/fenced.v1.Limiter/Peek", "Limiter.Peek"),
    ("/fenced.v1.Limiter/Reset", "Limiter.Reset"),
];

/// etcd's v3 API (`crates/server/src/api/etcd`): paths under this prefix are counted too.
const ETCD_API: &str = "/etcdserverpb.";

/// Every method of etcd's `etcdserverpb` services (`proto/etcd/api/etcdserverpb/rpc.proto`),
/// served or not (an unserved one counts as `Unimplemented`): its path and its label,
/// `etcd.` + service + method.
pub const ETCD_METHODS: &[(&str, &str)] = &[
    ("/etcdserverpb.KV/Range", "etcd.KV.Range"),
    ("/etcdserverpb.KV/Put", "etcd.KV.Put"),
    ("/etcdserverpb.KV/DeleteRange", "etcd.KV.DeleteRange"),
    ("/etcdserverpb.KV/Txn", "etcd.KV.Txn"),
    ("/etcdserverpb.KV/Compact", "etcd.KV.Compact"),
    ("/etcdserverpb.Watch/Watch", "etcd.Watch.Watch"),
    ("/etcdserverpb.Lease/LeaseGrant", "etcd.Lease.LeaseGrant"),
    ("/etcdserverpb.Lease/LeaseRevoke", "etcd.Lease.LeaseRevoke"),
    (
        "/etcdserverpb.Lease/LeaseKeepAlive",
        "etcd.Lease.LeaseKeepAlive",
    ),
    (
        "/etcdserverpb.Lease/LeaseTimeToLive",
        "etcd.Lease.LeaseTimeToLive",
    ),
    ("/etcdserverpb.Lease/LeaseLeases", "etcd.Lease.LeaseLeases"),
    ("/etcdserverpb.Cluster/MemberAdd", "etcd.Cluster.MemberAdd"),
    (
        "/etcdserverpb.Cluster/MemberRemove",
        "etcd.Cluster.MemberRemove",
    ),
    (
        "/etcdserverpb.Cluster/MemberUpdate",
        "etcd.Cluster.MemberUpdate",
    ),
    (
        "/etcdserverpb.Cluster/MemberList",
        "etcd.Cluster.MemberList",
    ),
    (
        "/etcdserverpb.Cluster/MemberPromote",
        "etcd.Cluster.MemberPromote",
    ),
    ("/etcdserverpb.Maintenance/Alarm", "etcd.Maintenance.Alarm"),
    (
        "/etcdserverpb.Maintenance/Status",
        "etcd.Maintenance.Status",
    ),
    (
        "/etcdserverpb.Maintenance/Defragment",
        "etcd.Maintenance.Defragment",
    ),
    ("/etcdserverpb.Maintenance/Hash", "etcd.Maintenance.Hash"),
    (
        "/etcdserverpb.Maintenance/HashKV",
        "etcd.Maintenance.HashKV",
    ),
    (
        "/etcdserverpb.Maintenance/Snapshot",
        "etcd.Maintenance.Snapshot",
    ),
    (
        "/etcdserverpb.Maintenance/MoveLeader",
        "etcd.Maintenance.MoveLeader",
    ),
    (
        "/etcdserverpb.Maintenance/Downgrade",
        "etcd.Maintenance.Downgrade",
    ),
    ("/etcdserverpb.Auth/AuthEnable", "etcd.Auth.AuthEnable"),
    ("/etcdserverpb.Auth/AuthDisable", "etcd.Auth.AuthDisable"),
    ("/etcdserverpb.Auth/AuthStatus", "etcd.Auth.AuthStatus"),
    ("/etcdserverpb.Auth/Authenticate", "etcd.Auth.Authenticate"),
    ("/etcdserverpb.Auth/UserAdd", "etcd.Auth.UserAdd"),
    ("/etcdserverpb.Auth/UserGet", "etcd.Auth.UserGet"),
    ("/etcdserverpb.Auth/UserList", "etcd.Auth.UserList"),
    ("/etcdserverpb.Auth/UserDelete", "etcd.Auth.UserDelete"),
    (
        "/etcdserverpb.Auth/UserChangePassword",
        "etcd.Auth.UserChangePassword",
    ),
    (
        "/etcdserverpb.Auth/UserGrantRole",
        "etcd.Auth.UserGrantRole",
    ),
    (
        "/etcdserverpb.Auth/UserRevokeRole",
        "etcd.Auth.UserRevokeRole",
    ),
    ("/etcdserverpb.Auth/RoleAdd", "etcd.Auth.RoleAdd"),
    ("/etcdserverpb.Auth/RoleGet", "etcd.Auth.RoleGet"),
    ("/etcdserverpb.Auth/RoleList", "etcd.Auth.RoleList"),
    ("/etcdserverpb.Auth/RoleDelete", "etcd.Auth.RoleDelete"),
    (
        "/etcdserverpb.Auth/RoleGrantPermission",
        "etcd.Auth.RoleGrantPermission",
    ),
    (
        "/etcdserverpb.Auth/RoleRevokePermission",
        "etcd.Auth.RoleRevokePermission",
    ),
    ("/v3lockpb.Lock/Lock", "etcd.Lock.Lock"),
    ("/v3lockpb.Lock/Unlock", "etcd.Lock.Unlock"),
    ("/v3electionpb.Election/Campaign", "etcd.Election.Campaign"),
    ("/v3electionpb.Election/Proclaim", "etcd.Election.Proclaim"),
    ("/v3electionpb.Election/Leader", "etcd.Election.Leader"),
    ("/v3electionpb.Election/Observe", "etcd.Election.Observe"),
    ("/v3electionpb.Election/Resign", "etcd.Election.Resign"),
];

/// The packages of etcd's lock and election services, whose methods follow
/// [`ETCD_API`]'s in [`ETCD_METHODS`].
const ETCD_LOCK_APIS: [&str; 2] = ["/v3lockpb.", "/v3electionpb."];

/// The `method` label of a path under [`CLIENT_API`] or [`ETCD_API`] that no method has.
const UNKNOWN: &str = "unknown";

/// gRPC status codes by number, named as Go's `codes.Code.String()` names them (the
/// `grpc_code` values of etcd's `grpc_server_handled_total`).
pub const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const CANCELED: usize = 1;
const UNKNOWN_CODE: usize = 2;

/// One method's series, resolved on first use (a method never called has none), then
/// reached without hashing a label set.
struct Slot {
    label: &'static str,
    duration: OnceLock<Histogram>,
    codes: [OnceLock<Counter>; 17],
}

/// The gRPC series and a handle per method.
pub struct GrpcStats {
    requests: Family<MethodCode, Counter>,
    durations: DurationFamily<MethodLabel>,
    by_path: HashMap<&'static str, usize>,
    /// One per [`CLIENT_METHODS`] entry, then per [`ETCD_METHODS`] entry, then `unknown`.
    slots: Vec<Slot>,
}

impl GrpcStats {
    pub(super) fn new() -> GrpcStats {
        let slot = |label| Slot {
            label,
            duration: OnceLock::new(),
            codes: Default::default(),
        };
        let methods = || CLIENT_METHODS.iter().chain(ETCD_METHODS);
        let mut slots: Vec<Slot> = methods().map(|(_, l)| slot(*l)).collect();
        slots.push(slot(UNKNOWN));
        GrpcStats {
            requests: Family::default(),
            durations: Family::new_with_constructor(request_duration_histogram),
            by_path: methods()
                .enumerate()
                .map(|(i, (path, _))| (*path, i))
                .collect(),
            slots,
        }
    }

    pub(super) fn requests(&self) -> Family<MethodCode, Counter> {
        self.requests.clone()
    }

    pub(super) fn durations(&self) -> DurationFamily<MethodLabel> {
        self.durations.clone()
    }

    /// The slot of a request path, `None` if it is not a client API call.
    fn slot_of(&self, path: &str) -> Option<usize> {
        let ours = path.starts_with(CLIENT_API)
            || path.starts_with(ETCD_API)
            || ETCD_LOCK_APIS.iter().any(|p| path.starts_with(p));
        if !ours {
            return None;
        }
        Some(
            self.by_path
                .get(path)
                .copied()
                .unwrap_or(self.slots.len() - 1),
        )
    }

    /// Count one finished call of `slot` with status `code` that took `seconds`.
    fn record(&self, slot: usize, code: usize, seconds: f64) {
        let s = &self.slots[slot];
        let code = code.min(CODE_NAMES.len() - 1);
        s.codes[code]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&MethodCode {
                        method: s.label,
                        code: CODE_NAMES[code],
                    })
                    .clone()
            })
            .inc();
        s.duration
            .get_or_init(|| {
                self.durations
                    .get_or_create(&MethodLabel { method: s.label })
                    .clone()
            })
            .observe(seconds);
    }
}

/// The status code in `grpc-status`, if the header is there (unparsable: `Unknown`).
fn status_in(headers: &HeaderMap) -> Option<usize> {
    headers.get("grpc-status").map(|v| {
        std::str::from_utf8(v.as_bytes())
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|c| *c < CODE_NAMES.len())
            .unwrap_or(UNKNOWN_CODE)
    })
}

/// One call being measured; counted exactly once: by [`Call::finish`], or as `Canceled` when
/// dropped unfinished.
struct Call {
    stats: Arc<GrpcStats>,
    slot: usize,
    since: Instant,
    done: bool,
}

impl Call {
    fn finish(&mut self, code: usize) {
        if !self.done {
            self.done = true;
            self.stats
                .record(self.slot, code, self.since.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(CANCELED);
    }
}

/// The tower layer that counts and times client API calls; see the module docs.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    stats: Arc<GrpcStats>,
}

impl GrpcMetricsLayer {
    pub fn new(stats: Arc<GrpcStats>) -> GrpcMetricsLayer {
        GrpcMetricsLayer { stats }
    }
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics {
            inner,
            stats: self.stats.clone(),
        }
    }
}

/// [`GrpcMetricsLayer`]'s service.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    stats: Arc<GrpcStats>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcMetrics<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let call = self.stats.slot_of(req.uri().path()).map(|slot| Call {
            stats: self.stats.clone(),
            slot,
            since: Instant::now(),
            done: false,
        });
        MeteredFuture {
            inner: self.inner.call(req),
            call,
        }
    }
}

pin_project! {
    /// The response future of [`GrpcMetrics`].
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, ResBody, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<MeteredBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(match result {
            Ok(response) => {
                // A trailers-only answer (an error status) ends the call here.
                if let (Some(code), Some(c)) = (status_in(response.headers()), call.as_mut()) {
                    c.finish(code);
                    call = None;
                }
                Ok(response.map(|inner| MeteredBody { inner, call }))
            }
            Err(e) => {
                if let Some(c) = call.as_mut() {
                    c.finish(UNKNOWN_CODE);
                }
                Err(e)
            }
        })
    }
}

pin_project! {
    /// A response body that ends its call's measurement at its trailers.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(call) = this.call.as_mut() {
            let code = match &frame {
                Some(Ok(f)) => f
                    .trailers_ref()
                    .map(|t| status_in(t).unwrap_or(UNKNOWN_CODE)),
                // A body that fails or ends without trailers did not finish as gRPC.
                Some(Err(_)) | None => Some(UNKNOWN_CODE),
            };
            if let Some(code) = code {
                call.finish(code);
                *this.call = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gRPC paths of every method of `proto` (package `package`), in order.
    fn methods_in(proto: &str, package: &str) -> Vec<String> {
        let mut service = "";
        let mut out = Vec::new();
        for line in proto.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.trim_end_matches('{').trim();
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let method = rest.split('(').next().unwrap_or("").trim();
                out.push(format!("/{package}.{service}/{method}"));
            }
        }
        out
    }

    #[test]
    fn every_client_api_method_of_the_proto_has_a_label() {
        let proto = include_str!("../../../../proto/fenced/v1/fenced.proto");
        let in_proto = methods_in(proto, "fenced.v1");
        let listed: Vec<String> = CLIENT_METHODS.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(in_proto, listed);
        for (path, label) in CLIENT_METHODS {
            assert_eq!(
                path.trim_start_matches(CLIENT_API).replace('/', "."),
                *label
            );
        }
    }

    #[test]
    fn every_etcd_method_of_the_proto_has_a_label() {
        let proto = include_str!("../../../../proto/etcd/api/etcdserverpb/rpc.proto");
        let mut in_proto = methods_in(proto, "etcdserverpb");
        in_proto.extend(methods_in(
            include_str!(
                "../../../../proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto"
            ),
            "v3lockpb",
        ));
        in_proto.extend(methods_in(
            include_str!(
                "../../../../proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto"
            ),
            "v3electionpb",
        ));
        let listed: Vec<String> = ETCD_METHODS.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(in_proto, listed);
        for (path, label) in ETCD_METHODS {
            let service_method = ETCD_LOCK_APIS
                .iter()
                .chain([&ETCD_API])
                .find_map(|p| path.strip_prefix(p))
                .unwrap_or(path);
            let want = format!("etcd.{}", service_method.replace('/', "."));
            assert_eq!(want, *label);
        }
        let stats = GrpcStats::new();
        assert_eq!(
            stats.slot_of("/etcdserverpb.KV/Range"),
            Some(CLIENT_METHODS.len())
        );
        assert_eq!(
            stats.slot_of("/etcdserverpb.KV/Nope"),
            Some(CLIENT_METHODS.len() + ETCD_METHODS.len())
        );
    }

    #[test]
    fn paths_map_to_slots_and_only_client_api_calls_count() {
        let stats = GrpcStats::new();
        assert_eq!(stats.slot_of("/fenced.v1.Lock/Acquire"), Some(0));
        assert_eq!(
            stats.slot_of("/fenced.v1.Lock/Nope"),
            Some(CLIENT_METHODS.len() + ETCD_METHODS.len())
        );
        assert_eq!(stats.slot_of("/fenced.raft.v1.Raft/AppendEntries"), None);
        assert_eq!(stats.slot_of("/grpc.health.v1.Health/Check"), None);
        let mut h = HeaderMap::new();
        assert_eq!(status_in(&h), None);
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert_eq!(status_in(&h).map(|c| CODE_NAMES[c]), Some("Unavailable"));
        h.insert("grpc-status", http::HeaderValue::from_static("x"));
        assert_eq!(status_in(&h).map(|c| CODE_NAMES[c]), Some("Unknown"));
    }
}
