//! The Rust client's etcd surface (`crates/client/src/etcd/`) against a real 3-node cluster:
//! a prefix watch started at a revision keeps delivering while a writer puts 300 values and
//! every member in turn (the leader first) is SIGKILLed and restarted — every change once, in
//! revision order, the same as a fresh watch replaying the history afterwards; a watch whose
//! position compaction passed (one whose stream broke, one never polled) gets
//! `ClientError::Compacted`; a lease with a keep-alive handle survives a leader SIGKILL, and
//! once the handle is dropped it lapses, its key's delete reaches the watch and a keep-alive
//! of it reports the loss; a revoked lease's handle reports the loss; an `Election` campaigns
//! (the second candidate waits), proclaims, and hands over by resigning while the `Observe`
//! following it loses its node to a SIGKILL and resumes elsewhere, a revoked term's
//! proclaim is `NotLeader`, and etcd's `Lock` answers its key and token.
//!
//! Run: `cargo test -p fenced-server --test client_etcd`.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use fenced_client::etcd::EventKind;
use fenced_client::{Client, ClientError, Etcd, LeaseLoss, WatchEvent};
use support::{wait_for, within, TestCluster, LEADER_TIMEOUT};
use tokio::sync::mpsc;

/// Bound for the cluster to take etcd writes and lease commands, and for a call after a
/// member died.
const READY: Duration = Duration::from_secs(60);
/// Bound for one expected watch event.
const EVENT: Duration = Duration::from_secs(30);
/// Values the writer puts while the members are killed in turn.
const VALUES: u32 = 300;

/// Put through `etcd`, retrying until [`READY`]: the put's revision.
async fn put(etcd: &Etcd, key: &str, value: &str, lease: Option<i64>) -> i64 {
    wait_for(&format!("put {key}={value}"), READY, || async {
        etcd.put(key, value, lease).await.map_err(|e| e.to_string())
    })
    .await
}

fn brief(e: &WatchEvent) -> (EventKind, String, String, i64) {
    (
        e.kind,
        String::from_utf8_lossy(&e.kv.key).into_owned(),
        String::from_utf8_lossy(&e.kv.value).into_owned(),
        e.revision(),
    )
}

