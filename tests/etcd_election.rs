//! etcd's server-side `v3lockpb.Lock` and `v3electionpb.Election` on the etcd keyspace
//! (`crates/server/src/api/etcd/{lock,election,queue}.rs`), over gRPC against a real 3-node
//! cluster with the generated tonic clients:
//!
//! * `Lock` waits FIFO on the server; the key it returns is `name/<lease hex>`, put when the
//!   call queued, and its `create_revision` is the fencing token (an uncontended grant's
//!   `header.revision` equals it); `Lock` again with the holding lease answers the same key;
//!   fenced's own `LOCK.ACQUIRE` of the same name is another lock (a separate namespace);
//!   `Unlock(key)` hands over; a revoked lease hands over; the stale holder's token is
//!   refused by `FENCE.SET` after the next holder wrote.
//! * A `Lock` call cancelled by its deadline leaves the queue: the lock goes to the next.
//! * `Campaign`, `Proclaim`, `Leader`, `Observe` and `Resign`: the leader's value, a stale
//!   leader's proclaim refused, every change observed in order, through a SIGKILL of the
//!   fenced leader (a waiting campaign, connected to a survivor, wins after it); a
//!   require-leader `Observe` on a member that lost the majority ends with "no leader"; a
//!   leader campaigning again with another value proclaims it.
//!
//! Run: `cargo test -p fenced-server --test etcd_election`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::etcd::v3electionpb as elpb;
use fenced_proto::etcd::v3electionpb::election_client::ElectionClient;
use fenced_proto::etcd::v3lockpb as lpb;
use fenced_proto::etcd::v3lockpb::lock_client::LockClient;
use support::{
    etcd_get as get, etcd_lock as lock, etcd_unlock as unlock, follower_of, grant_lease, resp_cmd,
    resp_cmd_err, resp_connect, within, TestCluster, ETCD_READY, LEADER_TIMEOUT,
};
use tonic::transport::Channel;
use tonic::Code;

/// Bound for one call that should answer soon.
const STEP: Duration = Duration::from_secs(20);

fn revision(h: &Option<epb::ResponseHeader>) -> i64 {
    h.as_ref().map_or(0, |h| h.revision)
}

