//! Plain keyspace commands through `Keyspace::apply` and `Keyspace::read`, as the state machine
//! and the read path run them — the cost of parsing, the command table and dispatch:
//! `cargo bench -p fenced-core --bench kv`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fenced_core::kv::{Argv, Keyspace, KvCommand};

fn argv(words: &[&str]) -> Argv {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn keyspace(c: &mut Criterion) {
    let now = 1_000_000;
    let mut events = Vec::new();

    // A pipeline of ten writes of every type, one revision each.
    let writes = KvCommand::Batch(vec![
        argv(&["SET", "lock:a", "owner-1", "NX", "PX", "30000"]),
        argv(&["INCR", "counter"]),
        argv(&["HSET", "bucket", "tokens", "10", "ts", "1000"]),
        argv(&["HINCRBY", "bucket", "tokens", "-1"]),
        argv(&["ZADD", "log", "1000", "req-1"]),
        argv(&["ZREMRANGEBYSCORE", "log", "-inf", "500"]),
        argv(&["RPUSH", "queue", "job"]),
        argv(&["LPOP", "queue"]),
        argv(&["EXPIRE", "counter", "60"]),
        argv(&["DEL", "lock:a"]),
    ]);
    let mut ks = Keyspace::default();
    let mut revision: u64 = 0;
    c.bench_function("kv_write_pipeline_10", |b| {
        b.iter(|| {
            revision += 1;
            let r = ks.apply(
                &mut revision,
                fenced_core::Semantics::NEWEST,
                now,
                black_box(&writes),
                &mut events,
            );
            events.clear();
            r
        })
    });

    // Ten reads, as a read barrier's batch answers them.
    let reads: Vec<Argv> = [
        &["GET", "lock:a"][..],
        &["GET", "counter"],
        &["HGET", "bucket", "tokens"],
        &["HMGET", "bucket", "tokens", "ts"],
        &["ZCARD", "log"],
        &["ZSCORE", "log", "req-1"],
        &["LLEN", "queue"],
        &["TTL", "counter"],
        &["EXISTS", "lock:a", "counter"],
        &["FENCE.TOKEN", "counter"],
    ]
    .iter()
    .map(|a| argv(a))
    .collect();
    c.bench_function("kv_read_10", |b| {
        b.iter(|| {
            black_box(&reads)
                .iter()
                .map(|a| ks.read(now, a))
                .collect::<Vec<_>>()
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(std::time::Duration::from_secs(4));
    targets = keyspace
}
criterion_main!(benches);
