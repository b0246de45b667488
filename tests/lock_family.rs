//! The lock family through the Rust client against a real 3-node cluster: read-write locks,
//! semaphores, atomic multi-locks, lock-delay, force-unlock and lock-loss events.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_client::{Client, ClientOptions, LockOptions};
use support::{within, TestCluster};

const T: Duration = Duration::from_secs(20);

fn client(c: &TestCluster, session_ttl: Duration) -> Client {
    Client::connect_with(
        c.endpoints(),
        ClientOptions {
            session_ttl,
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_lock_shares_readers_and_queues_writers_fairly() {
    let c = TestCluster::start("rwlock", &[]);
    c.wait_for_leader(T).await;
    let a = client(&c, Duration::from_secs(10));
    let b = client(&c, Duration::from_secs(10));
    let now = LockOptions::default();

    let r1 = within("reader 1", T, a.read_lock("doc", now))
        .await
        .expect("r1")
        .expect("granted");
    let r2 = within("reader 2", T, b.read_lock("doc", now))
        .await
        .expect("r2")
        .expect("granted");
    assert!(
        r2.token() > r1.token(),
        "each read grant has its own, larger token"
    );
    assert!(
        within("writer try", T, b.write_lock("doc", now))
            .await
            .expect("w")
            .is_none(),
        "a writer got in beside two readers"
    );

    // A writer waits; a reader arriving after it must queue behind it.
    let writer = {
        let b = b.clone();
        tokio::spawn(async move {
            b.write_lock("doc", LockOptions::wait(Duration::from_secs(15)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        within("late reader", T, a.read_lock("doc", now))
            .await
            .expect("r3")
            .is_none(),
        "a new reader overtook a queued writer"
    );
    let info = a.info("doc").await.expect("info").expect("held");
    assert_eq!(
        (info.kind.as_str(), info.holders.len(), info.waiters),
        ("read-write", 2, 1)
    );

    let last_read = r2.token().expect("valid");
    r1.release().await.expect("release r1");
    r2.release().await.expect("release r2");
    let w = within("writer granted", T, writer)
        .await
        .expect("join")
        .expect("w")
        .expect("granted");
    assert!(w.token().expect("valid") > last_read);
    w.release().await.expect("release w");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_exceeds_its_permits() {
    let c = TestCluster::start("semaphore", &[]);
    c.wait_for_leader(T).await;
    let cl = client(&c, Duration::from_secs(10));
    let now = LockOptions::default();
    let p1 = cl
        .semaphore("pool", 2, now)
        .await
        .expect("p1")
        .expect("granted");
    let p2 = cl
        .semaphore("pool", 2, now)
        .await
        .expect("p2")
        .expect("granted");
    assert!(
        cl.semaphore("pool", 2, now).await.expect("p3").is_none(),
        "third permit of two"
    );
    // Wrong permit count for an existing semaphore: a clear error.
    assert!(cl.semaphore("pool", 3, now).await.is_err());
    let waiting = {
        let cl = cl.clone();
        tokio::spawn(async move {
            cl.semaphore("pool", 2, LockOptions::wait(Duration::from_secs(15)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let freed = p1.token().expect("valid");
    p1.release().await.expect("release");
    let p3 = within("queued permit", T, waiting)
        .await
        .expect("join")
        .expect("p3")
        .expect("granted");
    assert!(p3.token().expect("valid") > freed);
    let info = cl.info("pool").await.expect("info").expect("held");
    assert_eq!(
        (info.kind.as_str(), info.permits, info.holders.len()),
        ("semaphore", 2, 2)
    );
    drop(p2);
    p3.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_is_all_or_nothing() {
    let c = TestCluster::start("multilock", &[]);
    c.wait_for_leader(T).await;
    let a = client(&c, Duration::from_secs(10));
    let b = client(&c, Duration::from_secs(10));
    let now = LockOptions::default();

    let y = b.lock("y", now).await.expect("y").expect("granted");
    assert!(
        a.multi_lock(&["x", "y", "z"], now)
            .await
            .expect("multi")
            .is_none(),
        "granted a multi-lock with y held elsewhere"
    );
    assert!(
        a.info("x").await.expect("info x").is_none(),
        "partial hold on x"
    );
    assert!(
        a.info("z").await.expect("info z").is_none(),
        "partial hold on z"
    );

    // Waiting for all three: granted together, with one token, once y is free.
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move {
            a.multi_lock(&["x", "y", "z"], LockOptions::wait(Duration::from_secs(15)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        a.info("x").await.expect("info x").is_none(),
        "x taken before y was free"
    );
    y.release().await.expect("release y");
    let m = within("multi granted", T, waiting)
        .await
        .expect("join")
        .expect("m")
        .expect("granted");
    let token = m.token().expect("valid");
    for name in ["x", "y", "z"] {
        let info = a.info(name).await.expect("info").expect("held");
        assert_eq!(info.token, token, "{name} not granted in the same entry");
    }
    m.release().await.expect("release");
    for name in ["x", "y", "z"] {
        assert!(
            a.info(name).await.expect("info").is_none(),
            "{name} still held"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_poisons_the_guard_and_runs_its_callback() {
    let c = TestCluster::start("lockloss", &[]);
    c.wait_for_leader(T).await;
    let holder = client(&c, Duration::from_secs(10));
    let admin = client(&c, Duration::from_secs(10));
    let mut g = holder
        .lock("job", LockOptions::default())
        .await
        .expect("lock")
        .expect("granted");
    let called = Arc::new(AtomicBool::new(false));
    let flag = called.clone();
    g.on_lost(move || flag.store(true, Ordering::SeqCst));
    assert!(g.token().is_some());
    // Let the watch stream attach.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(admin.force_unlock("job").await.expect("force"));
    within("lock-loss event", T, g.lost()).await;
    assert_eq!(g.token(), None, "a lost guard still offers its token");
    support::wait_for("on_lost callback", T, || {
        let called = called.clone();
        async move {
            called
                .load(Ordering::SeqCst)
                .then_some(())
                .ok_or("not yet".to_string())
        }
    })
    .await;
    // Someone else can take it now.
    let other = admin
        .lock("job", LockOptions::default())
        .await
        .expect("lock")
        .expect("granted");
    assert!(other.token().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_an_expired_lock_back_but_not_a_released_one() {
    let c = TestCluster::start("lockdelay", &[]);
    c.wait_for_leader(T).await;
    let cl = client(&c, Duration::from_secs(10));
    let other = client(&c, Duration::from_secs(10));
    let delay = Duration::from_millis(1500);

    // Own lease of 300 ms, never renewed (raw API), with a lock-delay.
    let req = fenced_proto::v1::AcquireRequest {
        name: "res".into(),
        owner: "paused".into(),
        ttl_ms: 300,
        lock_delay_ms: delay.as_millis() as u64,
        ..Default::default()
    };
    let g = cl
        .acquire_with(req)
        .await
        .expect("acquire")
        .expect("granted");
    let expired_by = Instant::now() + Duration::from_millis(300);
    let waited = Instant::now();
    let next = other
        .lock("res", LockOptions::wait(Duration::from_secs(15)))
        .await
        .expect("lock")
        .expect("granted after the delay");
    let got_at = Instant::now();
    assert!(
        got_at >= expired_by + delay - Duration::from_millis(50),
        "granted {:?} after the acquire, before lease + lock-delay ({:?})",
        got_at - waited,
        Duration::from_millis(300) + delay
    );
    assert!(next.token().expect("valid") > g.token);
    // A clean release does not delay the next holder.
    let token = next.token().expect("valid");
    let start = Instant::now();
    next.release().await.expect("release");
    let after = other
        .lock("res", LockOptions::default())
        .await
        .expect("lock")
        .expect("no delay after a release");
    assert!(after.token().expect("valid") > token);
    assert!(
        start.elapsed() < delay,
        "a release was followed by a lock-delay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_session_poisons_every_guard_of_it() {
    let c = TestCluster::start("sessionloss", &[]);
    c.wait_for_leader(T).await;
    let holder = client(&c, Duration::from_secs(10));
    let admin = client(&c, Duration::from_secs(10));
    let mut g1 = holder
        .lock("a", LockOptions::default())
        .await
        .expect("a")
        .expect("granted");
    let mut g2 = holder
        .read_lock("b", LockOptions::default())
        .await
        .expect("b")
        .expect("granted");
    assert_eq!(
        g1.session(),
        g2.session(),
        "guards of a client share its session"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The session ends behind the client's back (here: closed by someone else).
    assert!(admin.close_session(g1.session()).await.expect("close"));
    within("guard 1 lost", T, g1.lost()).await;
    within("guard 2 lost", T, g2.lost()).await;
    assert!(g1.token().is_none() && g2.token().is_none());
    // The client opens a fresh session for its next lock.
    let g3 = holder
        .lock("a", LockOptions::wait(Duration::from_secs(5)))
        .await
        .expect("a")
        .expect("granted");
    assert_ne!(g3.session(), g1.session());
}
