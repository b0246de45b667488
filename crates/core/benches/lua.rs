//! `EVAL` of a small compare-and-delete script through `Keyspace::apply`, as the state
//! machine runs it, and how long the costliest scripts run before their budget stops them
//! (`eval_stopped/*`: the longest pause one script can cause, docs/operations.md):
//! `cargo bench -p fenced-core --bench lua`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fenced_core::kv::{Argv, Keyspace, KvCommand, Reply, COSTLY_SCRIPTS};
use fenced_core::Semantics;

const CAD: &str =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

fn argv(words: &[&str]) -> Argv {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn eval_compare_and_delete(c: &mut Criterion) {
    let now = 1_000_000;
    let eval = argv(&["EVAL", CAD, "1", "lock", "owner-1"]);

    // The key holds another owner's value: GET, compare, return 0.
    let mut ks = Keyspace::default();
    let mut events = Vec::new();
    ks.apply(
        &mut 1,
        fenced_core::Semantics::NEWEST,
        now,
        &KvCommand::Batch(vec![argv(&["SET", "lock", "owner-2"])]),
        &mut events,
    );
    let miss = KvCommand::Batch(vec![eval.clone()]);
    let mut index: u64 = 2;
    c.bench_function("eval_cad_miss", |b| {
        b.iter(|| {
            index += 1;
            let r = ks.apply(
                &mut index,
                fenced_core::Semantics::NEWEST,
                now,
                black_box(&miss),
                &mut events,
            );
            events.clear();
            r
        })
    });

    // SET the key, then the script deletes it (one pipeline, two commands).
    let mut ks = Keyspace::default();
    let hit = KvCommand::Batch(vec![argv(&["SET", "lock", "owner-1"]), eval]);
    let mut index: u64 = 1;
    c.bench_function("eval_cad_hit", |b| {
        b.iter(|| {
            index += 1;
            let r = ks.apply(
                &mut index,
                fenced_core::Semantics::NEWEST,
                now,
                black_box(&hit),
                &mut events,
            );
            events.clear();
            r
        })
    });
}

/// Scripts that iterate a 100-key table with `pairs` (what the deterministic rules wrap):
/// string keys (new strings: the interpreter is rebuilt after every run) and integer keys.
fn eval_pairs(c: &mut Criterion) {
    const PAIRS: &str = "local t = {} for i = 1, 100 do t['k' .. i] = i end \
        local n = 0 for k, v in pairs(t) do n = n + v end return n";
    const IPAIRS: &str = "local t = {} for i = 1, 100 do t[i] = i end \
        local n = 0 for k, v in pairs(t) do n = n + v end return n";
    for (name, script) in [("eval_pairs_100", PAIRS), ("eval_pairs_int_100", IPAIRS)] {
        eval_bench(c, name, script);
    }
}

fn eval_bench(c: &mut Criterion, name: &str, script: &str) {
    let now = 1_000_000;
    let mut ks = Keyspace::default();
    let mut events = Vec::new();
    let cmd = KvCommand::Batch(vec![argv(&["EVAL", script, "0"])]);
    let mut index: u64 = 1;
    c.bench_function(name, |b| {
        b.iter(|| {
            index += 1;
            let r = ks.apply(
                &mut index,
                fenced_core::Semantics::NEWEST,
                now,
                black_box(&cmd),
                &mut events,
            );
            events.clear();
            r
        })
    });
}

/// Scripts that only their budget stops, each run to its `BUSY` error: Lua instructions alone
/// (under the bounded rules and, for comparison, under the older 50 M-instruction budget),
/// allocation in Lua, colliding hash keys, and every script of `COSTLY_SCRIPTS` (work in C).
fn eval_stopped(c: &mut Criterion) {
    let mut group = c.benchmark_group("eval_stopped");
    group.sample_size(10);
    let mut scripts: Vec<(String, &str, Semantics)> = vec![
        (
            "instructions".into(),
            "while true do end",
            Semantics::NEWEST,
        ),
        (
            "instructions_old_rules".into(),
            "while true do end",
            Semantics::ELECTIONS,
        ),
        (
            "tables".into(),
            "local t = {} while true do t = {t} end",
            Semantics::NEWEST,
        ),
        // Number keys sharing one hash chain (Lua 5.1's hashnum adds the two halves): the
        // chain steps are charged under Semantics::LUA_IDS (issue 49's hash-chain gap).
        (
            "colliding_keys".into(),
            "local t = {} for i = 1, 1e6 do \
             t[1 + (i * 4294967296 + 2147483648 - i) / 4503599627370496] = i end",
            Semantics::NEWEST,
        ),
    ];
    for (i, script) in COSTLY_SCRIPTS.iter().enumerate() {
        scripts.push((format!("costly_{i:02}"), script, Semantics::NEWEST));
    }
    for (name, script, semantics) in scripts {
        let mut ks = Keyspace::default();
        let mut events = Vec::new();
        let cmd = KvCommand::Batch(vec![argv(&["EVAL", script, "1", "k"])]);
        let mut index: u64 = 1;
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                index += 1;
                let r = ks.apply(
                    &mut index,
                    semantics,
                    1_000_000,
                    black_box(&cmd),
                    &mut events,
                );
                events.clear();
                assert!(
                    matches!(r.replies.first(), Some(Reply::Error(e)) if e.starts_with("BUSY")),
                    "{name} should stop at its budget: {:?}",
                    r.replies
                );
                r
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(std::time::Duration::from_secs(4));
    targets = eval_compare_and_delete, eval_pairs, eval_stopped
}
criterion_main!(benches);
