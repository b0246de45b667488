//! etcd's space quota (`--quota-backend-bytes`) with its `NOSPACE` alarm, and automatic
//! compaction (`--auto-compaction-mode revision`), against a real 3-node cluster: through the
//! generated tonic etcd client (codes and texts) and Debian's `etcdctl` (`alarm list`,
//! `alarm disarm`).
//!
//! Run: `cargo test -p fenced-server --test etcd_quota` (needs `etcdctl`: `apt-get install -y
//! etcd-client`).

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use support::{follower_of, require, wait_for, TestCluster, LEADER_TIMEOUT};
use tonic::transport::Channel;
use tonic::Code;

/// Bound for the cluster to accept etcd writes and for the leader to set its quota.
const READY: Duration = Duration::from_secs(60);
const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";

fn etcdctl_ok(endpoints: &[String], args: &[&str]) -> String {
    support::etcdctl_in_ok(endpoints, args, "")
}

fn kv(c: &TestCluster, id: u64) -> KvClient<Channel> {
    KvClient::new(c.raw_channel(id))
}

fn put_req(key: &str, value: &str) -> epb::PutRequest {
    epb::PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

async fn put(c: &TestCluster, id: u64, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let r = kv(c, id).put(put_req(key, value)).await?.into_inner();
    Ok(r.header.map_or(0, |h| h.revision))
}

async fn get_at(
    c: &TestCluster,
    id: u64,
    key: &str,
    revision: i64,
) -> Result<epb::RangeResponse, tonic::Status> {
    let req = epb::RangeRequest {
        key: key.as_bytes().to_vec(),
        revision,
        ..Default::default()
    };
    Ok(kv(c, id).range(req).await?.into_inner())
}

/// Put until the cluster takes etcd writes (a leader that heard every member's rules).
async fn wait_writable(c: &TestCluster, id: u64) {
    wait_for("an etcd put to succeed", READY, || async move {
        put(c, id, "ready", "1").await.map_err(|e| e.to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_quota_raises_nospace_until_compaction_and_disarm() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcd-quota", &["--quota-backend-bytes", "4096"]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all = c.endpoints();
    wait_writable(&c, f).await;
    put(&c, f, "doomed", "x").await.expect("a small put");
    // Fill the history through a follower until the quota refuses a write. (The leader sets
    // its quota as soon as every member runs the quota rules; puts before that count too.)
    let value = "v".repeat(500);
    let refused = wait_for("a put refused by the quota", READY, || {
        let (c, value) = (&c, value.clone());
        async move {
            match put(c, f, "k", &value).await {
                Ok(rev) => Err(format!("put at {rev}")),
                Err(s) => Ok(s),
            }
        }
    })
    .await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.message(), NOSPACE);
    // Every put is refused now, however small, on any node.
    for id in c.ids() {
        let e = put(&c, id, "tiny", "")
            .await
            .expect_err("refused under the alarm");
        assert_eq!((e.code(), e.message()), (Code::ResourceExhausted, NOSPACE));
    }
    // A txn that may put is refused; reads and deletes are served.
    let txn = epb::TxnRequest {
        success: vec![epb::RequestOp {
            request: Some(epb::request_op::Request::RequestPut(put_req("t", "1"))),
        }],
        ..Default::default()
    };
    let e = kv(&c, leader).txn(txn).await.expect_err("refused");
    assert_eq!(e.code(), Code::ResourceExhausted);
    // So is a LeaseGrant, with or without an id (etcd's capped applier; issue 38, item 5).
    for id in [0, 777_000] {
        let r = LeaseClient::new(c.raw_channel(f))
            .lease_grant(epb::LeaseGrantRequest { ttl: 60, id })
            .await;
        match r {
            Err(e) => assert_eq!((e.code(), e.message()), (Code::ResourceExhausted, NOSPACE)),
            Ok(r) => panic!("LeaseGrant {id} under NOSPACE granted {:?}", r.into_inner()),
        }
    }
    let r = get_at(&c, f, "k", 0).await.expect("a range is served");
    assert_eq!(r.kvs[0].value, value.as_bytes());
    let del = kv(&c, f)
        .delete_range(epb::DeleteRangeRequest {
            key: b"doomed".to_vec(),
            ..Default::default()
        })
        .await
        .expect("a delete is served")
        .into_inner();
    assert_eq!(del.deleted, 1);
    // The alarm, as etcdctl and Maintenance show it (each node from its own replica: a
    // follower may apply the refused write a moment after the leader answered).
    wait_for("etcdctl alarm list to show NOSPACE", READY, || {
        let all = all.clone();
        async move {
            let list = etcdctl_ok(&all, &["alarm", "list"]);
            list.contains("alarm:NOSPACE").then_some(()).ok_or(list)
        }
    })
    .await;
    let m = MaintenanceClient::new(c.raw_channel(f));
    let st = wait_for("the follower's status to show NOSPACE", READY, || {
        let mut m = m.clone();
        async move {
            let st = m
                .status(epb::StatusRequest {})
                .await
                .map_err(|e| e.to_string())?;
            let st = st.into_inner();
            let raised = st.errors.iter().any(|e| e.contains("alarm:NOSPACE"));
            raised
                .then_some(st.db_size)
                .ok_or(format!("{:?}", st.errors))
        }
    })
    .await;
    assert!(st >= 4096 - 600, "dbSize {st}");
    // A disarm without freeing space: the next write over the quota raises it again.
    etcdctl_ok(&all, &["alarm", "disarm"]);
    let e = put(&c, f, "k", &value)
        .await
        .expect_err("still over the quota");
    assert_eq!(e.code(), Code::ResourceExhausted);
    // Compact everything superseded, disarm: writes are served again.
    let rev = get_at(&c, leader, "k", 0)
        .await
        .expect("range")
        .header
        .expect("header")
        .revision;
    kv(&c, leader)
        .compact(epb::CompactionRequest {
            revision: rev,
            physical: false,
        })
        .await
        .expect("a compaction is served under the alarm");
    let freed = wait_for("the compaction to free space", READY, || {
        let mut m = m.clone();
        async move {
            let st = m
                .status(epb::StatusRequest {})
                .await
                .map_err(|e| e.to_string())?;
            let st = st.into_inner();
            (st.db_size < 2_000)
                .then_some(st.db_size)
                .ok_or(format!("{}", st.db_size))
        }
    })
    .await;
    assert!(freed > 0);
    let out = etcdctl_ok(&all, &["alarm", "disarm"]);
    assert!(
        out.contains("alarm:NOSPACE"),
        "disarm prints what it cleared: {out}"
    );
    for id in c.ids() {
        let eps = c.endpoints_of(&[id]);
        wait_for("every node to list no alarm", READY, || {
            let eps = eps.clone();
            async move {
                let list = etcdctl_ok(&eps, &["alarm", "list"]);
                list.is_empty().then_some(()).ok_or(list)
            }
        })
        .await;
    }
    put(&c, f, "k", "after")
        .await
        .expect("writes are served again");
    assert_eq!(
        etcdctl_ok(&all, &["get", "k", "--print-value-only"]),
        "after\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_auto_compaction_keeps_the_last_n_revisions() {
    let c = TestCluster::start(
        "etcd-autocompact",
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "20",
        ],
    );
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    wait_writable(&c, f).await;
    let first = put(&c, f, "k", "0").await.expect("put");
    let mut last = first;
    for i in 1..60 {
        last = put(&c, f, "k", &i.to_string()).await.expect("put");
    }
    // The leader compacts by itself: the first put's revision is gone, on every node.
    for id in c.ids() {
        let e = wait_for("the first revision to be compacted", READY, || {
            let c = &c;
            async move {
                match get_at(c, id, "k", first).await {
                    Ok(_) => Err("still readable".to_string()),
                    Err(e) => Ok(e),
                }
            }
        })
        .await;
        assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
        assert_eq!(
            e.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }
    // The last 20 revisions stay.
    let r = get_at(&c, f, "k", last - 10)
        .await
        .expect("a recent revision");
    assert_eq!(r.kvs.len(), 1);
    // And it does not compact what it must keep, even left alone for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = get_at(&c, leader, "k", last - 10)
        .await
        .expect("still there");
    assert_eq!(r.kvs.len(), 1);
}
