//! The lock family over RESP (issue 26; docs/resp.md, "The lock family") with redis-rs and raw
//! sockets against 3-node clusters of real `fenced` processes (loopback only):
//!
//! * read-write locks (shared readers, a queued writer blocking new readers), semaphores with
//!   expirable permits, atomic multi-locks, lock-delay, force-unlock, FIFO waiters, and the
//!   kinds refusing each other — every token larger than the last;
//! * sessions: a grant in a session lapses with it, and the lapse is pushed on the lock-loss
//!   channels — to a RESP2 subscriber (redis-rs `PubSub`) and as a RESP3 push frame on a
//!   connection that goes on sending commands;
//! * `REQID`: a retry on another connection (another node) is answered with the first outcome
//!   and does not act twice; ids are namespaced by user (RESP and gRPC): another user's same
//!   id neither replays nor reads the first user's answer;
//! * ACL key patterns apply to lock names (every name of a multi-lock), force-unlock is
//!   admin-only;
//! * a waiter queued on a follower is handed the lock after the leader is SIGKILLed.

mod support;

use std::time::{Duration, Instant};

use fenced_proto::v1 as pb;
use fenced_proto::v1::auth_client::AuthClient;
use fenced_proto::v1::lock_client::LockClient;
use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::Value;
use support::{
    follower_of, resp_cmd as cmd, resp_cmd_err as cmd_err, resp_connect as connect,
    resp_connect_with, within, TestCluster, LEADER_TIMEOUT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STEP: Duration = Duration::from_secs(20);

/// `LOCK.INFO`'s (or `SESSION.INFO`'s) flat map as (field, value) pairs; empty when nil.
async fn info(con: &mut MultiplexedConnection, args: &[&str]) -> Vec<(String, Value)> {
    let v: Value = cmd(con, args).await;
    let items = match v {
        Value::Nil => return Vec::new(),
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect::<Vec<_>>(),
        Value::Map(m) => m,
        other => panic!("{args:?}: {other:?}"),
    };
    items
        .into_iter()
        .map(|(k, v)| match k {
            Value::BulkString(k) => (String::from_utf8_lossy(&k).into_owned(), v),
            other => panic!("{args:?}: key {other:?}"),
        })
        .collect()
}

fn field<'a>(info: &'a [(String, Value)], name: &str) -> &'a Value {
    &info
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {info:?}"))
        .1
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

