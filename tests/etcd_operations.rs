//! etcd's operator calls on fenced (issue 45, first slice) with Debian's `etcdctl` against a
//! 3-node cluster of real `fenced` processes (loopback only): `etcdctl endpoint hashkv`
//! equal on every member at one revision (and changed by a write after it only at a later
//! revision), `etcdctl defrag` succeeding, `etcdctl move-leader` handing leadership to the
//! member named, and refusing an id that is no other voter with etcd's error.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{
    etcdctl_in, etcdctl_in_ok as etcdctl_ok, follower_of, require, wait_leases_work, TestCluster,
    LEADER_TIMEOUT,
};

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// `etcdctl endpoint hashkv` of one member at `rev`: (hash, compact revision).
fn hashkv(endpoint: &str, rev: u64) -> (u64, u64) {
    let out = etcdctl_ok(
        &[endpoint.to_owned()],
        &["endpoint", "hashkv", &format!("--rev={rev}"), "-w", "json"],
        "",
    );
    let v = json(&out);
    let h = &v[0]["HashKV"];
    (
        h["hash"]
            .as_u64()
            .unwrap_or_else(|| panic!("no hash in {out}")),
        h["compact_revision"].as_u64().unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcdctl_hashkv_defrag_and_move_leader_work_on_fenced() {
    require("etcdctl", &["version"]);
    let c = TestCluster::start("etcd_operations", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let all = c.endpoints();
    wait_leases_work(&all).await;
    for i in 0..5 {
        etcdctl_ok(&all, &["put", &format!("ops/{i}"), &format!("v{i}")], "");
    }
    let got = json(&etcdctl_ok(&all, &["get", "ops/4", "-w", "json"], ""));
    let rev = got["kvs"][0]["mod_revision"]
        .as_u64()
        .expect("mod_revision");

    // Every member hashes revision `rev` alike (each has applied it: the put was acknowledged
    // by a majority, the third catches up within the wait).
    let hashes: Vec<(u64, u64)> = c
        .endpoints()
        .iter()
        .map(|ep| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (ok, out, err) = etcdctl_in(
                    std::slice::from_ref(ep),
                    &["endpoint", "hashkv", &format!("--rev={rev}"), "-w", "json"],
                    "",
                );
                if ok {
                    let v = json(&out);
                    let h = &v[0]["HashKV"];
                    break (
                        h["hash"].as_u64().expect("hash"),
                        h["compact_revision"].as_u64().unwrap_or(0),
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "etcdctl endpoint hashkv on {ep}: {err}{out}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .collect();
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "members hash revision {rev} differently: {hashes:?}"
    );
    assert_ne!(hashes[0].0, 0);
    // A later write leaves the hash at `rev` as it was and changes the latest one.
    etcdctl_ok(&all, &["put", "ops/0", "changed"], "");
    let ep = &c.endpoints_of(&[leader])[0];
    assert_eq!(hashkv(ep, rev), hashes[0]);
    let got = json(&etcdctl_ok(&all, &["get", "ops/0", "-w", "json"], ""));
    let now = got["kvs"][0]["mod_revision"]
        .as_u64()
        .expect("mod_revision");
    assert_ne!(hashkv(ep, now).0, hashes[0].0);
    // A future revision is etcd's error.
    let (ok, out, err) = etcdctl_in(
        std::slice::from_ref(ep),
        &["endpoint", "hashkv", &format!("--rev={}", now + 1_000_000)],
        "",
    );
    assert!(
        !ok && format!("{err}{out}").contains("required revision is a future revision"),
        "{err}{out}"
    );

    // Defragment: nothing to do, success.
    let out = etcdctl_ok(&all, &["defrag"], "");
    assert!(out.contains("Finished defragmenting etcd member"), "{out}");

    // move-leader to a follower (ids in hex, as etcdctl takes them).
    let target = follower_of(leader);
    let out = etcdctl_ok(&all, &["move-leader", &format!("{target:x}")], "");
    assert!(out.contains("Leadership transferred"), "{out}");
    let new = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_eq!(new, target, "leadership went to {new}, not {target}");
    // An id that is no member: etcd's error, leadership unchanged.
    let (ok, out, err) = etcdctl_in(&all, &["move-leader", "7f"], "");
    assert!(
        !ok && format!("{err}{out}").contains("bad leader transferee"),
        "{err}{out}"
    );
    assert_eq!(c.wait_for_leader(LEADER_TIMEOUT).await, target);
}
