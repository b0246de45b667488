//! Rate limiters through the keyspace, as the state machine applies them: `CL.THROTTLE` and
//! `LIMIT.TOKENBUCKET` parsed from RESP argument vectors, the typed token bucket
//! (`Keyspace::limit`, what `Command::Limit` runs), and for comparison the unchanged Lua
//! token-bucket script through `EVAL`. One decision per iteration over 1,000 keys, log time
//! advancing 1 ms per decision: `cargo bench -p fenced-core --bench limiter`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fenced_core::kv::{Argv, Keyspace, KvCommand};
use fenced_core::{LimitMode, Policy, Semantics};

fn argv(words: &[&str]) -> Argv {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn one(c: &mut Criterion, name: &str, cmds: Vec<KvCommand>) {
    let mut ks = Keyspace::default();
    let mut events = Vec::new();
    let mut revision: u64 = 0;
    let mut now: u64 = 1_000_000;
    let mut i = 0;
    c.bench_function(name, |b| {
        b.iter(|| {
            revision += 1;
            now += 1;
            i = (i + 1) % cmds.len();
            ks.expire_due(now);
            let r = ks.apply(
                &mut revision,
                Semantics::NEWEST,
                now,
                black_box(&cmds[i]),
                &mut events,
            );
            events.clear();
            r
        })
    });
}

fn limiters(c: &mut Criterion) {
    let keys: Vec<String> = (0..1000).map(|k| format!("user:{k}")).collect();
    let batch = |f: &dyn Fn(&str) -> Argv| -> Vec<KvCommand> {
        keys.iter().map(|k| KvCommand::Batch(vec![f(k)])).collect()
    };
    one(
        c,
        "cl_throttle",
        batch(&|k| argv(&["CL.THROTTLE", k, "15", "30", "60"])),
    );
    one(
        c,
        "limit_tokenbucket",
        batch(&|k| argv(&["LIMIT.TOKENBUCKET", k, "100", "10", "1000"])),
    );
    let script = include_str!("../../../tests/resp/token_bucket.lua");
    one(
        c,
        "lua_token_bucket_eval",
        batch(&|k| {
            let ts = format!("{k}:ts");
            argv(&["EVAL", script, "2", k, &ts, "10", "100", "1000", "1"])
        }),
    );

    let mut ks = Keyspace::default();
    let policy = Policy::token_bucket(100, 10, 1000);
    let mut revision: u64 = 0;
    let mut now: u64 = 1_000_000;
    let mut i = 0;
    c.bench_function("typed_token_bucket", |b| {
        b.iter(|| {
            revision += 1;
            now += 1;
            i = (i + 1) % keys.len();
            ks.expire_due(now);
            ks.limit(
                revision,
                now,
                black_box(keys[i].as_bytes()),
                &policy,
                1,
                LimitMode::Check,
            )
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(std::time::Duration::from_secs(4));
    targets = limiters
}
criterion_main!(benches);