/// Waits (bounded) until `LOCK.INFO name` shows `n` waiters.
async fn until_waiters(con: &mut MultiplexedConnection, name: &str, n: i64) {
    let deadline = Instant::now() + STEP;
    loop {
        let i = info(con, &["LOCK.INFO", name]).await;
        if !i.is_empty() && int(field(&i, "waiters")) == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never {n} waiters: {i:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A waiting acquire on its own connection: the token or nil.
fn spawn_acquire(
    mut con: MultiplexedConnection,
    args: Vec<String>,
) -> tokio::task::JoinHandle<Option<i64>> {
    tokio::spawn(async move {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        cmd::<Option<i64>>(&mut con, &a).await
    })
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_family_over_resp() {
    let c = TestCluster::start("resp_locks", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let mut con = connect(&c, f).await;

    // --- Read-write lock: readers share, a queued writer blocks new readers. ------------
    let r1: i64 = cmd(&mut con, &["LOCK.READ", "doc", "r1", "30000"]).await;
    let r2: i64 = cmd(&mut con, &["LOCK.READ", "doc", "r2", "30000"]).await;
    assert!(r2 > r1, "tokens grow: {r1} {r2}");
    let w: Option<i64> = cmd(&mut con, &["LOCK.WRITE", "doc", "w", "30000"]).await;
    assert_eq!(w, None, "a writer while readers hold it");
    let writer = spawn_acquire(
        connect(&c, leader).await,
        strings(&["LOCK.WRITE", "doc", "w", "30000", "WAIT", "15000"]),
    );
    until_waiters(&mut con, "doc", 1).await;
    let r3: Option<i64> = cmd(&mut con, &["LOCK.READ", "doc", "r3", "30000"]).await;
    assert_eq!(r3, None, "a queued writer blocks new readers");
    let i = info(&mut con, &["LOCK.INFO", "doc"]).await;
    assert_eq!(
        field(&i, "kind"),
        &Value::BulkString(b"read-write".to_vec())
    );
    let Value::Array(holders) = field(&i, "holders") else {
        panic!("{i:?}")
    };
    assert_eq!(holders.len(), 2, "two readers: {i:?}");
    for (who, t) in [("r1", r1), ("r2", r2)] {
        let r: i64 = cmd(&mut con, &["LOCK.RELEASE", "doc", who, &t.to_string()]).await;
        assert_eq!(r, 1);
    }
    let tw = within("the writer", STEP, writer)
        .await
        .expect("task")
        .expect("the writer is granted once the readers left");
    assert!(tw > r2, "the writer's token {tw} > {r2}");
    let again: i64 = cmd(&mut con, &["LOCK.RELEASE", "doc", "w", &r2.to_string()]).await;
    assert_eq!(again, 0, "not held with another token");
    let kind = cmd_err(&mut con, &["LOCK.ACQUIRE", "doc", "x", "1000"]).await;
    assert!(
        kind.contains("read-write"),
        "kinds refuse each other: {kind}"
    );

    // --- Semaphore with expirable permits. ------------------------------------------------
    let p1: i64 = cmd(&mut con, &["LOCK.PERMIT", "pool", "a", "2", "30000"]).await;
    let p2: i64 = cmd(&mut con, &["LOCK.PERMIT", "pool", "b", "2", "30000"]).await;
    assert!(p2 > p1);
    let none: Option<i64> = cmd(&mut con, &["LOCK.PERMIT", "pool", "c", "2", "30000"]).await;
    assert_eq!(none, None, "both permits taken");
    let third = spawn_acquire(
        connect(&c, f).await,
        strings(&["LOCK.PERMIT", "pool", "c", "2", "30000", "WAIT", "15000"]),
    );
    until_waiters(&mut con, "pool", 1).await;
    let i = info(&mut con, &["LOCK.INFO", "pool"]).await;
    assert_eq!(int(field(&i, "permits")), 2);
    let r: i64 = cmd(&mut con, &["LOCK.RELEASE", "pool", "a", &p1.to_string()]).await;
    assert_eq!(r, 1);
    let p3 = within("the third permit", STEP, third)
        .await
        .expect("task")
        .expect("granted when a permit came back");
    assert!(p3 > p2);

    // --- Atomic multi-lock: all or none, one token. ---------------------------------------
    let m2: i64 = cmd(&mut con, &["LOCK.ACQUIRE", "m2", "x", "30000"]).await;
    let none: Option<i64> = cmd(
        &mut con,
        &["LOCK.MACQUIRE", "o", "30000", "3", "m1", "m2", "m3"],
    )
    .await;
    assert_eq!(none, None);
    assert!(
        info(&mut con, &["LOCK.INFO", "m1"]).await.is_empty(),
        "none"
    );
    let r: i64 = cmd(&mut con, &["LOCK.RELEASE", "m2", "x", &m2.to_string()]).await;
    assert_eq!(r, 1);
    let t: i64 = cmd(
        &mut con,
        &["LOCK.MACQUIRE", "o", "30000", "3", "m1", "m2", "m3"],
    )
    .await;
    for n in ["m1", "m2", "m3"] {
        let i = info(&mut con, &["LOCK.INFO", n]).await;
        assert_eq!(int(field(&i, "token")), t, "{n}: one token");
    }
    let r: i64 = cmd(
        &mut con,
        &["LOCK.MRELEASE", "o", &t.to_string(), "3", "m1", "m2", "m3"],
    )
    .await;
    assert_eq!(r, 1);
    assert!(info(&mut con, &["LOCK.INFO", "m3"]).await.is_empty());

    // --- FIFO: waiters are served in the order they queued. ------------------------------
    let h: i64 = cmd(&mut con, &["LOCK.ACQUIRE", "fifo", "h", "30000"]).await;
    let mut waiters = Vec::new();
    for (k, who) in ["w1", "w2", "w3"].iter().enumerate() {
        let mut wc = connect(&c, [leader, f][k % 2]).await;
        let who = who.to_string();
        waiters.push(tokio::spawn(async move {
            let t: i64 = cmd(
                &mut wc,
                &["LOCK.ACQUIRE", "fifo", &who, "30000", "WAIT", "15000"],
            )
            .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let r: i64 = cmd(&mut wc, &["LOCK.RELEASE", "fifo", &who, &t.to_string()]).await;
            assert_eq!(r, 1);
            t
        }));
        until_waiters(&mut con, "fifo", k as i64 + 1).await;
    }
    let r: i64 = cmd(&mut con, &["LOCK.RELEASE", "fifo", "h", &h.to_string()]).await;
    assert_eq!(r, 1);
    let mut tokens = Vec::new();
    for w in waiters {
        tokens.push(within("a FIFO waiter", STEP, w).await.expect("task"));
    }
    assert!(
        tokens.windows(2).all(|p| p[0] < p[1]) && tokens[0] > h,
        "granted in queue order: {tokens:?}"
    );

    // --- Lock-delay: after an expiry, nobody gets it for DELAY ms. -----------------------
    let _d: i64 = cmd(
        &mut con,
        &["LOCK.ACQUIRE", "delayed", "a", "300", "DELAY", "3000"],
    )
    .await;
    let expired = Instant::now();
    let deadline = expired + STEP;
    while !info(&mut con, &["LOCK.INFO", "delayed"]).await.is_empty() {
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let blocked: Option<i64> = cmd(&mut con, &["LOCK.ACQUIRE", "delayed", "b", "30000"]).await;
    assert_eq!(blocked, None, "inside the lock-delay");
    let later: i64 = cmd(
        &mut con,
        &["LOCK.ACQUIRE", "delayed", "b", "30000", "WAIT", "10000"],
    )
    .await;
    assert!(later > 0);
    assert!(
        expired.elapsed() >= Duration::from_millis(2_500),
        "granted only after the delay: {:?}",
        expired.elapsed()
    );

    // --- Force-unlock (the default user is admin). -----------------------------------------
    let _fu: i64 = cmd(&mut con, &["LOCK.ACQUIRE", "stuck", "gone", "60000"]).await;
    let r: i64 = cmd(&mut con, &["LOCK.FORCEUNLOCK", "stuck"]).await;
    assert_eq!(r, 1);
    assert!(info(&mut con, &["LOCK.INFO", "stuck"]).await.is_empty());
    let r: i64 = cmd(&mut con, &["LOCK.FORCEUNLOCK", "stuck"]).await;
    assert_eq!(r, 0, "nobody holds it now");

    // --- REQID: a retry on another node is answered once. ----------------------------------
    let mut other = connect(&c, leader).await;
    let a = ["LOCK.ACQUIRE", "rq", "me", "30000", "REQID", "4242", "1"];
    let t1: i64 = cmd(&mut con, &a).await;
    let t2: i64 = cmd(&mut other, &a).await;
    assert_eq!(t1, t2, "the retry gets the first grant");
    let i = info(&mut other, &["LOCK.INFO", "rq"]).await;
    assert_eq!(
        int(field(&i, "holds")),
        1,
        "and does not take a second hold"
    );
    let rel = [
        "LOCK.RELEASE",
        "rq",
        "me",
        &t1.to_string(),
        "REQID",
        "4242",
        "2",
    ];
    let first: i64 = cmd(&mut other, &rel).await;
    let retry: i64 = cmd(&mut con, &rel).await;
    assert_eq!(
        (first, retry),
        (1, 1),
        "the retried release answers its first outcome"
    );
    let bad = cmd_err(
        &mut con,
        &["LOCK.ACQUIRE", "rq", "me", "1", "REQID", "0", "1"],
    )
    .await;
    assert!(bad.contains("nonzero"), "{bad}");
}

/// Reads lock-loss JSON messages from a RESP2 subscription until one has `reason`.
async fn next_reason(
    stream: &mut (impl futures::Stream<Item = redis::Msg> + Unpin),
    reason: &str,
) -> serde_json::Value {
    within(&format!("a {reason} message"), STEP, async {
        loop {
            let msg = stream.next().await.expect("subscription open");
            let payload: String = msg.get_payload().expect("payload");
            let v: serde_json::Value = serde_json::from_str(&payload).expect("JSON");
            if v["reason"] == reason {
                return v;
            }
        }
    })
    .await
}

/// A raw RESP3 connection: `HELLO 3`, then `SUBSCRIBE channel`, then commands on the same
/// connection while waiting for push frames.
struct Raw {
    s: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(addr: &str) -> Raw {
        let s = within("raw connect", STEP, tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect");
        Raw { s, buf: Vec::new() }
    }

    async fn send(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.s.write_all(out.as_bytes()).await.expect("write");
    }

    /// Reads until the bytes received contain `needle`; returns everything so far.
    async fn until(&mut self, needle: &str) -> String {
        within(&format!("raw bytes {needle:?}"), STEP, async {
            loop {
                let text = String::from_utf8_lossy(&self.buf).into_owned();
                if text.contains(needle) {
                    return text;
                }
                let mut chunk = [0u8; 4096];
                let n = self.s.read(&mut chunk).await.expect("read");
                assert!(n > 0, "closed; got {text:?}");
                self.buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_lapse_and_say_so_on_the_lock_loss_channels() {
    let c = TestCluster::start("resp_sessions", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let mut con = connect(&c, f).await;
    let s: i64 = cmd(&mut con, &["SESSION.OPEN", "2000"]).await;
    let sid = s.to_string();

    // RESP2: a pub/sub connection of its own.
    let client = redis::Client::open(format!("redis://{}/", c.resp_addr(f))).expect("url");
    let mut pubsub = within("pubsub", STEP, client.get_async_pubsub())
        .await
        .expect("pubsub");
    let channel = format!("fenced:lost:session:{sid}");
    within("subscribe", STEP, pubsub.subscribe(&channel))
        .await
        .expect("subscribe");
    let mut messages = pubsub.on_message();
    // RESP3: pushes on a connection that goes on with commands.
    let mut raw = Raw::connect(&c.resp_addr(leader)).await;
    raw.send(&["HELLO", "3"]).await;
    raw.until("proto").await;
    raw.send(&["SUBSCRIBE", "fenced:lost:owner:sess-owner"])
        .await;
    raw.until("subscribe").await;
    raw.send(&["PING"]).await;
    raw.until("PONG").await;

    let t: i64 = cmd(
        &mut con,
        &[
            "LOCK.ACQUIRE",
            "in-session",
            "sess-owner",
            "0",
            "SESSION",
            &sid,
        ],
    )
    .await;
    let left: i64 = cmd(&mut con, &["SESSION.KEEPALIVE", &sid]).await;
    assert!(left > 0 && left <= 2000, "lease left {left}");
    let i = info(&mut con, &["SESSION.INFO", &sid]).await;
    assert_eq!(
        field(&i, "locks"),
        &Value::Array(vec![Value::BulkString(b"in-session".to_vec())])
    );
    let renew = cmd_err(
        &mut con,
        &[
            "LOCK.RENEW",
            "in-session",
            "sess-owner",
            &t.to_string(),
            "1000",
        ],
    )
    .await;
    assert!(renew.contains("session"), "{renew}");

    // No more keep-alives: the session lapses, and both subscribers hear it.
    let v = next_reason(&mut messages, "session_expired").await;
    assert_eq!(v["name"], "in-session");
    assert_eq!(v["token"], t);
    assert_eq!(v["session"], s);
    let gone = next_reason(&mut messages, "session_gone").await;
    assert_eq!(gone["session"], s);
    let pushed = raw.until("session_expired").await;
    assert!(pushed.contains(">3\r\n"), "a RESP3 push frame: {pushed:?}");
    raw.send(&["LOCK.INFO", "in-session"]).await;
    raw.until("_\r\n").await;
    assert!(info(&mut con, &["LOCK.INFO", "in-session"])
        .await
        .is_empty());
    let alive: Option<i64> = cmd(&mut con, &["SESSION.KEEPALIVE", &sid]).await;
    assert_eq!(alive, None, "the session is gone");
    let closed: i64 = cmd(&mut con, &["SESSION.CLOSE", &sid]).await;
    assert_eq!(closed, 0);

    // A closed session releases its locks, and says so.
    let s2: i64 = cmd(&mut con, &["SESSION.OPEN", "60000"]).await;
    let t2: i64 = cmd(
        &mut con,
        &[
            "LOCK.READ",
            "shared",
            "sess-owner",
            "0",
            "SESSION",
            &s2.to_string(),
        ],
    )
    .await;
    let closed: i64 = cmd(&mut con, &["SESSION.CLOSE", &s2.to_string()]).await;
    assert_eq!(closed, 1);
    raw.until(&format!("\"token\":{t2}")).await;
    assert!(info(&mut con, &["LOCK.INFO", "shared"]).await.is_empty());

    // --- A waiter queued on a follower is handed the lock through a leader SIGKILL. -------
    let holder: i64 = cmd(&mut con, &["LOCK.ACQUIRE", "handoff", "h", "60000"]).await;
    let waiter = spawn_acquire(
        connect(&c, f).await,
        strings(&["LOCK.ACQUIRE", "handoff", "w", "60000", "WAIT", "40000"]),
    );
    until_waiters(&mut con, "handoff", 1).await;
    c.kill(leader);
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, leader);
    let mut n = connect(&c, new_leader).await;
    let deadline = Instant::now() + STEP;
    loop {
        let mut c2 = redis::cmd("LOCK.RELEASE");
        c2.arg("handoff")
            .arg("h")
            .arg(holder)
            .arg("REQID")
            .arg(77)
            .arg(1);
        match within("release", STEP, c2.query_async::<i64>(&mut n)).await {
            Ok(r) => {
                assert_eq!(r, 1, "released");
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "the release never went through: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = within("the waiter", Duration::from_secs(60), waiter)
        .await
        .expect("task")
        .expect("the waiter is granted after the failover");
    assert!(
        got > holder,
        "the waiter's token {got} > the holder's {holder}"
    );
}

const USERS: &str = "\
user default off
user alice on >alicepw ~app:* &* -@all +@fencing +@connection +@pubsub
user bob on >bobpw ~app:* &* -@all +@fencing +@connection
user admin on >adminpw +@all ~* &*
";

/// A gRPC `Lock.Acquire` as `user` (logged in on node `id`) with request id `(77, 1)`.
async fn grpc_acquire(
    c: &TestCluster,
    id: u64,
    user: &str,
    pass: &str,
    name: &str,
) -> pb::AcquireResponse {
    let t = AuthClient::new(c.raw_channel(id))
        .authenticate(pb::AuthenticateRequest {
            user: user.into(),
            password: pass.into(),
        })
        .await
        .expect("login")
        .into_inner();
    let mut req = tonic::Request::new(pb::AcquireRequest {
        request: Some(pb::RequestId {
            client_id: 77,
            seq: 1,
        }),
        name: name.into(),
        owner: user.into(),
        ttl_ms: 30_000,
        ..Default::default()
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", t.token).parse().expect("header"),
    );
    LockClient::new(c.raw_channel(id))
        .acquire(req)
        .await
        .expect("acquire")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_names_are_acl_keys_and_request_ids_are_per_user() {
    let c = TestCluster::start_with("resp_lock_acl", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, USERS).expect("acl file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let mut alice = resp_connect_with(&c, f, Some(("alice", "alicepw"))).await;
    let mut bob = resp_connect_with(&c, leader, Some(("bob", "bobpw"))).await;
    let mut admin = resp_connect_with(&c, f, Some(("admin", "adminpw"))).await;

    let t: i64 = cmd(&mut alice, &["LOCK.READ", "app:x", "alice", "30000"]).await;
    assert!(t > 0);
    let e = cmd_err(&mut alice, &["LOCK.READ", "other:x", "alice", "30000"]).await;
    assert!(e.contains("No permissions to access a key"), "{e}");
    let e = cmd_err(
        &mut alice,
        &["LOCK.MACQUIRE", "alice", "30000", "2", "app:1", "other:1"],
    )
    .await;
    assert!(
        e.contains("No permissions to access a key"),
        "every name is a key: {e}"
    );
    assert!(
        info(&mut admin, &["LOCK.INFO", "app:1"]).await.is_empty(),
        "nothing taken"
    );
    let e = cmd_err(&mut alice, &["LOCK.FORCEUNLOCK", "app:x"]).await;
    assert!(
        e.contains("has no permissions to run the 'lock.forceunlock' command"),
        "force-unlock is for admins: {e}"
    );
    let r: i64 = cmd(&mut admin, &["LOCK.FORCEUNLOCK", "app:x"]).await;
    assert_eq!(r, 1);

    // The same REQID from two users: two requests, not a replay of alice's answer.
    let mine: i64 = cmd(
        &mut alice,
        &[
            "LOCK.ACQUIRE",
            "app:r",
            "alice",
            "30000",
            "REQID",
            "99",
            "1",
        ],
    )
    .await;
    let theirs: Option<i64> = cmd(
        &mut bob,
        &["LOCK.ACQUIRE", "app:r", "bob", "30000", "REQID", "99", "1"],
    )
    .await;
    assert_eq!(theirs, None, "bob's request is his own (alice got {mine})");
    let again: i64 = cmd(
        &mut alice,
        &[
            "LOCK.ACQUIRE",
            "app:r",
            "alice",
            "30000",
            "REQID",
            "99",
            "1",
        ],
    )
    .await;
    assert_eq!(again, mine, "alice's retry still finds her answer");

    // gRPC: the same request id (77, 1) as alice and as bob.
    let a = grpc_acquire(&c, f, "alice", "alicepw", "app:g").await;
    assert!(a.granted);
    let b = grpc_acquire(&c, leader, "bob", "bobpw", "app:g").await;
    assert!(
        !b.granted,
        "bob's call is not answered with alice's stored grant (token {})",
        a.token
    );
    let a2 = grpc_acquire(&c, leader, "alice", "alicepw", "app:g").await;
    assert_eq!((a2.granted, a2.token), (true, a.token), "alice's retry is");
}
