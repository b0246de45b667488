//! The etcd backend against a real single-node etcd on loopback (started and always killed by
//! this test). Fails, with the install command, when `etcd` is not installed
//! (`apt-get install -y etcd-server`; `scripts/test.sh` does).

mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fenced_backends::{DistLock, EtcdLock, EtcdLockService};

struct Etcd {
    child: Child,
    client: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_etcd() -> Etcd {
    let installed = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        installed,
        "etcd is not installed: apt-get install -y etcd-server (scripts/test.sh does)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (cp, pp) = (free_port(), free_port());
    let client = format!("127.0.0.1:{cp}");
    let peer = format!("http://127.0.0.1:{pp}");
    let mut cmd = Command::new("etcd");
    cmd.arg("--name")
        .arg("t1")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--listen-client-urls")
        .arg(format!("http://{client}"))
        .arg("--advertise-client-urls")
        .arg(format!("http://{client}"))
        .arg("--listen-peer-urls")
        .arg(&peer)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer)
        .arg("--initial-cluster")
        .arg(format!("t1={peer}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    support::die_with_this_test(&mut cmd);
    let child = cmd.spawn().expect("spawn etcd");
    Etcd {
        child,
        client,
        _dir: dir,
    }
}

#[tokio::test]
async fn etcd_session_lock() {
    let etcd = start_etcd();
    let a = EtcdLock::connect(&etcd.client).unwrap();
    let b = EtcdLock::connect(&etcd.client).unwrap();
    let ttl = Duration::from_secs(5);
    // Wait (bounded) for etcd to serve.
    let deadline = Instant::now() + Duration::from_secs(20);
    let g = loop {
        match a.acquire("L", ttl, Duration::ZERO).await {
            Ok(g) => break g.expect("free lock"),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("etcd not serving: {e}"),
        }
    };
    let t1 = g.token().expect("etcd issues tokens");

    // Try-lock fails, and withdraws from the queue.
    assert!(b.acquire("L", ttl, Duration::ZERO).await.unwrap().is_none());
    assert_eq!(b.failed_attempts(), 1);
    // A bounded wait times out.
    assert!(b
        .acquire("L", ttl, Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());

    assert!(a.extend(&g, ttl).await.unwrap());
    // A waiter is woken by the release (watch), and gets a larger token.
    let waiter = tokio::spawn(async move {
        let g = b.acquire("L", ttl, Duration::from_secs(5)).await;
        (b, g)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(a.release(&g).await.unwrap());
    let (b, g2) = waiter.await.unwrap();
    let g2 = g2.unwrap().expect("handed over");
    assert!(g2.token().unwrap() > t1);
    assert!(!a.release(&g).await.unwrap(), "old grant is gone");
    assert!(b.release(&g2).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// etcd's server-side `v3lockpb.Lock` (backend `etcd-lock`): a bounded wait ends "not
/// granted" and leaves no waiter behind, a release hands the lock to a waiter, and tokens are
/// the lock keys' create revisions (the waiter's, created before the release, is below the
/// revision its grant was answered at, and above the first holder's).
#[tokio::test]
async fn etcd_lock_service() {
    let etcd = start_etcd();
    let a = EtcdLockService::etcd(&etcd.client).unwrap();
    let b = EtcdLockService::etcd(&etcd.client).unwrap();
    let c = EtcdLock::connect(&etcd.client).unwrap();
    let ttl = Duration::from_secs(5);
    let deadline = Instant::now() + Duration::from_secs(20);
    let g = loop {
        match a.acquire("S", ttl, Duration::ZERO).await {
            Ok(Some(g)) => break g,
            Ok(None) => panic!("free lock not granted"),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("etcd not serving: {e}"),
        }
    };
    assert_eq!(a.name(), "etcd-lock");
    let t1 = g.token().expect("a token");
    assert!(g.handle.starts_with("S/"), "{}", g.handle);

    // A bounded wait on the held lock: not granted, counted, and no waiter key left behind
    // (the client-side recipe on the same prefix gets the lock right after a's release).
    assert!(b
        .acquire("S", ttl, Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert_eq!(b.failed_attempts(), 1);

    assert!(a.extend(&g, ttl).await.unwrap());
    let waiter = tokio::spawn(async move {
        let g = b.acquire("S", ttl, Duration::from_secs(5)).await;
        (b, g)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(a.release(&g).await.unwrap());
    let (b, g2) = waiter.await.unwrap();
    let g2 = g2.unwrap().expect("handed over");
    let t2 = g2.token().unwrap();
    assert!(t2 > t1, "{t2} > {t1}");
    assert!(b.release(&g2).await.unwrap());
    let g3 = c
        .acquire("S", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("no waiter key of b's left behind");
    assert!(g3.token().unwrap() > t2);
    assert!(c.release(&g3).await.unwrap());

    // The session's lease is kept alive in the background: a grant of a 2 s lease is still
    // held 4 s later (etcd's keep-alive stream answers only once asked: see keep_alive).
    let short = Duration::from_secs(2);
    let d = EtcdLockService::etcd(&etcd.client).unwrap();
    let gd = d
        .acquire("K", short, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        c.acquire("K", short, Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "the lease was not kept alive"
    );
    assert!(d.release(&gd).await.unwrap());
    d.close().await.unwrap();

    // A lease that is gone (revoked here; expired in a pause) is replaced at the next try.
    a.close().await.unwrap();
    let g4 = a
        .acquire("S", ttl, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("free again");
    assert!(a.release(&g4).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
    c.close().await.unwrap();
}
