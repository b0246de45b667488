//! One set of users for every port (issue 13, item 8), on a 3-node cluster of real `fenced`
//! processes started with `--acl-file`:
//!
//! * `alice` (`~lock:a*`, the fencing and string commands, not admin) takes `lock:a1` but not
//!   `lock:b` over gRPC (Lock calls, a multi-lock, a session's lock, Kv) **and** over RESP
//!   (`LOCK.ACQUIRE`, `SET`): `PERMISSION_DENIED` naming the user and the lock, RESP's
//!   `NOPERM`.
//! * `alice` cannot add, promote or remove members nor force-unlock (`PERMISSION_DENIED`),
//!   `admin` can — through the Rust client and through `fenced member … --user/--password`.
//! * Without a token a gRPC call is `UNAUTHENTICATED`; a wrong password is refused and
//!   issues nothing (client, `fenced status`); `Cluster.Status` stays open.
//! * The client logs in again by itself after its token expired (`--auth-token-ttl-ms`) and
//!   after the node restarted (it forgot every token).

mod support;

use std::process::Command;
use std::time::Duration;

use fenced_client::{Client, ClientError, LockOptions};
use fenced_proto::v1 as pb;
use fenced_proto::v1::auth_client::AuthClient;
use fenced_proto::v1::cluster_client::ClusterClient;
use support::{
    bin, follower_of, resp_connect_with, run_bounded, within, TestCluster, LEADER_TIMEOUT,
};
use tonic::Code;

const USERS: &str = "\
# issue 13 item 8: the same users on RESP and gRPC
user default off
user alice on >alicepw ~lock:a* &* -@all +@fencing +@string +@connection
user admin on >adminpw +@all ~*
";

const TTL: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_secs(30);
/// Short, so that the test sees a token expire.
const TOKEN_TTL_MS: u64 = 3_000;

fn as_user(c: &TestCluster, endpoints: Vec<String>, user: &str, pass: &str) -> Client {
    Client::connect_with(endpoints, c.client_options().with_credentials(user, pass))
        .expect("client")
}

/// The status code of a refused call, and its message.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) -> (Code, String) {
    match r {
        Err(ClientError::Rejected(s)) => (s.code(), s.message().to_owned()),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn assert_denied<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str, needles: &[&str]) {
    let (code, msg) = refusal(r, what);
    assert_eq!(code, Code::PermissionDenied, "{what}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "{what}: {msg:?} does not name {n:?}");
    }
}

