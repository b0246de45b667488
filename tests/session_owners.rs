//! Issue 49, defect 4, on a 3-node cluster of real `fenced` processes with an ACL file:
//! sessions belong to the user who opened them. With bob's session holding `lock:bs`,
//! alice (only `~lock:a*`) can neither see it, keep it alive, acquire in it nor close it —
//! over RESP (`SESSION.*`, `LOCK.ACQUIRE … SESSION`), gRPC (`Session.*`, `Lock.Acquire` in a
//! session) and etcd's API (`LeaseKeepAlive`, `LeaseTimeToLive`, `LeaseLeases`,
//! `LeaseRevoke`, `Lock` with the lease); an administrator can; bob can, and closes it.

mod support;

use std::time::Duration;

use fenced_client::{Client, ClientError};
use fenced_proto::v1 as pb;
use support::{
    follower_of, resp_cmd as cmd, resp_connect_with, within, TestCluster, LEADER_TIMEOUT,
};
use tonic::Code;

const USERS: &str = "\
user default off
user admin on >adminpw +@all ~* &*
user alice on >alicepw ~lock:a* &* -@all +@fencing +@connection
user bob on >bobpw ~lock:b* &* -@all +@fencing +@connection
";

const STEP: Duration = Duration::from_secs(20);

fn grpc_as(c: &TestCluster, id: u64, user: &str, pass: &str) -> Client {
    Client::connect_with(
        c.endpoints_of(&[id]),
        c.client_options().with_credentials(user, pass),
    )
    .expect("client")
}

fn denied<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) {
    match r {
        Err(ClientError::Rejected(s)) => {
            assert_eq!(s.code(), Code::PermissionDenied, "{what}: {s:?}");
        }
        other => panic!("{what}: expected PERMISSION_DENIED, got {other:?}"),
    }
}

async fn etcd_as(c: &TestCluster, id: u64, user: &str, pass: &str) -> etcd_client::Client {
    let opts = etcd_client::ConnectOptions::new()
        .with_user(user, pass)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    within(
        &format!("etcd connection as {user}"),
        STEP,
        etcd_client::Client::connect([format!("http://{}", c.grpc_addr(id))], Some(opts)),
    )
    .await
    .unwrap_or_else(|e| panic!("etcd connect as {user}: {e}"))
}

