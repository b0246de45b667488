//! The `kv` and `watch` workloads: clients of etcd's v3 gRPC API (`etcdserverpb`, the
//! generated client that `fenced_backends::etcd` uses too), pointed at fenced's gRPC port.
//!
//! A client talks to one node at a time, as an etcd client with one endpoint does: client `k`
//! starts on node `k mod n` and moves to the next node whenever an op ends `info` (the kv
//! workload and the watch workload's writers, which then also retire their process id) or a
//! watch stream breaks (watchers, which keep theirs: a watcher is one logical subscriber for
//! the whole run). Nothing is retried inside an op: fenced proposes etcd writes without a
//! dedup record (`crates/server/src/api/etcd/mod.rs`), so a write sent twice may apply twice.
//!
//! Outcomes: an answer with a code that etcd gives only before anything is proposed
//! (`InvalidArgument`, `OutOfRange` — e.g. a compaction below the compacted revision —,
//! `FailedPrecondition`, `NotFound`, `AlreadyExists`, `PermissionDenied`, `Unauthenticated`,
//! `Unimplemented`) is a `fail`; every other error, a timeout or a transport error is `info`
//! (`UNAVAILABLE` "outcome unknown", a leader change, a dropped connection).

pub(crate) mod kv;
pub(crate) mod watch;

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::client::{ClientError, ClientSpec, Res};

pub(crate) use fenced_backends::etcd::{mvccpb, pb, prefix_end};

/// The serving etcd endpoint (fenced gRPC address) number `i`, wrapping around.
pub(crate) fn endpoint(spec: &ClientSpec, i: usize) -> Result<String, ClientError> {
    spec.endpoints_from(&spec.lock_endpoints, i)
        .into_iter()
        .next()
        .ok_or_else(|| ClientError::Other("no etcd endpoints".into()))
}

/// A lazily connecting channel to one node.
pub(crate) fn channel(addr: &str) -> Result<Channel, ClientError> {
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    Ok(Endpoint::from_shared(uri)
        .map_err(|e| ClientError::Other(format!("{addr}: {e}")))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// A request with a gRPC deadline.
pub(crate) fn req<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// Codes etcd answers before proposing anything: the call certainly had no effect.
pub(crate) fn definite(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::OutOfRange
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

/// How a call ended, as a history outcome (see the module docs).
pub(crate) fn outcome<T>(
    r: Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>,
) -> Result<T, Res> {
    match r {
        Err(_) => Err(Res::Info("timeout".into())),
        Ok(Err(s)) => Err(status_res(&s)),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

/// An error status as a history outcome.
pub(crate) fn status_res(s: &tonic::Status) -> Res {
    let m = format!("{:?}: {}", s.code(), s.message());
    if definite(s.code()) {
        Res::Fail(m)
    } else {
        Res::Info(m)
    }
}

/// Bytes from the network as text (keys and values are ASCII here; anything else shows up
/// as replacement characters rather than an error).
pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The store revision an answer is at (0 without a header).
pub(crate) fn revision(h: Option<&pb::ResponseHeader>) -> i64 {
    h.map_or(0, |h| h.revision)
}

/// Ready check through `ep`'s etcd API: a linearizable `Range` answers and (`watch`) a Watch
/// is created. A service this build does not serve is reported as "unknown command" (the
/// probe then stops at once).
pub(crate) async fn probe(ep: &str, watch: bool, t: Duration) -> Result<(), String> {
    use tokio_stream::StreamExt;
    let ch = channel(ep).map_err(|e| e.to_string())?;
    let why = |s: &tonic::Status| match s.code() {
        Code::Unimplemented => format!("{ep}: unknown command: {}", s.message()),
        c => format!("{ep}: etcd API: {c:?}: {}", s.message()),
    };
    let range = pb::RangeRequest {
        key: b"probe".to_vec(),
        ..Default::default()
    };
    tokio::time::timeout(
        t,
        pb::kv_client::KvClient::new(ch.clone()).range(req(range, t)),
    )
    .await
    .map_err(|_| format!("{ep}: etcd Range timed out"))?
    .map_err(|s| why(&s))?;
    if !watch {
        return Ok(());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.send(watch::create("probe/", 0)).await;
    let mut s = tokio::time::timeout(
        t,
        pb::watch_client::WatchClient::new(ch)
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| format!("{ep}: etcd Watch timed out"))?
    .map_err(|s| why(&s))?
    .into_inner();
    match tokio::time::timeout(t, s.next()).await {
        Ok(Some(Ok(r))) if r.created => Ok(()),
        Ok(Some(Err(st))) => Err(why(&st)),
        Ok(Some(Ok(_))) => Err(format!("{ep}: the Watch's first answer is not `created`")),
        Ok(None) => Err(format!("{ep}: the Watch stream ended")),
        Err(_) => Err(format!("{ep}: no `created` from the Watch in time")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind<T>(r: Result<T, Res>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(Res::Ok(..)) => "ok",
            Err(Res::Fail(_)) => "fail",
            Err(Res::Info(_)) => "info",
        }
    }

    #[test]
    fn only_refusals_before_proposing_are_definite() {
        let st = |c: Code| -> Result<Result<tonic::Response<()>, _>, _> {
            Ok(Err(tonic::Status::new(c, "x")))
        };
        assert_eq!(kind(outcome(st(Code::InvalidArgument))), "fail");
        assert_eq!(kind(outcome(st(Code::OutOfRange))), "fail");
        for c in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unknown,
            Code::Cancelled,
            Code::Internal,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            assert_eq!(kind(outcome(st(c))), "info", "{c:?}");
        }
        assert_eq!(kind(outcome(Ok(Ok(tonic::Response::new(()))))), "ok");
    }
}