/// `fenced ARGS…` with FENCED_PASSWORD = `password`: (success, stdout, stderr).
fn fenced(args: &[&str], password: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args).env_remove("FENCED_PASSWORD");
    if let Some(p) = password {
        cmd.env("FENCED_PASSWORD", p);
    }
    run_bounded(cmd, "", STEP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_of_users_for_grpc_and_resp() {
    let c = TestCluster::start_with("auth", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, USERS).expect("writing the ACL file");
        (
            vec![
                "--acl-file".into(),
                path.display().to_string(),
                "--auth-token-ttl-ms".into(),
                TOKEN_TTL_MS.to_string(),
            ],
            None,
        )
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let endpoints = c.endpoints().join(",");

    // --- Unauthenticated: no token, a bad token, a wrong password. -----------------------
    let anon = c.client();
    let (code, msg) = refusal(
        anon.acquire("lock:a1", "anon", TTL, Duration::ZERO, 0)
            .await,
        "acquire without a token",
    );
    assert_eq!(code, Code::Unauthenticated, "{msg}");
    assert!(msg.contains("Authenticate"), "says how to log in: {msg}");
    for r in [
        anon.member_remove(3).await.map(|_| ()),
        anon.force_unlock("lock:a1").await.map(|_| ()),
        anon.get("lock:a1").await.map(|_| ()),
    ] {
        assert_eq!(refusal(r, "anonymous call").0, Code::Unauthenticated);
    }
    let mut raw = c.raw_lock_client(follower, STEP);
    let mut req = tonic::Request::new(pb::InfoRequest {
        name: "lock:a1".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        "Bearer 0123456789abcdef".parse().expect("header"),
    );
    let s = raw.info(req).await.expect_err("a made-up token");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    // Status stays open (joining nodes, health checks and `fenced member list` read it).
    let s = anon.status().await.expect("Status needs no token");
    assert!(s.leader != 0);

    let wrong = as_user(&c, c.endpoints(), "alice", "not-her-password");
    let (code, msg) = refusal(
        wrong.acquire("lock:a1", "w", TTL, Duration::ZERO, 0).await,
        "wrong password",
    );
    assert_eq!(code, Code::Unauthenticated, "{msg}");
    assert!(msg.contains("invalid username-password pair"), "{msg}");
    let mut auth = AuthClient::new(c.raw_channel(follower));
    for (user, password) in [("alice", "x"), ("nobody", "alicepw"), ("default", "")] {
        let s = auth
            .authenticate(pb::AuthenticateRequest {
                user: user.into(),
                password: password.into(),
            })
            .await
            .expect_err("a bad login");
        assert_eq!(s.code(), Code::Unauthenticated, "{user}: {s:?}");
    }
    let (ok, _, err) = fenced(
        &["status", "--endpoints", &endpoints, "--user", "alice"],
        Some("wrong"),
    );
    assert!(!ok, "fenced status with a wrong password succeeded");
    assert!(err.contains("invalid username-password pair"), "{err}");
    assert!(
        anon.info("lock:a1").await.is_err(),
        "still nothing without a token"
    );

    // --- alice over gRPC: lock:a* yes, lock:b no. --------------------------------------
    let alice = as_user(&c, c.endpoints(), "alice", "alicepw");
    let g = alice
        .acquire("lock:a1", "alice-1", TTL, Duration::ZERO, 0)
        .await
        .expect("alice takes lock:a1")
        .expect("lock:a1 is free");
    assert_denied(
        alice
            .acquire("lock:b", "alice-1", TTL, Duration::ZERO, 0)
            .await,
        "alice takes lock:b over gRPC",
        &["alice", "'lock:b'", "lock.acquire"],
    );
    assert_denied(
        alice
            .acquire_with(pb::AcquireRequest {
                names: vec!["lock:a2".into(), "lock:b".into()],
                owner: "alice-2".into(),
                ttl_ms: 5_000,
                ..Default::default()
            })
            .await,
        "alice's multi-lock reaching lock:b",
        &["alice", "'lock:b'"],
    );
    assert_denied(
        alice.info("lock:b").await,
        "alice reads lock:b",
        &["'lock:b'"],
    );
    assert_denied(
        alice.release("lock:b", "x", 1).await,
        "alice releases lock:b",
        &["'lock:b'", "lock.release"],
    );
    assert_eq!(
        alice
            .info("lock:a1")
            .await
            .expect("alice reads lock:a1")
            .map(|i| i.token),
        Some(g.token)
    );
    // A session's lock (the guard API: Session.Open/Watch/KeepAlive, then Lock.Acquire).
    let guard = alice
        .lock("lock:a-session", LockOptions::default())
        .await
        .expect("alice's session lock")
        .expect("free");
    assert!(guard.token().is_some());
    assert_denied(
        alice
            .lock("lock:b", LockOptions::default())
            .await
            .map(|g| g.is_some()),
        "alice's session lock on lock:b",
        &["'lock:b'"],
    );
    // Keys alike (Kv is FENCE.SET / GET).
    alice
        .fenced_put("lock:a-data", b"v", g.token)
        .await
        .expect("fenced put")
        .expect("not stale");
    assert_denied(
        alice.fenced_put("data:b", b"v", g.token).await,
        "alice writes data:b",
        &["'data:b'", "fence.set"],
    );

    // --- alice over RESP: the same rule from the same file. ------------------------------
    let mut resp = resp_connect_with(&c, follower, Some(("alice", "alicepw"))).await;
    let token: Option<i64> = within(
        "LOCK.ACQUIRE lock:a3",
        STEP,
        redis::cmd("LOCK.ACQUIRE")
            .arg("lock:a3")
            .arg("alice-resp")
            .arg(30_000)
            .query_async(&mut resp),
    )
    .await
    .expect("alice takes lock:a3 over RESP");
    assert!(token.is_some_and(|t| t > g.token as i64), "{token:?}");
    for args in [
        vec!["LOCK.ACQUIRE", "lock:b", "alice-resp", "30000"],
        vec!["LOCK.INFO", "lock:b"],
        vec!["SET", "lock:b", "x", "NX", "PX", "30000"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let r: redis::RedisResult<redis::Value> =
            within(&format!("{args:?}"), STEP, cmd.query_async(&mut resp)).await;
        let e = r.expect_err("alice reached lock:b over RESP");
        assert!(
            e.to_string().contains("No permissions to access a key"),
            "{args:?}: {e}"
        );
    }
    let r: redis::RedisResult<redis::Value> = within(
        "ACL WHOAMI",
        STEP,
        redis::cmd("ACL").arg("WHOAMI").query_async(&mut resp),
    )
    .await;
    assert!(
        r.is_err_and(|e| e
            .to_string()
            .contains("has no permissions to run the 'acl'")),
        "alice is no administrator over RESP either"
    );

    // --- Administration: alice no, admin yes. ------------------------------------------
    let learner = c.grpc_addr(5);
    assert_denied(
        alice.member_add(5, &learner, true, Duration::ZERO).await,
        "alice adds a member",
        &["alice", "Cluster.MemberAdd"],
    );
    assert_denied(
        alice.member_remove(3).await,
        "alice removes a member",
        &["alice", "Cluster.MemberRemove"],
    );
    assert_denied(
        alice.member_promote(3).await,
        "alice promotes a member",
        &["alice", "Cluster.MemberPromote"],
    );
    assert_denied(
        alice.force_unlock("lock:a1").await,
        "alice force-unlocks",
        &["alice", "Lock.ForceUnlock"],
    );
    assert_denied(
        alice.snapshot_save().await.map(|_| ()),
        "alice takes a backup",
        &["alice", "Cluster.SnapshotSave"],
    );
    assert_denied(
        alice.leader_step_down().await,
        "alice moves the leader",
        &["alice", "Cluster.LeaderStepDown"],
    );
    assert_denied(
        alice.alarm_disarm().await,
        "alice disarms the cluster alarm",
        &["alice", "Cluster.Alarm"],
    );
    let alarms = alice
        .alarm_list()
        .await
        .expect("the alarm list is open to every user");
    assert!(alarms.cluster.is_none(), "{alarms:?}");
    let (ok, _, err) = fenced(
        &[
            "member",
            "remove",
            "3",
            "--endpoints",
            &endpoints,
            "--user",
            "alice",
        ],
        Some("alicepw"),
    );
    assert!(!ok, "alice removed a member with the CLI");
    assert!(
        err.contains("PermissionDenied") || err.contains("permission"),
        "{err}"
    );
    assert_eq!(
        c.status_ok(leader).await.members.len(),
        3,
        "nothing changed"
    );

    let admin = as_user(&c, c.endpoints(), "admin", "adminpw");
    assert!(
        admin
            .force_unlock("lock:a1")
            .await
            .expect("admin force-unlocks"),
        "lock:a1 was held"
    );
    assert!(alice.info("lock:a1").await.expect("info").is_none());
    // An administrator may disarm (until the leader has heard from every member it stamps
    // rules 0, under which no alarm exists and apply refuses the disarm itself: not denied).
    match admin.alarm_disarm().await {
        Ok(r) => assert!(r.disarmed.is_none(), "{r:?}"),
        Err(ClientError::Rejected(s)) => {
            assert_ne!(s.code(), Code::PermissionDenied, "admin's disarm: {s:?}")
        }
        Err(e) => panic!("admin's disarm: {e:?}"),
    }
    // The CLI: a learner that never starts is added and removed again by admin.
    let (ok, out, err) = fenced(
        &[
            "member",
            "add",
            "5",
            &learner,
            "--learner",
            "--endpoints",
            &endpoints,
            "--user",
            "admin",
        ],
        Some("adminpw"),
    );
    assert!(ok, "admin's member add: {err}");
    assert!(out.contains("\"role\":\"learner\""), "{out}");
    let (ok, out, err) = fenced(
        &[
            "member",
            "remove",
            "5",
            "--endpoints",
            &endpoints,
            "--user",
            "admin",
            "--password",
            "adminpw",
        ],
        None,
    );
    assert!(ok, "admin's member remove: {err}");
    assert!(!out.contains("\"id\":5"), "{out}");
    let (ok, out, err) = fenced(
        &["status", "--endpoints", &endpoints, "--user", "admin"],
        Some("adminpw"),
    );
    assert!(ok && out.contains("\"leader\""), "{out} {err}");

    // --- Tokens expire and nodes forget them: the client logs in again. ----------------
    let one = as_user(&c, vec![c.grpc_addr(follower)], "alice", "alicepw");
    one.acquire("lock:a4", "alice-4", TTL, Duration::ZERO, 0)
        .await
        .expect("before expiry");
    tokio::time::sleep(Duration::from_millis(TOKEN_TTL_MS + 500)).await;
    one.info("lock:a4")
        .await
        .expect("after the token expired")
        .expect("lock:a4 held");
    // A raw call with an expired token is refused.
    let mut auth = AuthClient::new(c.raw_channel(follower));
    let t = auth
        .authenticate(pb::AuthenticateRequest {
            user: "alice".into(),
            password: "alicepw".into(),
        })
        .await
        .expect("login")
        .into_inner();
    assert_eq!(t.ttl_ms, TOKEN_TTL_MS);
    tokio::time::sleep(Duration::from_millis(TOKEN_TTL_MS + 200)).await;
    let mut req = tonic::Request::new(pb::MemberRemoveRequest { id: 3 });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", t.token).parse().expect("header"),
    );
    let s = ClusterClient::new(c.raw_channel(follower))
        .member_remove(req)
        .await
        .expect_err("an expired token");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(s.message().contains("expired"), "{s:?}");

    // A restarted node knows no token; the client notices and logs in again.
    let fresh = as_user(&c, vec![c.grpc_addr(follower)], "alice", "alicepw");
    fresh
        .info("lock:a4")
        .await
        .expect("a token from before the restart");
    c.kill(follower);
    c.restart(follower);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    fresh
        .info("lock:a4")
        .await
        .expect("after the restart, with a new token")
        .expect("lock:a4 still held");
    drop(guard);
}
