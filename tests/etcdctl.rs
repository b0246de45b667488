//! etcd's v3 API on fenced's gRPC port (`crates/server/src/api/etcd`), driven by Debian's
//! `etcdctl` (3.4, `ETCDCTL_API=3`) against a real 3-node cluster — put/get/del with
//! prefixes, reads at older revisions, txns, compaction, `endpoint status`, `member list`,
//! `alarm list`, writes through a follower and after the leader is SIGKILLed — and, for what
//! etcdctl cannot show, by the generated tonic client: sorting, revision filters,
//! `count_only`, `limit` with `more`, txn compares on revisions, headers, and etcd's error
//! codes and texts.
//!
//! Run: `cargo test -p fenced-server --test etcdctl` (needs `etcdctl`: `apt-get install -y
//! etcd-client`).

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use serde_json::Value;
use support::{
    etcdctl_in as etcdctl, etcdctl_in_ok as etcdctl_ok, follower_of, require, wait_for,
    TestCluster, LEADER_TIMEOUT,
};
use tonic::Code;

/// Bound for the cluster to accept etcd writes (a leader that heard every member's rules)
/// and for a write after the leader died.
const READY: Duration = Duration::from_secs(60);

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn num(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"))
}

/// Put `key` through `endpoints` until it works: the cluster accepts etcd writes once a
/// leader has heard that every member applies the etcd rules.
async fn wait_writable(endpoints: &[String], key: &str) {
    let eps = endpoints.to_vec();
    let key = key.to_owned();
    wait_for("an etcd put to succeed", READY, || {
        let (eps, key) = (eps.clone(), key.clone());
        async move {
            let (ok, out, err) =
                tokio::task::spawn_blocking(move || etcdctl(&eps, &["put", &key, "ready"], ""))
                    .await
                    .map_err(|e| e.to_string())?;
            if ok && out.trim() == "OK" {
                Ok(())
            } else {
                Err(format!("{err}{out}"))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_works_against_a_three_node_cluster() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcdctl", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let all = c.endpoints();
    let via_leader = c.endpoints_of(&[leader]);
    let via_follower = c.endpoints_of(&[f]);
    wait_writable(&via_leader, "ready").await;

    // Writes through a follower (forwarded to the leader) and the leader.
    for (k, v) in [("foo/a", "1"), ("foo/b", "2")] {
        assert_eq!(etcdctl_ok(&via_follower, &["put", k, v], "").trim(), "OK");
    }
    assert_eq!(
        etcdctl_ok(&via_leader, &["put", "foo/c", "3"], "").trim(),
        "OK"
    );
    assert_eq!(etcdctl_ok(&all, &["put", "bar", "9"], "").trim(), "OK");
    // A linearizable read on the follower sees them all.
    let got = etcdctl_ok(&via_follower, &["get", "foo", "--prefix"], "");
    assert_eq!(got, "foo/a\n1\nfoo/b\n2\nfoo/c\n3\n");
    let got = etcdctl_ok(&all, &["get", "foo/", "--prefix", "--keys-only"], "");
    assert_eq!(
        got.split_whitespace().collect::<Vec<_>>(),
        ["foo/a", "foo/b", "foo/c"]
    );

    // An older revision.
    let first = json(&etcdctl_ok(&all, &["get", "foo/a", "-w", "json"], ""));
    let old_rev = num(&first["kvs"][0]["mod_revision"], "mod_revision");
    assert!(num(&first["header"]["revision"], "revision") >= old_rev);
    assert!(num(&first["header"]["member_id"], "member_id") > 0);
    etcdctl_ok(&all, &["put", "foo/a", "1b"], "");
    let rev_arg = format!("--rev={old_rev}");
    assert_eq!(
        etcdctl_ok(&all, &["get", "foo/a", &rev_arg], ""),
        "foo/a\n1\n"
    );
    assert_eq!(etcdctl_ok(&all, &["get", "foo/a"], ""), "foo/a\n1b\n");
    // --prev-kv on a put.
    let got = etcdctl_ok(&all, &["put", "bar", "9", "--prev-kv"], "");
    assert_eq!(got, "OK\nbar\n9\n");

    // Txn (stdin form: compares, blank line, success ops, blank line, failure ops).
    let txn = "value(\"bar\") = \"9\"\n\nput bar 10\n\nget bar\n\n";
    assert_eq!(etcdctl_ok(&all, &["txn"], txn), "SUCCESS\n\nOK\n");
    assert_eq!(etcdctl_ok(&all, &["txn"], txn), "FAILURE\n\nbar\n10\n");
    let mod_txn = format!("mod(\"bar\") > \"{old_rev}\"\n\nget bar\n\n\n");
    assert_eq!(etcdctl_ok(&all, &["txn"], &mod_txn), "SUCCESS\n\nbar\n10\n");

    // Delete a prefix.
    assert_eq!(
        etcdctl_ok(&via_follower, &["del", "foo", "--prefix"], "").trim(),
        "3"
    );
    assert_eq!(etcdctl_ok(&all, &["get", "foo", "--prefix"], ""), "");

    // Compaction: reads below it fail with etcd's error.
    let now = json(&etcdctl_ok(&all, &["get", "bar", "-w", "json"], ""));
    let rev = num(&now["header"]["revision"], "revision");
    let got = etcdctl_ok(&all, &["compaction", &rev.to_string()], "");
    assert_eq!(got.trim(), format!("compacted revision {rev}"));
    let (ok, _, err) = etcdctl(&all, &["get", "foo/a", &rev_arg], "");
    assert!(
        !ok && err.contains("required revision has been compacted"),
        "{err}"
    );
    let future = format!("--rev={}", rev + 1_000_000);
    let (ok, _, err) = etcdctl(&all, &["get", "bar", &future], "");
    assert!(
        !ok && err.contains("required revision is a future revision"),
        "{err}"
    );

    // endpoint status: every member names the leader, a term and a revision.
    let status = json(&etcdctl_ok(&all, &["endpoint", "status", "-w", "json"], ""));
    let status = status.as_array().cloned().unwrap_or_default();
    assert_eq!(status.len(), 3, "{status:?}");
    for s in &status {
        let st = &s["Status"];
        assert_eq!(num(&st["leader"], "leader"), leader, "{s}");
        assert!(num(&st["raftTerm"], "raftTerm") > 0, "{s}");
        assert!(num(&st["header"]["revision"], "revision") >= rev, "{s}");
        assert!(
            st["version"].as_str().is_some_and(|v| v.contains("fenced")),
            "{s}"
        );
    }
    let table = etcdctl_ok(&all, &["endpoint", "status"], "");
    assert_eq!(table.lines().count(), 3, "{table}");
    // endpoint health: a linearizable get on each member.
    let (ok, out, err) = etcdctl(&all, &["endpoint", "health"], "");
    let healthy = format!("{out}{err}");
    assert!(
        ok && healthy.matches("is healthy").count() == 3,
        "{healthy}"
    );

    // member list: ids and client URLs are fenced's.
    let members = json(&etcdctl_ok(&all, &["member", "list", "-w", "json"], ""));
    let mut seen: Vec<(u64, String)> = members["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let url = m["clientURLs"][0].as_str().unwrap_or("").to_owned();
            (num(&m["ID"], "ID"), url)
        })
        .collect();
    seen.sort();
    let want: Vec<(u64, String)> = c
        .ids()
        .map(|i| (i, format!("http://{}", c.grpc_addr(i))))
        .collect();
    assert_eq!(seen, want);
    let (ok, _, err) = etcdctl(&all, &["member", "remove", "2"], "");
    assert!(!ok && err.contains("fenced member remove"), "{err}");

    // alarm list: none.
    assert_eq!(etcdctl_ok(&all, &["alarm", "list"], ""), "");

    // The leader is SIGKILLed: the survivors elect another and take the next put.
    c.kill(leader);
    let survivors: Vec<u64> = c.ids().filter(|i| *i != leader).collect();
    let eps = c.endpoints_of(&survivors);
    wait_writable(&eps, "after-kill").await;
    assert_eq!(
        etcdctl_ok(&eps, &["get", "after-kill"], ""),
        "after-kill\nready\n"
    );
    assert_eq!(etcdctl_ok(&eps, &["get", "bar"], ""), "bar\n10\n");
}

fn kv_client(c: &TestCluster, id: u64) -> KvClient<tonic::transport::Channel> {
    KvClient::new(c.raw_channel(id))
}

fn range(key: &str, end: &str) -> epb::RangeRequest {
    epb::RangeRequest {
        key: key.as_bytes().to_vec(),
        range_end: end.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn put_op(key: &str, value: &str) -> epb::RequestOp {
    epb::RequestOp {
        request: Some(epb::request_op::Request::RequestPut(epb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

fn keys(r: &epb::RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

/// The error of a call: its code and message.
fn err<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match r {
        Ok(v) => panic!("succeeded: {v:?}"),
        Err(s) => (s.code(), s.message().to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_api_sorts_filters_compares_and_answers_etcds_errors() {
    let c = TestCluster::start("etcd-api", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let mut kv = kv_client(&c, f);
    let put = |k: &str, v: &str| epb::PutRequest {
        key: k.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    // Writable once the leader stamps the etcd rules.
    let first = wait_for("an etcd put to succeed", READY, || {
        let mut kv = kv.clone();
        let req = put("s/b", "2");
        async move { kv.put(req).await.map_err(|e| e.to_string()) }
    })
    .await
    .into_inner();
    let hdr = first.header.unwrap_or_default();
    let status = c.status_ok(leader).await;
    assert_eq!(hdr.cluster_id, status.cluster_id);
    assert_eq!(hdr.member_id, f);
    assert!(hdr.raft_term > 0 && hdr.revision > 0, "{hdr:?}");
    let rev_b = hdr.revision;
    let rev_a = kv
        .put(put("s/a", "3"))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let rev_c = kv
        .put(put("s/c", "1"))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert!(rev_b < rev_a && rev_a < rev_c);
    // A second version of s/b.
    let rev_b2 = kv
        .put(put("s/b", "0"))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;

    // Sorting.
    use epb::range_request::{SortOrder, SortTarget};
    let mut r = range("s/", "s0");
    r.sort_order = SortOrder::Descend as i32;
    let got = kv.range(r.clone()).await.unwrap().into_inner();
    assert_eq!(keys(&got), ["s/c", "s/b", "s/a"]);
    assert_eq!(got.header.unwrap().revision, rev_b2);
    r.sort_order = SortOrder::Ascend as i32;
    r.sort_target = SortTarget::Value as i32;
    assert_eq!(
        keys(&kv.range(r.clone()).await.unwrap().into_inner()),
        ["s/b", "s/c", "s/a"]
    );
    r.sort_target = SortTarget::Create as i32;
    assert_eq!(
        keys(&kv.range(r).await.unwrap().into_inner()),
        ["s/b", "s/a", "s/c"]
    );

    // Revision filters.
    let mut r = range("s/", "s0");
    r.min_mod_revision = rev_c;
    assert_eq!(
        keys(&kv.range(r).await.unwrap().into_inner()),
        ["s/b", "s/c"]
    );
    let mut r = range("s/", "s0");
    r.max_create_revision = rev_a;
    assert_eq!(
        keys(&kv.range(r).await.unwrap().into_inner()),
        ["s/a", "s/b"]
    );
    let mut r = range("s/", "s0");
    r.min_create_revision = rev_a;
    r.max_mod_revision = rev_c;
    assert_eq!(
        keys(&kv.range(r).await.unwrap().into_inner()),
        ["s/a", "s/c"]
    );

    // count_only, limit with more, keys_only, an older revision.
    let mut r = range("s/", "s0");
    r.count_only = true;
    let got = kv.range(r).await.unwrap().into_inner();
    assert!(got.kvs.is_empty() && got.count == 3);
    let mut r = range("s/", "s0");
    r.limit = 2;
    let got = kv.range(r).await.unwrap().into_inner();
    assert_eq!(
        (keys(&got), got.more, got.count),
        (vec!["s/a".into(), "s/b".into()], true, 3)
    );
    let mut r = range("s/", "s0");
    r.keys_only = true;
    let got = kv.range(r).await.unwrap().into_inner();
    assert!(got.kvs.iter().all(|kv| kv.value.is_empty()) && got.kvs.len() == 3);
    let mut r = range("s/b", "");
    r.revision = rev_c;
    let got = kv.range(r).await.unwrap().into_inner();
    assert_eq!(got.kvs[0].value, b"2");
    assert_eq!(got.kvs[0].mod_revision, rev_b);
    assert_eq!((got.kvs[0].create_revision, got.kvs[0].version), (rev_b, 1));
    // A serializable read on another member catches up by itself.
    let other = kv_client(&c, leader);
    wait_for(
        "a serializable read to see s/b's second version",
        READY,
        || {
            let mut other = other.clone();
            let mut r = range("s/b", "");
            r.serializable = true;
            async move {
                let got = other
                    .range(r)
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                match got.kvs.first() {
                    Some(kv) if kv.value == b"0" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;

    // Txn compares on create and mod revisions.
    use epb::compare::{CompareResult, CompareTarget, TargetUnion};
    let cmp =
        |target: CompareTarget, result: CompareResult, key: &str, u: TargetUnion| epb::Compare {
            result: result as i32,
            target: target as i32,
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target_union: Some(u),
        };
    let get_op = |k: &str| epb::RequestOp {
        request: Some(epb::request_op::Request::RequestRange(range(k, ""))),
    };
    let txn = epb::TxnRequest {
        compare: vec![
            cmp(
                CompareTarget::Create,
                CompareResult::Equal,
                "s/a",
                TargetUnion::CreateRevision(rev_a),
            ),
            cmp(
                CompareTarget::Mod,
                CompareResult::Greater,
                "s/b",
                TargetUnion::ModRevision(rev_b),
            ),
        ],
        success: vec![put_op("s/d", "4")],
        failure: vec![get_op("s/a")],
    };
    let got = kv.txn(txn.clone()).await.unwrap().into_inner();
    assert!(got.succeeded, "{got:?}");
    let put_rev = got.header.unwrap().revision;
    let d = kv.range(range("s/d", "")).await.unwrap().into_inner();
    assert_eq!(
        (d.kvs[0].mod_revision, d.kvs[0].create_revision),
        (put_rev, put_rev)
    );
    let mut wrong = txn.clone();
    wrong.compare[0] = cmp(
        CompareTarget::Create,
        CompareResult::Equal,
        "s/a",
        TargetUnion::CreateRevision(rev_a + 1),
    );
    let got = kv.txn(wrong).await.unwrap().into_inner();
    assert!(!got.succeeded);
    match &got.responses[0].response {
        Some(epb::response_op::Response::ResponseRange(r)) => assert_eq!(r.kvs[0].value, b"3"),
        other => panic!("{other:?}"),
    }
    // A read-only txn (read path) answers the same way.
    let ro = epb::TxnRequest {
        compare: vec![cmp(
            CompareTarget::Mod,
            CompareResult::Less,
            "s/b",
            TargetUnion::ModRevision(rev_b2),
        )],
        success: vec![get_op("s/b")],
        failure: vec![get_op("s/a")],
    };
    let got = kv.txn(ro).await.unwrap().into_inner();
    assert!(!got.succeeded);

    // etcd's errors: codes and texts.
    let (code, msg) = err(kv.put(put("", "x")).await);
    assert_eq!(
        (code, msg.as_str()),
        (Code::InvalidArgument, "etcdserver: key is not provided")
    );
    let mut r = range("s/a", "");
    r.revision = put_rev + 1_000_000;
    let (code, msg) = err(kv.range(r).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    let dup = epb::TxnRequest {
        compare: Vec::new(),
        success: vec![put_op("s/x", "1"), put_op("s/x", "2")],
        failure: Vec::new(),
    };
    let (code, msg) = err(kv.txn(dup).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request"
        )
    );
    let many = epb::TxnRequest {
        compare: Vec::new(),
        success: (0..129).map(|i| put_op(&format!("m/{i}"), "v")).collect(),
        failure: Vec::new(),
    };
    let (code, msg) = err(kv.txn(many).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );
    let mut leased = put("s/l", "v");
    leased.lease = 7;
    let (code, msg) = err(kv.put(leased).await);
    assert_eq!(
        (code, msg.as_str()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    let big = "x".repeat(1536 * 1024 + 1);
    let (code, msg) = err(kv.put(put("s/big", &big)).await);
    assert_eq!(
        (code, msg.as_str()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    let mut ignore = put("s/none", "");
    ignore.ignore_value = true;
    let (code, msg) = err(kv.put(ignore).await);
    assert_eq!(
        (code, msg.as_str()),
        (Code::InvalidArgument, "etcdserver: key not found")
    );

    // Compaction, then a read below it.
    let compacted = kv
        .compact(epb::CompactionRequest {
            revision: rev_c,
            physical: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(compacted.header.unwrap().revision > rev_c);
    let mut r = range("s/b", "");
    r.revision = rev_a;
    let (code, msg) = err(kv.range(r).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let (code, _) = err(kv
        .compact(epb::CompactionRequest {
            revision: rev_a,
            physical: false,
        })
        .await);
    assert_eq!(code, Code::OutOfRange);
    // prev_kv on a delete.
    let del = kv
        .delete_range(epb::DeleteRangeRequest {
            key: b"s/".to_vec(),
            range_end: b"s0".to_vec(),
            prev_kv: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(del.deleted, 4);
    assert_eq!(del.prev_kvs.len(), 4);

    // Maintenance and Cluster.
    let mut m = epb::maintenance_client::MaintenanceClient::new(c.raw_channel(f));
    let st = m.status(epb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.leader, leader);
    assert!(st.raft_applied_index > 0 && st.raft_index >= st.raft_applied_index);
    assert_eq!(st.header.unwrap().member_id, f);
    let (code, msg) = err(m
        .snapshot(epb::SnapshotRequest {})
        .await
        .map(|_| ())
        .map(tonic::Response::new));
    assert_eq!(code, Code::Unimplemented, "{msg}");
    let mut cl = epb::cluster_client::ClusterClient::new(c.raw_channel(f));
    let (code, msg) = err(cl
        .member_add(epb::MemberAddRequest {
            peer_ur_ls: vec!["http://x:1".into()],
            is_learner: false,
        })
        .await);
    assert!(
        code == Code::Unimplemented && msg.contains("fenced member add"),
        "{msg}"
    );
}

const USERS: &str = "\
user default off
user app on >apppw ~app/* -@all +get +set +del
user writer on >writerpw ~app/* -@all +set +del
user admin on >adminpw +@all ~*
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_logs_in_as_a_fenced_user_and_keeps_to_its_key_patterns() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start_with("etcdctl-auth", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, USERS).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let via_follower = c.endpoints_of(&[f]);
    let app = |args: &[&str]| {
        let mut all = vec!["--user=app:apppw"];
        all.extend_from_slice(args);
        etcdctl(&via_follower, &all, "")
    };
    // Writable (as app) once the leader stamps the etcd rules.
    wait_for("an etcd put as app to succeed", READY, || async {
        match app(&["put", "app/ready", "1"]) {
            (true, out, _) if out.trim() == "OK" => Ok(()),
            (_, out, err) => Err(format!("{err}{out}")),
        }
    })
    .await;
    assert!(app(&["put", "app/x", "2"]).0);
    let (ok, out, err) = app(&["get", "app/", "--prefix"]);
    assert!(ok, "{err}");
    assert_eq!(out, "app/ready\n1\napp/x\n2\n");
    // Outside its patterns: refused, naming the key.
    let (ok, _, err) = app(&["put", "other", "1"]);
    assert!(
        !ok && err.contains("no permissions") && err.contains("other"),
        "{err}"
    );
    let (ok, _, err) = app(&["get", "a", "--prefix"]);
    assert!(!ok && err.contains("no permissions"), "{err}");
    let (ok, _, err) = app(&["get", "", "--from-key"]);
    assert!(!ok && err.contains("whole keyspace"), "{err}");
    let (ok, _, err) = app(&["compaction", "1"]);
    assert!(!ok && err.contains("administrator"), "{err}");
    // No user: the default user is off.
    let (ok, _, err) = etcdctl(&via_follower, &["get", "app/x"], "");
    assert!(!ok && err.contains("authentication required"), "{err}");
    let (ok, _, err) = etcdctl(&via_follower, &["--user=app:wrong", "get", "app/x"], "");
    assert!(!ok && err.contains("invalid username-password"), "{err}");
    // The administrator sees everything, through every member (each its own token).
    let all = c.endpoints();
    for _ in 0..3 {
        let out = etcdctl_ok(&all, &["--user=admin:adminpw", "get", "", "--from-key"], "");
        assert_eq!(out, "app/ready\n1\napp/x\n2\n");
    }
    prev_kv_needs_read_permission(&c, f, &via_follower).await;
}

/// `writer` may put and delete `app/*` but not read it: a put, delete or txn op asking for
/// `prev_kv` is refused as etcd refuses it (range permission), without it the write works,
/// and the old value never reaches the writer (issue 38, item 4).
async fn prev_kv_needs_read_permission(c: &TestCluster, node: u64, endpoints: &[String]) {
    let writer = |args: &[&str]| {
        let mut all = vec!["--user=writer:writerpw"];
        all.extend_from_slice(args);
        etcdctl(endpoints, &all, "")
    };
    let (ok, _, err) = writer(&["get", "app/x"]);
    assert!(
        !ok && err.contains("no permissions"),
        "writer cannot read: {err}"
    );
    let (ok, out, err) = writer(&["put", "app/x", "secret-1", "--prev-kv"]);
    assert!(
        !ok && err.contains("no permissions"),
        "put --prev-kv must be refused: {out}{err}"
    );
    assert!(!out.contains('2'), "no old value shown: {out}");
    let (ok, out, err) = writer(&["del", "app/x", "--prev-kv"]);
    assert!(
        !ok && err.contains("no permissions"),
        "del --prev-kv must be refused: {out}{err}"
    );
    // Without prev_kv the writes work.
    let (ok, out, err) = writer(&["put", "app/y", "secret-2"]);
    assert!(ok && out.trim() == "OK", "{out}{err}");
    // In a txn (etcdctl's txn has no prev_kv): the tonic client with etcd's token.
    let mut auth = epb::auth_client::AuthClient::new(c.raw_channel(node));
    let token = auth
        .authenticate(epb::AuthenticateRequest {
            name: "writer".into(),
            password: "writerpw".into(),
        })
        .await
        .expect("writer logs in")
        .into_inner()
        .token;
    let txn = |ops: Vec<epb::RequestOp>| {
        let mut req = tonic::Request::new(epb::TxnRequest {
            success: ops,
            ..Default::default()
        });
        req.metadata_mut()
            .insert("token", token.parse().expect("token metadata"));
        req
    };
    let put = |prev_kv: bool| epb::RequestOp {
        request: Some(epb::request_op::Request::RequestPut(epb::PutRequest {
            key: b"app/y".to_vec(),
            value: b"secret-3".to_vec(),
            prev_kv,
            ..Default::default()
        })),
    };
    let del = |prev_kv: bool| epb::RequestOp {
        request: Some(epb::request_op::Request::RequestDeleteRange(
            epb::DeleteRangeRequest {
                key: b"app/x".to_vec(),
                range_end: Vec::new(),
                prev_kv,
            },
        )),
    };
    let mut kv = kv_client(c, node);
    for (what, op) in [("put", put(true)), ("delete", del(true))] {
        let r = kv.txn(txn(vec![op])).await;
        match r {
            Err(s) => assert_eq!(s.code(), Code::PermissionDenied, "txn {what}: {s:?}"),
            Ok(r) => panic!("a txn {what} with prev_kv answered {:?}", r.into_inner()),
        }
    }
    let r = kv
        .txn(txn(vec![put(false), del(false)]))
        .await
        .expect("a txn without prev_kv works")
        .into_inner();
    assert!(r.succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_writes_wait_for_every_member_to_run_the_etcd_rules() {
    require("etcdctl", &["version"]);
    // The test-only flag that makes a member advertise older apply rules.
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
    let c = TestCluster::start("etcdctl-gate", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all = c.endpoints();
    wait_writable(&all, "before").await;
    // A member runs older code (as far as the leader can tell).
    let f = follower_of(leader);
    c.kill(f);
    c.restart_with(f, &["--unsafe-test-advertise-semantics", "0"]);
    wait_for("the leader back on older rules", READY, || async {
        let s = c.status(leader).await?;
        if s.semantics == 0 {
            Ok(())
        } else {
            Err(format!("stamps {}", s.semantics))
        }
    })
    .await;
    let via_leader = c.endpoints_of(&[leader]);
    let (ok, _, err) = etcdctl(&via_leader, &["put", "k", "v"], "");
    assert!(!ok && err.contains("cluster not upgraded"), "{err}");
    assert!(err.contains(&format!("member {f}")), "{err}");
    // Reads still work; and once the member runs the newest rules again, so do writes.
    assert_eq!(
        etcdctl_ok(&via_leader, &["get", "before"], ""),
        "before\nready\n"
    );
    c.kill(f);
    c.restart(f);
    wait_writable(&via_leader, "after").await;
}
