//! Redis and Redlock against real `redis-server` processes on loopback.
//!
//! Each test starts its own servers on free 127.0.0.1 ports and kills them when it ends, also
//! on panic (Drop) and if the test process dies (PR_SET_PDEATHSIG). Fails, with the install
//! command, when `redis-server` is not installed (`scripts/test.sh` installs it).

mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fenced_backends::redlock::Verdict;
use fenced_backends::{DistLock, RedisConfig, RedisLock, Redlock, RedlockConfig, RetryPolicy};

struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn conn(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://{}/", self.addr())).expect("client");
        c.get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require_redis() {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "redis-server is not installed: apt-get install -y redis-server (scripts/test.sh does)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_redis() -> RedisServer {
    for _attempt in 0..5 {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "local",
            "--loglevel",
            "warning",
            "--dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        support::die_with_this_test(&mut cmd);
        let child = cmd.spawn().expect("spawn redis-server");
        let mut srv = RedisServer {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = srv.child.try_wait() {
                break; // port taken meanwhile: try another
            }
            if let Ok(c) = redis::Client::open(format!("redis://{}/", srv.addr())) {
                if let Ok(mut conn) = c.get_connection_with_timeout(Duration::from_millis(200)) {
                    if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                        return srv;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(srv);
    }
    panic!("could not start redis-server");
}

fn exists(srv: &RedisServer, key: &str) -> bool {
    let mut c = srv.conn();
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut c)
        .expect("EXISTS")
        == 1
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        delay: Duration::from_millis(1),
        jitter: Duration::from_millis(2),
    }
}

#[tokio::test]
async fn single_redis_lock_cycle() {
    require_redis();
    let srv = start_redis();
    let cfg = RedisConfig {
        timeout: Duration::from_secs(1),
        retry: fast_retry(),
    };
    let a = RedisLock::new("redis", &srv.addr(), cfg).unwrap();
    let b = RedisLock::new("redis", &srv.addr(), cfg).unwrap();
    let ttl = Duration::from_secs(5);

    let g = a
        .acquire("L", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("free lock");
    assert_eq!(g.token(), None, "Redis issues no fencing token");
    assert!(b.acquire("L", ttl, Duration::ZERO).await.unwrap().is_none());
    assert_eq!(b.failed_attempts(), 1);
    // Waiting retries with jitter until the wait runs out.
    let t = Instant::now();
    assert!(b
        .acquire("L", ttl, Duration::from_millis(60))
        .await
        .unwrap()
        .is_none());
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert!(b.failed_attempts() > 2);

    // Someone else's grant (same key, other value) cannot release or extend ours.
    let mut forged = g.clone();
    forged.handle = "not-ours".into();
    assert!(!b.release(&forged).await.unwrap());
    assert!(!b.extend(&forged, ttl).await.unwrap());

    assert!(a.extend(&g, Duration::from_secs(20)).await.unwrap());
    let pttl: i64 = redis::cmd("PTTL").arg("L").query(&mut srv.conn()).unwrap();
    assert!(pttl > 10_000, "extended: pttl {pttl}");
    assert!(a.release(&g).await.unwrap());
    assert!(
        !a.release(&g).await.unwrap(),
        "second release finds nothing"
    );
    assert!(!exists(&srv, "L"));

    // A waiter gets it once the holder lets go.
    let g = a.acquire("L", ttl, Duration::ZERO).await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("L", Duration::from_secs(5), Duration::from_secs(3))
            .await
            .map(|g| g.is_some())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(a.release(&g).await.unwrap());
    assert!(waiter.await.unwrap().unwrap());
}

#[tokio::test]
async fn single_redis_down_is_unavailable() {
    let port = free_port();
    let cfg = RedisConfig {
        timeout: Duration::from_millis(200),
        retry: fast_retry(),
    };
    let a = RedisLock::new("redis", &format!("127.0.0.1:{port}"), cfg).unwrap();
    let t = Instant::now();
    let r = a.acquire("L", Duration::from_secs(1), Duration::ZERO).await;
    assert!(
        matches!(r, Err(fenced_backends::LockError::Unavailable { .. })),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(2));
}

fn five() -> Vec<RedisServer> {
    (0..5).map(|_| start_redis()).collect()
}

fn redlock_on(servers: &[RedisServer], instance_timeout: Duration) -> Redlock {
    Redlock::new(
        servers.iter().map(RedisServer::addr),
        RedlockConfig {
            instance_timeout,
            retry: fast_retry(),
        },
    )
    .unwrap()
}

#[tokio::test]
async fn redlock_majority_mutual_exclusion_and_unlock_everywhere() {
    require_redis();
    let servers = five();
    // Generous per-instance timeouts: this test is about the protocol, not speed, and a
    // loaded CI machine must not turn a slow first connect into a missing key.
    let a = redlock_on(&servers, Duration::from_secs(1));
    let b = redlock_on(&servers, Duration::from_secs(1));
    let ttl = Duration::from_secs(10);

    let g = a
        .acquire("R", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(g.token(), None);
    assert!(g.validity <= ttl - fenced_backends::redlock::drift(ttl));
    assert!(g.validity > Duration::from_secs(9));
    assert!(servers.iter().all(|s| exists(s, "R")));

    assert!(b.acquire("R", ttl, Duration::ZERO).await.unwrap().is_none());
    // b's failed round released on all instances: only with b's value, so a's keys stay.
    assert!(servers.iter().all(|s| exists(s, "R")));

    assert!(a.extend(&g, Duration::from_secs(30)).await.unwrap());
    assert!(a.release(&g).await.unwrap());
    assert!(servers.iter().all(|s| !exists(s, "R")), "unlock on all");
    assert!(b.acquire("R", ttl, Duration::ZERO).await.unwrap().is_some());
}

#[tokio::test]
async fn redlock_survives_a_minority_down_not_a_majority() {
    require_redis();
    let mut servers = five();
    let ttl = Duration::from_secs(10);
    // Two of five down: still a majority.
    servers.truncate(3);
    let dead: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let addrs: Vec<String> = servers
        .iter()
        .map(RedisServer::addr)
        .chain(dead.iter().cloned())
        .collect();
    let cfg = RedlockConfig {
        instance_timeout: Duration::from_millis(500),
        retry: fast_retry(),
    };
    let rl = Redlock::new(&addrs, cfg).unwrap();
    let g = rl
        .acquire("M", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("3 of 5");
    assert!(rl.release(&g).await.unwrap());

    // Three of five down: never acquired, and whatever was set is released everywhere.
    servers.truncate(2);
    let addrs: Vec<String> = servers
        .iter()
        .map(RedisServer::addr)
        .chain((0..3).map(|_| format!("127.0.0.1:{}", free_port())))
        .collect();
    let rl = Redlock::new(&addrs, cfg).unwrap();
    let round = rl.try_round("M", "v1", ttl).await.unwrap();
    assert_eq!(
        round.verdict,
        Verdict::NoQuorum {
            successes: 2,
            quorum: 3
        }
    );
    assert!(servers.iter().all(|s| !exists(s, "M")), "released on all");
    let r = rl.acquire("M", ttl, Duration::from_millis(30)).await;
    assert!(
        matches!(r, Err(fenced_backends::LockError::Unavailable { .. })),
        "{r:?}"
    );
    assert!(servers.iter().all(|s| !exists(s, "M")));
}

#[tokio::test]
async fn redlock_majority_reached_but_validity_exhausted_fails_and_releases_all() {
    require_redis();
    let servers = five();
    // Three instances stall for 1 s (DEBUG SLEEP), so a majority needs a slow one. With a
    // generous per-instance timeout all five say yes — but after ~1 s, far past a 300 ms TTL.
    let ttl = Duration::from_millis(300);
    let rl = redlock_on(&servers, Duration::from_secs(3));

    let sleepers = stall(&servers[..3], 1.0).await;
    let round = rl.try_round("V", "val", ttl).await.unwrap();
    let returned = Instant::now();
    match round.verdict {
        Verdict::ValidityExhausted { successes, elapsed } => {
            assert_eq!(successes, 5, "a majority (all) said yes");
            assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
        }
        other => panic!("expected ValidityExhausted, got {other:?}"),
    }
    // The slow instances set the key when they woke up, with PX 300: it would live for
    // another 300 ms. It is gone right now only because the failed round released it on all
    // instances.
    for (i, s) in servers.iter().enumerate() {
        assert!(!exists(s, "V"), "instance {i} still holds the key");
    }
    assert!(returned.elapsed() < Duration::from_millis(250));
    for t in sleepers {
        t.join().unwrap();
    }

    // Through the trait: the same situation yields no grant.
    let sleepers = stall(&servers[..3], 1.0).await;
    let g = rl.acquire("W", ttl, Duration::ZERO).await.unwrap();
    assert!(g.is_none());
    assert_eq!(rl.failed_attempts(), 1);
    assert!(servers.iter().all(|s| !exists(s, "W")));
    for t in sleepers {
        t.join().unwrap();
    }
}

/// Make each server sleep `secs` (DEBUG SLEEP) and return once every one of them is
/// confirmed blocked (a PING goes unanswered for 100 ms), so the caller's next command waits.
async fn stall(servers: &[RedisServer], secs: f64) -> Vec<std::thread::JoinHandle<()>> {
    // Probe connections first: connecting to a sleeping server would wait out the sleep.
    let mut probes = Vec::new();
    for s in servers {
        let c = redis::Client::open(format!("redis://{}/", s.addr())).unwrap();
        probes.push(c.get_multiplexed_async_connection().await.unwrap());
    }
    let handles: Vec<_> = servers
        .iter()
        .map(|s| {
            let addr = s.addr();
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
                let mut conn = c.get_connection().unwrap();
                let _: redis::RedisResult<String> =
                    redis::cmd("DEBUG").arg("SLEEP").arg(secs).query(&mut conn);
            })
        })
        .collect();
    for mut conn in probes {
        let deadline = Instant::now() + Duration::from_secs_f64(secs * 0.5);
        loop {
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut conn);
            if tokio::time::timeout(Duration::from_millis(100), ping)
                .await
                .is_err()
            {
                break; // unanswered: the server is inside DEBUG SLEEP
            }
            assert!(Instant::now() < deadline, "server never stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    handles
}

#[tokio::test]
async fn redlock_extend_needs_a_majority() {
    require_redis();
    let servers = five();
    let rl = redlock_on(&servers, Duration::from_secs(1));
    let g = rl
        .acquire("E", Duration::from_secs(10), Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    // Take the key away on three instances: extend must fail.
    for s in &servers[..3] {
        let _: i64 = redis::cmd("DEL").arg("E").query(&mut s.conn()).unwrap();
    }
    assert!(!rl.extend(&g, Duration::from_secs(10)).await.unwrap());
    // Restore on one: 3 of 5 hold it again, extend succeeds with a fresh validity.
    let _: () = redis::cmd("SET")
        .arg("E")
        .arg(&g.handle)
        .arg("PX")
        .arg(1000)
        .query(&mut servers[0].conn())
        .unwrap();
    let ng = rl
        .extend_grant(&g, Duration::from_secs(20))
        .await
        .unwrap()
        .expect("majority");
    assert!(ng.validity > Duration::from_secs(19));
    assert!(rl.release(&ng).await.unwrap());
    assert!(servers.iter().all(|s| !exists(s, "E")));
}

#[tokio::test]
async fn redisson_read_write_lock_and_permit_semaphore() {
    use fenced_backends::{LockMode, Redisson};
    require_redis();
    let srv = start_redis();
    let cfg = RedisConfig {
        timeout: Duration::from_secs(1),
        retry: fast_retry(),
    };
    let c: Vec<Redisson> = (0..4)
        .map(|_| Redisson::new("redis", &srv.addr(), cfg).unwrap())
        .collect();
    let ttl = Duration::from_secs(5);
    let now = Duration::ZERO;
    let take = |i: usize, m: LockMode| c[i].acquire_mode("rw", m, ttl, now);

    // Readers share; a writer waits for every one of them.
    let r0 = take(0, LockMode::Read)
        .await
        .unwrap()
        .expect("first reader");
    let r1 = take(1, LockMode::Read)
        .await
        .unwrap()
        .expect("second reader");
    assert_eq!(r0.token(), None, "no fencing tokens");
    assert!(take(2, LockMode::Write).await.unwrap().is_none());
    assert!(c[0].release(&r0).await.unwrap());
    assert!(!c[0].release(&r0).await.unwrap(), "released once");
    assert!(take(2, LockMode::Write).await.unwrap().is_none());
    assert!(c[1].release(&r1).await.unwrap());
    assert!(!exists(&srv, "rw"), "the last reader deletes the hash");
    // A writer excludes readers and other writers until it lets go.
    let w = take(2, LockMode::Write).await.unwrap().expect("writer");
    assert!(take(0, LockMode::Read).await.unwrap().is_none());
    assert!(take(3, LockMode::Write).await.unwrap().is_none());
    assert!(c[2].release(&w).await.unwrap());
    assert!(take(3, LockMode::Write).await.unwrap().is_some());

    // Two permits: a third holder waits until one is released.
    let p = LockMode::Permit { permits: 2 };
    let sem = |i: usize| c[i].acquire_mode("sem", p, ttl, now);
    let p0 = sem(0).await.unwrap().expect("permit 1");
    let p1 = sem(1).await.unwrap().expect("permit 2");
    assert_ne!(p0.handle, p1.handle, "each permit has its own id");
    assert!(sem(2).await.unwrap().is_none());
    assert!(c[0].release(&p0).await.unwrap());
    assert!(!c[0].release(&p0).await.unwrap(), "released once");
    let p2 = sem(2).await.unwrap().expect("the freed permit");
    assert!(sem(3).await.unwrap().is_none());
    // An expired permit goes back to the pool at the next acquire.
    let short = c[3]
        .acquire_mode(
            "sem2",
            LockMode::Permit { permits: 1 },
            Duration::from_millis(50),
            now,
        )
        .await
        .unwrap()
        .expect("permit");
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(c[0]
        .acquire_mode("sem2", LockMode::Permit { permits: 1 }, ttl, now)
        .await
        .unwrap()
        .is_some());
    assert!(!c[3].release(&short).await.unwrap(), "expired: not held");
    assert!(c[1].release(&p1).await.unwrap() && c[2].release(&p2).await.unwrap());
}