/// A call that must not have answered yet (it waits on the server).
async fn still_waiting<T: std::fmt::Debug>(what: &str, call: &mut tokio::task::JoinHandle<T>) {
    if let Ok(done) = tokio::time::timeout(Duration::from_millis(700), &mut *call).await {
        panic!("{what} answered while it should wait: {done:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_in_order_its_key_revision_is_the_token_and_storage_refuses_the_stale() {
    let c = TestCluster::start("etcd_election_lock", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let ch = || c.raw_channel(node);
    let a = grant_lease(&c, node, 60).await.id;
    let b = grant_lease(&c, node, 60).await.id;
    let d = grant_lease(&c, node, 60).await.id;

    let la = within("lock a", ETCD_READY, lock(ch(), "job", a))
        .await
        .expect("lock a");
    let ta = revision(&la.header);
    assert_eq!(la.key, format!("job/{a:x}").into_bytes());
    let kv = get(ch(), &la.key).await.expect("a's key");
    assert_eq!(
        (kv.create_revision, kv.lease),
        (ta, a),
        "create revision = token"
    );
    // The same lease again: the same key and token (the header is the revision of the
    // call's txn, as in etcd).
    let again = within("lock a again", STEP, lock(ch(), "job", a))
        .await
        .expect("lock a again");
    assert_eq!(again.key, la.key);
    assert_eq!(
        get(ch(), &la.key).await.map(|kv| kv.create_revision),
        Some(ta)
    );
    // fenced's lock table is a separate namespace: LOCK.ACQUIRE job is another lock.
    let mut con = resp_connect(&c, node).await;
    let granted: redis::Value = resp_cmd(&mut con, &["LOCK.ACQUIRE", "job", "o", "5000"]).await;
    assert!(
        !matches!(granted, redis::Value::Nil),
        "LOCK.ACQUIRE job: {granted:?}"
    );

    // b then d wait, in that order; their keys are queued.
    let mut wb = tokio::spawn(lock(ch(), "job", b));
    still_waiting("b's Lock", &mut wb).await;
    let mut wd = tokio::spawn(lock(c.raw_channel(leader), "job", d));
    still_waiting("d's Lock", &mut wd).await;
    let kb = get(ch(), format!("job/{b:x}").as_bytes())
        .await
        .expect("b's queued key");
    assert!(kb.create_revision > ta);

    // A holder writes with its token at the storage.
    let ok: String = resp_cmd(&mut con, &["FENCE.SET", "db", "by-a", &ta.to_string()]).await;
    assert_eq!(ok, "OK");
    // Unlock hands over to b (not d), at a later revision that is b's key's create revision.
    unlock(ch(), &la.key).await;
    let lb = within("b's grant", STEP, &mut wb)
        .await
        .expect("join")
        .expect("lock b");
    let tb = get(ch(), &lb.key).await.map_or(0, |kv| kv.create_revision);
    assert_eq!(
        tb, kb.create_revision,
        "b's token is its queued key's create revision"
    );
    assert!(revision(&lb.header) >= tb);
    assert_eq!(get(ch(), &la.key).await, None, "a's key deleted");
    still_waiting("d's Lock", &mut wd).await;
    let ok: String = resp_cmd(&mut con, &["FENCE.SET", "db", "by-b", &tb.to_string()]).await;
    assert_eq!(ok, "OK");
    // The stale holder's write is refused at the storage.
    let stale = resp_cmd_err(&mut con, &["FENCE.SET", "db", "late-a", &ta.to_string()]).await;
    assert!(stale.to_uppercase().contains("STALE"), "{stale}");

    // Revoking b's lease hands over to d.
    within(
        "revoke b",
        STEP,
        LeaseClient::new(ch()).lease_revoke(epb::LeaseRevokeRequest { id: b }),
    )
    .await
    .expect("revoke");
    let ld = within("d's grant", STEP, &mut wd)
        .await
        .expect("join")
        .expect("lock d");
    assert!(get(ch(), &ld.key).await.expect("d's key").create_revision > tb);
    assert_eq!(
        get(ch(), &lb.key).await,
        None,
        "b's key went with its lease"
    );

    // A lease of 0, and a key Lock never returned, are refused with reasons.
    let e = lock(ch(), "job", 0).await.expect_err("no lease");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = LockClient::new(ch())
        .unlock(lpb::UnlockRequest {
            key: b"job".to_vec(),
        })
        .await
        .expect_err("not a lock key");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_call_cancelled_by_its_deadline_leaves_the_queue() {
    let c = TestCluster::start("etcd_election_cancel", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let ch = || c.raw_channel(node);
    let a = grant_lease(&c, node, 60).await.id;
    let b = grant_lease(&c, node, 60).await.id;
    let e = grant_lease(&c, node, 60).await.id;
    let la = within("lock a", ETCD_READY, lock(ch(), "job", a))
        .await
        .expect("lock a");
    // b gives up after 500 ms (a gRPC deadline: the server sees the call cancelled).
    let mut req = tonic::Request::new(lpb::LockRequest {
        name: b"job".to_vec(),
        lease: b,
    });
    req.set_timeout(Duration::from_millis(500));
    let err = LockClient::new(ch())
        .lock(req)
        .await
        .expect_err("b times out");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err}"
    );
    let mut we = tokio::spawn(lock(ch(), "job", e));
    still_waiting("e's Lock", &mut we).await;
    unlock(ch(), &la.key).await;
    let le = within("e's grant", STEP, &mut we)
        .await
        .expect("join")
        .expect("lock e");
    assert_eq!(le.key, format!("job/{e:x}").into_bytes());
    assert_eq!(
        get(ch(), format!("job/{b:x}").as_bytes()).await,
        None,
        "b never held"
    );
}

async fn campaign(ch: Channel, lease: i64, value: &str) -> Result<elpb::LeaderKey, tonic::Status> {
    ElectionClient::new(ch)
        .campaign(elpb::CampaignRequest {
            name: b"leader".to_vec(),
            lease,
            value: value.as_bytes().to_vec(),
        })
        .await
        .map(|r| r.into_inner().leader.unwrap_or_default())
}

async fn leader_value(ch: Channel) -> Result<String, tonic::Status> {
    ElectionClient::new(ch)
        .leader(elpb::LeaderRequest {
            name: b"leader".to_vec(),
        })
        .await
        .map(|r| String::from_utf8_lossy(&r.into_inner().kv.unwrap_or_default().value).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_campaigns_proclaims_observes_and_resigns_through_a_leader_sigkill() {
    let c = TestCluster::start("etcd_election_elect", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    // The third node: neither the leader nor `node`.
    let other = c
        .ids()
        .find(|i| *i != leader && *i != node)
        .expect("a third node");
    let a = grant_lease(&c, node, 60).await.id;
    let b = grant_lease(&c, node, 60).await.id;
    let cand = grant_lease(&c, node, 60).await.id;
    let e = leader_value(c.raw_channel(node))
        .await
        .expect_err("no leader yet");
    assert_eq!(e.message(), "election: no leader");

    // An observer on `node` from before the first campaign.
    let mut observe = ElectionClient::new(c.raw_channel(node))
        .observe(elpb::LeaderRequest {
            name: b"leader".to_vec(),
        })
        .await
        .expect("observe")
        .into_inner();
    let ka = within(
        "a campaigns",
        ETCD_READY,
        campaign(c.raw_channel(node), a, "a1"),
    )
    .await
    .expect("campaign a");
    let kv = get(c.raw_channel(node), &ka.key).await.expect("leader key");
    assert_eq!(
        (kv.create_revision, kv.lease),
        (ka.rev, a),
        "rev = create revision"
    );
    // A channel without the harness's 2 s call timeout: b waits through a leader change.
    let waiting = tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc_addr(other)))
        .expect("endpoint")
        .connect_lazy();
    let mut wb = tokio::spawn(campaign(waiting, b, "b1"));
    still_waiting("b's Campaign", &mut wb).await;
    // Proclaim changes the value, seen by Leader.
    within(
        "proclaim",
        STEP,
        ElectionClient::new(c.raw_channel(node)).proclaim(elpb::ProclaimRequest {
            leader: Some(ka.clone()),
            value: b"a2".to_vec(),
        }),
    )
    .await
    .expect("proclaim a2");
    assert_eq!(
        leader_value(c.raw_channel(node)).await.expect("leader"),
        "a2"
    );

    // SIGKILL the fenced leader: b's campaign (on a survivor) still waits, and wins when a
    // resigns through the other survivor.
    c.kill(leader);
    still_waiting("b's Campaign", &mut wb).await;
    within(
        "resign a",
        ETCD_READY,
        ElectionClient::new(c.raw_channel(node)).resign(elpb::ResignRequest {
            leader: Some(ka.clone()),
        }),
    )
    .await
    .expect("resign a");
    let kb = within("b elected", ETCD_READY, &mut wb)
        .await
        .expect("join")
        .expect("campaign b");
    assert!(kb.rev > ka.rev);
    assert_eq!(
        leader_value(c.raw_channel(other)).await.expect("leader"),
        "b1"
    );
    // a's stale key may not proclaim any more.
    let e = ElectionClient::new(c.raw_channel(node))
        .proclaim(elpb::ProclaimRequest {
            leader: Some(ka.clone()),
            value: b"a3".to_vec(),
        })
        .await
        .expect_err("a is not leader");
    assert_eq!(e.message(), "election: not leader");
    // A third candidate takes over when b's lease is revoked.
    let mut wc = tokio::spawn(campaign(c.raw_channel(node), cand, "c1"));
    still_waiting("c's Campaign", &mut wc).await;
    within(
        "revoke b",
        STEP,
        LeaseClient::new(c.raw_channel(node)).lease_revoke(epb::LeaseRevokeRequest { id: b }),
    )
    .await
    .expect("revoke b");
    let kc = within("c elected", STEP, &mut wc)
        .await
        .expect("join")
        .expect("campaign c");
    assert!(kc.rev > kb.rev);

    // The observer saw every term and value, in order: a1, a2, b1, c1.
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let msg = within("an observed change", STEP, observe.message())
            .await
            .expect("observe stream")
            .expect("observe open");
        let kv = msg.kv.unwrap_or_default();
        seen.push((
            String::from_utf8_lossy(&kv.value).into_owned(),
            kv.create_revision,
        ));
    }
    assert_eq!(
        seen,
        vec![
            ("a1".to_owned(), ka.rev),
            ("a2".to_owned(), ka.rev),
            ("b1".to_owned(), kb.rev),
            ("c1".to_owned(), kc.rev),
        ]
    );
}

/// `Observe` with etcd's require-leader metadata on a member that lost the majority ends
/// with "etcdserver: no leader" (a client then observes elsewhere); one without it stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_require_leader_observe_ends_when_its_member_loses_the_majority() {
    let c = TestCluster::start("etcd_election_hasleader", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let observe = |require: bool| {
        let ch = c.raw_channel(node);
        async move {
            let mut req = tonic::Request::new(elpb::LeaderRequest {
                name: b"hl".to_vec(),
            });
            if require {
                req.metadata_mut()
                    .insert("hasleader", "true".parse().expect("ascii"));
            }
            within(
                "observe opens",
                ETCD_READY,
                ElectionClient::new(ch).observe(req),
            )
            .await
            .expect("observe")
            .into_inner()
        }
    };
    let mut required = observe(true).await;
    let mut plain = observe(false).await;
    for id in c.ids().filter(|i| *i != node).collect::<Vec<_>>() {
        c.kill(id);
    }
    let end = within("the require-leader observe ends", STEP, required.message()).await;
    let status = end.expect_err("an error, not a message or the end");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "etcdserver: no leader");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), plain.message())
            .await
            .is_err(),
        "the observe without require-leader stays open"
    );
}

/// `Campaign` again by the leading lease with another value: the same term (key and token),
/// its value proclaimed, as etcd's Campaign does; with the same value, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigning_again_while_leading_proclaims_the_new_value() {
    let c = TestCluster::start("etcd_election_recampaign", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let lease = grant_lease(&c, leader, 60).await.id;
    let first = within(
        "campaign",
        STEP,
        campaign(c.raw_channel(leader), lease, "v1"),
    )
    .await
    .expect("campaign v1");
    let again = within(
        "campaign",
        STEP,
        campaign(c.raw_channel(leader), lease, "v2"),
    )
    .await
    .expect("campaign v2");
    assert_eq!((&again.key, again.rev), (&first.key, first.rev));
    let kv = get(c.raw_channel(leader), &first.key)
        .await
        .expect("the leader key");
    assert_eq!(kv.value, b"v2".to_vec());
    assert_eq!(kv.create_revision, first.rev);
    within(
        "campaign",
        STEP,
        campaign(c.raw_channel(leader), lease, "v2"),
    )
    .await
    .expect("campaign v2 again");
    let same = get(c.raw_channel(leader), &first.key).await.expect("key");
    assert_eq!(
        same.mod_revision, kv.mod_revision,
        "no write for the same value"
    );
}
