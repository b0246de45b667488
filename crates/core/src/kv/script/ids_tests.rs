//! Under [`Semantics::LUA_IDS`] the patched Lua hashes a script's tables, functions,
//! coroutines and userdata by creation id (third_party/lua-src, `ltable.c`): iteration over
//! any table is allowed and visits keys in the same order in every interpreter — fresh or
//! reused, whatever ran before — and the steps along hash chains are charged, so keys chosen
//! to collide stop at the budget (issue 49's hash-chain gap). Older rules are unchanged.

use std::time::Instant;

use crate::kv::{Keyspace, KvCommand, Reply};
use crate::Semantics;

const NOW: u64 = 1_000_000;

/// One `EVAL script 0` applied at `revision + 1`; its reply (also helpers_tests's).
pub(super) fn eval(
    ks: &mut Keyspace,
    revision: &mut u64,
    semantics: Semantics,
    script: &str,
) -> Reply {
    *revision += 1;
    let argv = vec![b"EVAL".to_vec(), script.as_bytes().to_vec(), b"0".to_vec()];
    let mut r = ks.apply(
        revision,
        semantics,
        NOW,
        &KvCommand::Batch(vec![argv]),
        &mut Vec::new(),
    );
    r.replies.remove(0)
}

/// Walks that used to be refused (or, from a non-nil key, to depend on addresses).
const WALKS: &[&str] = &[
    // Issue 39's reproduction: `next(t, k)` from an object key.
    "local t = {} for i = 1, 9 do t['k' .. i] = i end local o = {} t[o] = true \
     local out, k = {}, o \
     while true do k = next(t, k) if k == nil then break end out[#out + 1] = tostring(k) end \
     return table.concat(out, ',')",
    // pairs over tables, functions, coroutines as keys, some removed again.
    "local t, objs = {}, {} for i = 1, 40 do local o = ({ {}, function() end, \
     coroutine.create(function() end) })[i % 3 + 1] objs[i] = o t[o] = i t['s' .. i] = i end \
     for i = 1, 40, 3 do t[objs[i]] = nil end \
     local out = {} for k, v in pairs(t) do out[#out + 1] = type(k) .. v end \
     return table.concat(out, ' ')",
    // table.foreach, and `#t` of a table with holes that held object keys.
    "local t = {} for i = 1, 50 do t[i] = i end for i = 1, 50, 4 do t[i] = nil end \
     for i = 1, 20 do t[{}] = i end local out = {} \
     table.foreach(t, function(k, v) out[#out + 1] = v end) \
     return #t .. ':' .. table.concat(out, ',')",
];

fn walk_all(ks: &mut Keyspace, revision: &mut u64) -> Vec<Reply> {
    WALKS
        .iter()
        .map(|s| eval(ks, revision, Semantics::LUA_IDS, s))
        .collect()
}

#[test]
fn walks_over_object_keys_run_and_agree_across_interpreters() {
    let (mut a, mut ra) = (Keyspace::default(), 0);
    let first = walk_all(&mut a, &mut ra);
    for r in &first {
        assert!(matches!(r, Reply::Bulk(_)), "a walk failed: {r:?}");
    }
    // The same interpreters, reused.
    assert_eq!(walk_all(&mut a, &mut ra), first);
    // Another replica, whose heap and interpreter cache have another history: other
    // scripts first (allocating, with object keys of their own), and garbage in between.
    let (mut b, mut rb) = (Keyspace::default(), 0);
    let noise: Vec<Vec<u8>> = (0..300).map(|i| vec![1; i * 7]).collect();
    for s in [
        "local t = {} for i = 1, 500 do t[{}] = i end return 1",
        "local t = {} for i = 1, 200 do t[i] = tostring(i):rep(i) end return #t",
    ] {
        eval(&mut b, &mut rb, Semantics::LUA_IDS, s);
    }
    drop(noise);
    assert_eq!(walk_all(&mut b, &mut rb), first);
    assert_eq!(
        walk_all(&mut b, &mut rb),
        first,
        "the second run of each, reused"
    );
}

#[test]
fn older_rules_still_refuse_iterating_object_keys() {
    let (mut ks, mut rev) = (Keyspace::default(), 0);
    for semantics in [Semantics::DETERMINISTIC, Semantics::SESSION_OWNERS] {
        match eval(&mut ks, &mut rev, semantics, WALKS[1]) {
            Reply::Error(e) => assert!(e.contains("cannot iterate"), "{e}"),
            other => panic!("not refused under {semantics:?}: {other:?}"),
        }
    }
}

/// `n` distinct numbers whose two 32-bit halves have the same sum: Lua 5.1's `hashnum`
/// puts them all in one main position, whatever the table's size.
fn colliding(n: &str) -> String {
    format!(
        "local t = {{}} for i = 1, {n} do \
         t[1 + (i * 4294967296 + 2147483648 - i) / 4503599627370496] = i end return 1"
    )
}

#[test]
fn keys_sharing_one_hash_chain_are_charged_and_stopped() {
    let (mut ks, mut rev) = (Keyspace::default(), 0);
    // Under the newest rules, a script inserting keys that share one chain stops at the
    // budget: each insert's walk along the chain is charged.
    let started = Instant::now();
    let r = eval(&mut ks, &mut rev, Semantics::LUA_IDS, &colliding("1e6"));
    let stopped = started.elapsed();
    match &r {
        Reply::Error(e) => assert!(e.starts_with("BUSY"), "{e}"),
        other => panic!("not stopped: {other:?}"),
    }
    // Under the bounded rules before them the walks cost nothing: 20,000 keys (a tiny part
    // of what the memory limit allows) finish within the budget however long they take.
    let started = Instant::now();
    let old = eval(
        &mut ks,
        &mut rev,
        Semantics::SESSION_OWNERS,
        &colliding("20000"),
    );
    let unstopped = started.elapsed();
    assert_eq!(old, Reply::Int(1), "the older rules did not charge chains");
    // The same 20,000 under the newest rules: stopped.
    let r = eval(&mut ks, &mut rev, Semantics::LUA_IDS, &colliding("20000"));
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
        "{r:?}"
    );
    println!(
        "colliding keys: stopped at the budget after {stopped:?} (Semantics::LUA_IDS); \
         20,000 of them under the older rules took {unstopped:?}, unstopped"
    );
}

#[test]
fn the_lua_build_fingerprint_is_stable_and_covers_libm() {
    let a = crate::kv::lua_build();
    assert_ne!(a, 0);
    assert_eq!(a, crate::kv::lua_build());
    // The same C computation again, outside the cache: a constant of the build.
    extern "C" {
        fn lua_fenced_layout() -> u64;
    }
    // SAFETY: a pure C function.
    assert_eq!(unsafe { lua_fenced_layout() }, a);
    println!("this build's Lua fingerprint: {a:016x}");
}

#[test]
fn ordinary_tables_cost_about_what_they_did() {
    // Keys that do not collide walk short chains: a script well inside the budget under
    // the older rules stays inside it.
    let script = "local t = {} for i = 1, 20000 do t['k' .. i] = i t[{}] = i end \
                  local n = 0 for k, v in pairs(t) do n = n + 1 end return n";
    let (mut ks, mut rev) = (Keyspace::default(), 0);
    assert_eq!(
        eval(&mut ks, &mut rev, Semantics::LUA_IDS, script),
        Reply::Int(40_000)
    );
}