/// Events of `watch` until one at `last_rev` or later arrived (bounded by [`EVENT`] each).
async fn collect_until(watch: &mut fenced_client::Watch, last_rev: i64) -> Vec<WatchEvent> {
    let mut out: Vec<WatchEvent> = Vec::new();
    while out.last().is_none_or(|e| e.revision() < last_rev) {
        let ev = within("a watch event", EVENT, watch.next())
            .await
            .unwrap_or_else(|e| panic!("watch failed after {} events: {e}", out.len()));
        out.push(ev);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_through_sigkilled_members_with_every_change_once_in_order() {
    let c = TestCluster::start("client-etcd-watch", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all: Vec<u64> = c.ids().collect();
    let writer = c.client().etcd();
    let start = put(&writer, "w/value", "0", None).await;

    // The watch has a client of its own, so its retries count its resumes.
    let watch_client: Client = c.client();
    let mut watch = watch_client.etcd().watch_prefix("w/", start);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let ev = watch.next().await;
            let stop = ev.is_err();
            if tx.send(ev).is_err() || stop {
                return;
            }
        }
    });

    // Every member in turn, the leader first, is SIGKILLed while values go on being written
    // through the others, then restarted: whichever member the watch's stream was on, it
    // was cut at least once.
    let mut order = vec![leader];
    order.extend(all.iter().copied().filter(|i| *i != leader));
    let mut written = vec![(0u32, start)];
    let mut value = 0u32;
    let per_phase = VALUES / 8;
    for victim in order {
        for _ in 0..per_phase {
            value += 1;
            written.push((
                value,
                put(&writer, "w/value", &value.to_string(), None).await,
            ));
        }
        c.kill(victim);
        for _ in 0..per_phase {
            value += 1;
            written.push((
                value,
                put(&writer, "w/value", &value.to_string(), None).await,
            ));
        }
        c.restart(victim);
        c.wait_for_leader(LEADER_TIMEOUT).await;
    }
    while value < VALUES {
        value += 1;
        written.push((
            value,
            put(&writer, "w/value", &value.to_string(), None).await,
        ));
    }
    let last_rev = written.last().map_or(0, |w| w.1);

    let mut seen: Vec<WatchEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.last().is_none_or(|e| e.revision() < last_rev) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(Ok(ev))) => seen.push(ev),
            Ok(Some(Err(e))) => panic!("the watch failed after {} events: {e}", seen.len()),
            Ok(None) => panic!("the watch task ended after {} events", seen.len()),
            Err(_) => panic!(
                "timed out with {} events, the last at {:?}, waiting for revision {last_rev}",
                seen.len(),
                seen.last().map(brief)
            ),
        }
    }
    reader.abort();
    assert!(
        watch_client.retries() >= 1,
        "the watch's stream was never cut: the test proved nothing"
    );

    // Once, in order: revisions strictly increase (a resume from the last revision instead of
    // the one after it delivers that change twice) ...
    for w in seen.windows(2) {
        assert!(
            w[0].revision() < w[1].revision(),
            "out of order or twice: {:?} then {:?}",
            brief(&w[0]),
            brief(&w[1])
        );
    }
    // ... every put the writer saw succeed is there with its value (a resume that skips a
    // revision loses one) ...
    for (v, rev) in &written {
        assert!(
            seen.iter()
                .any(|e| e.revision() == *rev && e.kv.value == v.to_string().as_bytes()),
            "value {v} put at revision {rev} was not delivered"
        );
    }
    // ... and nothing else but the history itself: a fresh watch replaying it from the
    // start, with no failure, sees exactly the same changes (a put retried after an unknown
    // outcome is in both).
    let mut replay = writer.watch_prefix("w/", start);
    let reference = collect_until(&mut replay, last_rev).await;
    let (got, want): (Vec<_>, Vec<_>) = (
        seen.iter().map(brief).collect(),
        reference.iter().map(brief).collect(),
    );
    assert_eq!(
        got.len(),
        want.len(),
        "the resumed watch and the replay differ"
    );
    assert_eq!(got, want, "the resumed watch and the replay differ");
    assert!(seen.iter().all(|e| e.kind == EventKind::Put));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_past_a_watch_position_is_a_typed_error() {
    let c = TestCluster::start("client-etcd-compact", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    // The watch's client prefers node 1: its stream is opened there.
    let etcd = c.client().etcd();
    let others = Client::connect_with(c.endpoints_of(&[2, 3]), c.client_options())
        .unwrap_or_else(|e| panic!("client: {e}"))
        .etcd();
    let first = put(&etcd, "c/k", "0", None).await;
    let mut watch = etcd.watch_prefix("c/", first);
    let mut idle = etcd.watch_prefix("c/", first);
    let mut revs = vec![first];
    for v in 1..=3 {
        revs.push(put(&etcd, "c/k", &v.to_string(), None).await);
    }
    let got = collect_until(&mut watch, revs[3]).await;
    assert_eq!(got.iter().map(|e| e.revision()).collect::<Vec<_>>(), revs);
    let position = watch.next_revision();
    assert_eq!(position, revs[3] + 1);

    // Its stream breaks; meanwhile more is written and the history compacted past it.
    c.kill(1);
    let mut compact_at = 0;
    for v in 4..=6 {
        compact_at = put(&others, "c/k", &v.to_string(), None).await;
    }
    wait_for("compaction", READY, || async {
        others.compact(compact_at).await.map_err(|e| e.to_string())
    })
    .await;

    for (name, w) in [
        ("the broken watch", &mut watch),
        ("the idle watch", &mut idle),
    ] {
        for _ in 0..2 {
            match within(name, EVENT, w.next()).await {
                Err(ClientError::Compacted { compact_revision }) => {
                    assert_eq!(compact_revision, compact_at, "{name}")
                }
                other => panic!("{name}: expected Compacted, got {other:?}"),
            }
        }
    }
    // A watch from the compact revision on goes on.
    let mut again = others.watch_prefix("c/", compact_at);
    let ev = within("a watch from the compact revision", EVENT, again.next())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ev.kv.value, b"6");
    assert_eq!(ev.revision(), compact_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_lease_survives_a_leader_sigkill_and_lapses_once_dropped() {
    let c = TestCluster::start("client-etcd-lease", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let etcd = c.client().etcd();
    let watcher = c.client().etcd();
    let before = put(&etcd, "l/other", "x", None).await;
    let mut watch = watcher.watch_prefix("l/", before + 1);

    let ttl = 10;
    let lease = wait_for("a lease grant", READY, || async {
        etcd.grant(ttl).await.map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(lease.ttl, ttl);
    let put_rev = put(&etcd, "l/key", "held", Some(lease.id)).await;
    let keep = etcd.keep_alive(lease);
    assert_eq!(keep.id(), lease.id);
    let ev = within("the put's event", EVENT, watch.next())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        brief(&ev),
        (EventKind::Put, "l/key".into(), "held".into(), put_rev)
    );
    assert_eq!(ev.kv.lease, lease.id);
    let leases = etcd.leases().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(leases.contains(&lease.id), "{leases:?}");

    // The leader dies; for two TTLs the lease is kept alive through the others.
    c.kill(leader);
    let until = Instant::now() + Duration::from_secs(2 * ttl as u64);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(keep.loss(), None, "the keep-alive reported a loss");
    }
    let kv = wait_for("a read of l/key", READY, || async {
        etcd.get("l/key").await.map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|| panic!("l/key is gone though its lease was kept alive"));
    assert_eq!((kv.value.as_slice(), kv.lease), (&b"held"[..], lease.id));
    let t = etcd
        .time_to_live(lease.id, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("lease {} is gone", lease.id));
    assert!(t.ttl > 0 && t.granted_ttl == ttl, "{t:?}");
    assert_eq!(t.keys, vec![b"l/key".to_vec()]);
    c.restart(leader);
    c.wait_for_leader(LEADER_TIMEOUT).await;

    // No more keep-alives: the lease lapses, its key's delete reaches the watch.
    drop(keep);
    let ev = within(
        "the lapsed lease's delete",
        Duration::from_secs(60),
        watch.next(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (ev.kind, ev.kv.key.as_slice()),
        (EventKind::Delete, &b"l/key"[..])
    );
    assert!(ev.revision() > put_rev);
    assert_eq!(
        etcd.time_to_live(lease.id, false)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        None
    );
    assert_eq!(
        etcd.get("l/key").await.unwrap_or_else(|e| panic!("{e}")),
        None
    );
    // A keep-alive of the lapsed lease reports its loss.
    let late = etcd.keep_alive(lease);
    assert_eq!(
        within("the lapsed lease's loss", EVENT, late.lost()).await,
        LeaseLoss::Expired
    );

    // A lease revoked while kept alive: its handle reports the loss.
    let other = etcd.grant(ttl).await.unwrap_or_else(|e| panic!("{e}"));
    let keep = etcd.keep_alive(other);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(keep.loss(), None);
    etcd.revoke(other.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        within("the revoked lease's loss", EVENT, keep.lost()).await,
        LeaseLoss::Expired
    );
    match etcd.revoke(other.id).await {
        Err(ClientError::Rejected(s)) => assert!(s.message().contains("lease not found"), "{s}"),
        other => panic!("revoking twice: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_a_watch_logs_in_again_after_its_node_restarts() {
    let c = TestCluster::start("client-etcd-auth", &["--requirepass", "sesame"]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let as_default = |pass: &str| {
        Client::connect_with(
            c.endpoints(),
            c.client_options().with_credentials("default", pass),
        )
        .unwrap_or_else(|e| panic!("client: {e}"))
        .etcd()
    };
    let etcd = as_default("sesame");
    let first = put(&etcd, "a/k", "0", None).await;
    // The watch knows node 1 only, and is logged in there.
    let on_node_1 = Client::connect_with(
        c.endpoints_of(&[1]),
        c.client_options().with_credentials("default", "sesame"),
    )
    .unwrap_or_else(|e| panic!("client: {e}"));
    let mut watch = on_node_1.etcd().watch_prefix("a/", first);
    let ev = within("the first event", EVENT, watch.next())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ev.revision(), first);

    // Node 1 restarts and forgets every token: the watch resumes there, logging in again
    // when its token is refused.
    c.kill(1);
    let second = put(&etcd, "a/k", "1", None).await;
    c.restart(1);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let third = put(&etcd, "a/k", "2", None).await;
    let got = collect_until(&mut watch, third).await;
    assert_eq!(
        got.iter().map(|e| e.revision()).collect::<Vec<_>>(),
        vec![second, third]
    );

    // A wrong password is a refusal, at once, not an outage.
    let wrong = as_default("open");
    let started = Instant::now();
    match within(
        "a watch with a wrong password",
        EVENT,
        wrong.watch("a/k", 0).next(),
    )
    .await
    {
        Err(ClientError::Rejected(s)) => assert_eq!(s.code(), tonic::Code::Unauthenticated),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    match wrong.put("a/k", "3", None).await {
        Err(ClientError::Rejected(s)) => assert_eq!(s.code(), tonic::Code::Unauthenticated),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Without credentials, nothing.
    let anon = c.client().etcd();
    assert!(matches!(
        anon.get("a/k").await,
        Err(ClientError::Rejected(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_campaigns_proclaims_and_observes_through_a_leader_sigkill() {
    let c = TestCluster::start("client_etcd_election", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let etcd = c.client().etcd();
    let grant = |ttl| {
        let etcd = etcd.clone();
        async move {
            wait_for("a lease grant", READY, || async {
                etcd.grant(ttl).await.map_err(|e| e.to_string())
            })
            .await
        }
    };
    let (la, lb) = (grant(10).await, grant(10).await);
    let a = etcd.election(etcd.keep_alive(la));
    let b = etcd.election(etcd.keep_alive(lb));
    let term_a = within("a campaigns", EVENT, a.campaign("svc", "a"))
        .await
        .expect("campaign a");
    let leader = etcd.leader("svc").await.expect("leader").expect("a leads");
    assert_eq!(leader.create_revision as u64, term_a.token());
    assert_eq!(leader.key, term_a.key().key);
    // b waits behind a.
    let waiting = tokio::spawn(async move {
        let term = b.campaign("svc", "b").await;
        (b, term)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "b leads while a does");
    term_a.proclaim("a2").await.expect("proclaim while leading");
    let mut leaders = etcd.observe("svc");
    let first = within("observe", EVENT, leaders.next())
        .await
        .expect("first");
    assert_eq!(
        (first.key.clone(), first.value),
        (term_a.key().key.clone(), b"a2".to_vec())
    );

    // The observe's node (the preferred one: the leader) dies; a resigns; b leads.
    let killed = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.kill(killed);
    within("a resigns", READY, term_a.resign())
        .await
        .expect("resign");
    let (b, term_b) = within("b leads", READY, waiting).await.expect("join");
    let term_b = term_b.expect("campaign b");
    assert!(term_b.token() > first.create_revision as u64);
    let next = within("observe after the kill", READY, leaders.next())
        .await
        .expect("next");
    assert_eq!(
        (next.key, next.value, next.create_revision as u64),
        (term_b.key().key.clone(), b"b".to_vec(), term_b.token())
    );
    c.restart(killed);

    // b's lease ends: its term is over, a proclaim is refused, nobody leads.
    etcd.revoke(b.lease()).await.expect("revoke b");
    assert!(matches!(
        term_b.proclaim("late").await,
        Err(fenced_client::ElectionError::NotLeader)
    ));
    assert_eq!(etcd.leader("svc").await.expect("leader"), None);

    // etcd's Lock on a's lease: the key and its token, and unlock.
    let (key, token) = within("lock", EVENT, etcd.lock("mutex", a.lease()))
        .await
        .expect("lock");
    let kv = etcd.get(&key).await.expect("get").expect("the lock's key");
    assert_eq!(kv.create_revision as u64, token);
    etcd.unlock(&key).await.expect("unlock");
    assert_eq!(etcd.get(&key).await.expect("get"), None);
}
