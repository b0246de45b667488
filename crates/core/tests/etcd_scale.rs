//! Rough costs of the etcd keyspace at scale, for the docs and the wiring (not a benchmark:
//! run by hand, in release):
//! `cargo test --release -p fenced-core --test etcd_scale -- --ignored --nocapture`

use std::time::Instant;

use fenced_core::etcd::*;

#[test]
#[ignore = "slow; run by hand in release"]
fn costs_at_a_million_versions() {
    const KEYS: u64 = 100_000;
    const PUTS: u64 = 1_000_000;
    let no_lease = |_: LeaseId| false;
    let mut s = EtcdStore::new();
    let t = Instant::now();
    for i in 0..PUTS {
        let req = PutRequest::new(format!("/registry/pods/{:08}", i % KEYS), vec![b'x'; 100]);
        s.put(&req, i + 1, &no_lease).expect("put");
    }
    let puts = t.elapsed();
    println!(
        "{PUTS} puts over {KEYS} keys: {puts:?} ({:?}/put); {} versions, {} MB counted",
        puts / PUTS as u32,
        s.version_count(),
        s.history_bytes() >> 20
    );

    let t = Instant::now();
    let snapshot = s.clone();
    let req = PutRequest::new("/registry/pods/00000001", vec![b'y'; 100]);
    s.put(&req, PUTS + 1, &no_lease).expect("put");
    println!("clone + one put while the clone lives: {:?}", t.elapsed());
    drop(snapshot);

    let current = PUTS + 1;
    let t = Instant::now();
    let r = s
        .range(
            &RangeRequest::new(KeyRange::prefix("/registry/pods/")),
            current,
        )
        .expect("range");
    println!("range of {} keys now: {:?}", r.kvs.len(), t.elapsed());
    let t = Instant::now();
    let r = s
        .range(
            &RangeRequest {
                limit: 500,
                ..RangeRequest::new(KeyRange::prefix("/registry/pods/"))
            },
            current,
        )
        .expect("range");
    println!("range limit 500 (count {}): {:?}", r.count, t.elapsed());
    let t = Instant::now();
    let r = s
        .range(
            &RangeRequest {
                revision: PUTS / 2,
                ..RangeRequest::new(KeyRange::prefix("/registry/pods/"))
            },
            current,
        )
        .expect("range");
    println!(
        "range of {} keys at an old revision: {:?}",
        r.kvs.len(),
        t.elapsed()
    );

    let t = Instant::now();
    let ev = s
        .events_since(current - 10_000, &KeyRange::all(), 0, true)
        .expect("events");
    println!(
        "last {} events with prev kv: {:?}",
        ev.events.len(),
        t.elapsed()
    );

    let t = Instant::now();
    let bytes = bincode::serialize(&s).expect("encode");
    let enc = t.elapsed();
    let t = Instant::now();
    let back: EtcdStore = bincode::deserialize(&bytes).expect("decode");
    println!(
        "encode {} MB: {enc:?}; decode + rebuild: {:?}",
        bytes.len() >> 20,
        t.elapsed()
    );
    drop(back);

    let mut stepped = s.clone();
    stepped
        .begin_compact(PUTS - 100_000, current)
        .expect("begin");
    let (mut steps, mut slowest) = (0, std::time::Duration::ZERO);
    let t = Instant::now();
    loop {
        let step = Instant::now();
        let stats = stepped.compact_step(10_000);
        slowest = slowest.max(step.elapsed());
        steps += 1;
        if !stats.pending {
            break;
        }
    }
    println!(
        "the same compaction in {steps} steps of 10,000: {:?} in all, the slowest step {slowest:?}",
        t.elapsed()
    );

    let t = Instant::now();
    let stats = s.compact(PUTS - 100_000, current).expect("compact");
    println!(
        "compaction removing {} versions ({} MB): {:?}",
        stats.removed,
        stats.freed_bytes >> 20,
        t.elapsed()
    );
    assert_eq!(stepped, s);
}
