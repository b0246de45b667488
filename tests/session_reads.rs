//! Session and lease reads judge a session's deadline at the read's time (issue 39, item 4):
//! on a 3-node cluster whose leader proposes no expiry ticks (the test-only hook
//! `--unsafe-test-hold-ticks`, accepted only with `FENCED_UNSAFE_TEST_HOOKS=1`), a session past
//! its deadline on the leader's clock — still in every member's applied state, since no tick
//! removed it — is reported gone by every session read on every member: `Session.Watch`,
//! RESP's `fenced:lost:session:<id>` channel, `SESSION.INFO`, etcd's `LeaseTimeToLive` and
//! `LeaseLeases`.
//!
//! Run: `cargo test -p fenced-server --test session_reads`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use fenced_proto::v1 as pb;
use fenced_proto::v1::session_client::SessionClient;
use futures::StreamExt;
use support::{resp_connect, resp_try, within, TestCluster, LEADER_TIMEOUT};

/// The sessions' TTL: short, so that each check waits little for its session's deadline.
const TTL_MS: u64 = 300;
/// How long a read may take to report the session gone (a watch checks every 500 ms, a
/// subscribed RESP connection every second).
const REPORTED_WITHIN: Duration = Duration::from_secs(5);
const STEP: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Read {
    Watch,
    Subscribe,
    SessionInfo,
    LeaseTimeToLive,
    LeaseLeases,
}

/// A session opened through the leader, whose deadline has passed on the leader's clock.
async fn lapsed_session(c: &TestCluster, leader: u64) -> u64 {
    let mut con = resp_connect(c, leader).await;
    let id: i64 = support::resp_cmd(&mut con, &["SESSION.OPEN", &TTL_MS.to_string()]).await;
    tokio::time::sleep(Duration::from_millis(TTL_MS * 2)).await;
    id as u64
}

/// What `read` on member `m` says of session `s`: `Ok(())` if it reports it gone.
async fn reports_gone(c: &TestCluster, m: u64, s: u64, read: Read) -> Result<(), String> {
    match read {
        Read::Watch => {
            let mut client = SessionClient::new(c.raw_channel(m));
            let mut stream = within(
                "Session.Watch",
                STEP,
                client.watch(pb::WatchRequest { session: s }),
            )
            .await
            .map_err(|e| format!("watch: {e}"))?
            .into_inner();
            match tokio::time::timeout(REPORTED_WITHIN, stream.next()).await {
                Err(_) => Err(format!("no event in {REPORTED_WITHIN:?}")),
                Ok(Some(Ok(e))) if e.reason == "session_gone" => Ok(()),
                Ok(other) => Err(format!("{other:?}")),
            }
        }
        Read::Subscribe => {
            let client = redis::Client::open(format!("redis://{}/", c.resp_addr(m))).expect("url");
            let mut pubsub = within("pubsub", STEP, client.get_async_pubsub())
                .await
                .map_err(|e| format!("pubsub: {e}"))?;
            let channel = format!("fenced:lost:session:{s}");
            within("subscribe", STEP, pubsub.subscribe(&channel))
                .await
                .map_err(|e| format!("subscribe: {e}"))?;
            let mut messages = pubsub.on_message();
            match tokio::time::timeout(REPORTED_WITHIN, messages.next()).await {
                Err(_) => Err(format!("no message in {REPORTED_WITHIN:?}")),
                Ok(None) => Err("the subscription ended".into()),
                Ok(Some(msg)) => {
                    let payload: String = msg.get_payload().map_err(|e| e.to_string())?;
                    if payload.contains("session_gone") {
                        Ok(())
                    } else {
                        Err(payload)
                    }
                }
            }
        }
        Read::SessionInfo => {
            let mut con = resp_connect(c, m).await;
            let v: redis::Value = within(
                "SESSION.INFO",
                STEP,
                redis::cmd("SESSION.INFO").arg(s).query_async(&mut con),
            )
            .await
            .map_err(|e| e.to_string())?;
            match v {
                redis::Value::Nil => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
        Read::LeaseTimeToLive => {
            let mut lease = LeaseClient::new(c.raw_channel(m));
            let r = within(
                "LeaseTimeToLive",
                STEP,
                lease.lease_time_to_live(epb::LeaseTimeToLiveRequest {
                    id: s as i64,
                    keys: false,
                }),
            )
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
            if r.ttl == -1 {
                Ok(())
            } else {
                Err(format!("ttl {}", r.ttl))
            }
        }
        Read::LeaseLeases => {
            let mut lease = LeaseClient::new(c.raw_channel(m));
            let r = within(
                "LeaseLeases",
                STEP,
                lease.lease_leases(epb::LeaseLeasesRequest {}),
            )
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
            if r.leases.iter().any(|l| l.id == s as i64) {
                Err(format!("listed: {:?}", r.leases))
            } else {
                Ok(())
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_deadline_is_gone_for_every_session_read_on_every_member() {
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
    let c = TestCluster::start("session-reads", &["--unsafe-test-hold-ticks"]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // The cluster takes commands (a write through every member).
    for id in c.ids() {
        assert_eq!(
            resp_try(&c, id, &["SET", &format!("warm-{id}"), "v"]).await,
            Ok(Some("OK".into()))
        );
    }
    let mut failures = Vec::new();
    for read in [
        Read::Watch,
        Read::Subscribe,
        Read::SessionInfo,
        Read::LeaseTimeToLive,
        Read::LeaseLeases,
    ] {
        for m in c.ids() {
            // A new session each time: a read that commits the time expires it for all.
            let s = lapsed_session(&c, leader).await;
            if let Err(e) = reports_gone(&c, m, s, read).await {
                failures.push(format!(
                    "{read:?} on member {m} (leader {leader}): session {s} not reported gone: {e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