async fn resp_err(con: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> String {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    match within(
        &format!("{args:?}"),
        STEP,
        c.query_async::<redis::Value>(con),
    )
    .await
    {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?}: expected a refusal, got {v:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_its_user_on_every_protocol() {
    let c = TestCluster::start_with("session_owners", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, USERS).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // Only once the leader stamps the rules with session owners (its first check round).
    c.wait_for_stamp(leader, 8).await;
    let node = follower_of(leader);

    // --- RESP ---------------------------------------------------------------------------
    let mut bob = resp_connect_with(&c, node, Some(("bob", "bobpw"))).await;
    let mut alice = resp_connect_with(&c, node, Some(("alice", "alicepw"))).await;
    let mut admin = resp_connect_with(&c, leader, Some(("admin", "adminpw"))).await;
    let s: u64 = cmd(&mut bob, &["SESSION.OPEN", "60000"]).await;
    let sid = s.to_string();
    let token: u64 = cmd(
        &mut bob,
        &["LOCK.ACQUIRE", "lock:bs", "bob", "60000", "SESSION", &sid],
    )
    .await;
    assert!(token > 0);
    for args in [
        vec!["SESSION.INFO", sid.as_str()],
        vec!["SESSION.KEEPALIVE", sid.as_str()],
        vec![
            "LOCK.ACQUIRE",
            "lock:a1",
            "alice",
            "60000",
            "SESSION",
            sid.as_str(),
        ],
        vec!["SESSION.CLOSE", sid.as_str()],
    ] {
        let e = resp_err(&mut alice, &args).await;
        // redis-rs shows `-NOPERM …` as `NoPerm: …`.
        assert!(
            e.to_ascii_uppercase().contains("NOPERM"),
            "alice {args:?}: {e}"
        );
    }
    // The administrator and bob may; bob's lock is still his.
    let left: i64 = cmd(&mut admin, &["SESSION.KEEPALIVE", &sid]).await;
    assert!(left > 0, "admin keep-alive: {left}");
    let info: redis::Value = cmd(&mut bob, &["SESSION.INFO", &sid]).await;
    assert!(format!("{info:?}").contains("lock:bs"), "{info:?}");
    let closed: i64 = cmd(&mut bob, &["SESSION.CLOSE", &sid]).await;
    assert_eq!(closed, 1);

    // --- gRPC ---------------------------------------------------------------------------
    let bob = grpc_as(&c, node, "bob", "bobpw");
    let alice = grpc_as(&c, node, "alice", "alicepw");
    let admin = grpc_as(&c, leader, "admin", "adminpw");
    let s = bob
        .open_session(Duration::from_secs(60))
        .await
        .expect("bob opens a session");
    denied(
        alice.keep_alive(s).await,
        "alice's keep-alive of bob's session",
    );
    denied(
        alice
            .acquire_with(pb::AcquireRequest {
                name: "lock:a2".into(),
                owner: "alice".into(),
                session: s,
                ..Default::default()
            })
            .await,
        "alice's acquire in bob's session",
    );
    denied(alice.close_session(s).await, "alice closing bob's session");
    match alice.watch(s).await {
        Err(ClientError::Rejected(st)) => assert_eq!(st.code(), Code::PermissionDenied),
        Err(e) => panic!("alice watching bob's session: {e:?}"),
        Ok(_) => panic!("alice may watch bob's session"),
    }
    assert!(admin.keep_alive(s).await.expect("admin keep-alive"));
    assert!(bob.keep_alive(s).await.expect("bob keep-alive"));
    assert!(bob.close_session(s).await.expect("bob closes"));

    // --- etcd's API -----------------------------------------------------------------------
    let mut bob = etcd_as(&c, node, "bob", "bobpw").await;
    let mut alice = etcd_as(&c, node, "alice", "alicepw").await;
    let lease = bob.lease_grant(60, None).await.expect("bob's lease").id();
    // A keep-alive of another user's lease finds no lease (TTL 0, which etcd-client reports
    // as "lease not found"), as for one not there.
    match alice.lease_keep_alive(lease).await {
        Err(e) => assert!(e.to_string().contains("lease not found"), "{e}"),
        Ok((_, mut answers)) => {
            let answer = within("alice's keep-alive answer", STEP, answers.message()).await;
            let ttl = answer.ok().flatten().map_or(0, |a| a.ttl());
            assert_eq!(ttl, 0, "alice kept bob's lease alive");
        }
    }
    let ttl = alice
        .lease_time_to_live(lease, None)
        .await
        .expect("time to live");
    assert_eq!(ttl.ttl(), -1, "alice sees bob's lease: {ttl:?}");
    let leases = alice.leases().await.expect("leases");
    assert!(
        leases.leases().iter().all(|l| l.id() != lease),
        "alice lists bob's lease"
    );
    let e = alice
        .lock(
            "lock:a3",
            Some(etcd_client::LockOptions::new().with_lease(lease)),
        )
        .await
        .expect_err("alice locks with bob's lease");
    assert!(
        format!("{e:?}").contains("PermissionDenied") || e.to_string().contains("another user"),
        "{e:?}"
    );
    let e = alice
        .lease_revoke(lease)
        .await
        .expect_err("alice revokes bob's lease");
    assert!(
        format!("{e:?}").contains("PermissionDenied") || e.to_string().contains("another user"),
        "{e:?}"
    );
    let ttl = bob
        .lease_time_to_live(lease, None)
        .await
        .expect("bob's ttl");
    assert!(ttl.ttl() > 0, "bob's lease is gone: {ttl:?}");
    bob.lease_revoke(lease)
        .await
        .expect("bob revokes his lease");
    c.assert_alive();
}
