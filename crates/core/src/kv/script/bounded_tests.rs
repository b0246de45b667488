//! Every script stops under [`Semantics::BOUNDED`], whatever its work is made of: the work of
//! Lua's C functions and interpreter is charged to the same budget as instructions (the patch
//! in third_party/lua-src), at the same points on every run; older entries run as they did.
//!
//! A script that would not stop would hang the test, so each run is watched: past
//! [`WATCHDOG`] the test fails saying which script did not stop (a bound on a hang, not a
//! timing: a stopped script takes milliseconds).

use std::sync::mpsc;
use std::time::Duration;

use super::COSTLY_SCRIPTS as HOSTILE;
use crate::kv::{Keyspace, KvCommand, Reply, LUA_STEP_BUDGET};
use crate::Semantics;

const NOW: u64 = 1_000_000;
const WATCHDOG: Duration = Duration::from_secs(120);

/// Apply `scripts` (each `EVAL script 1 k`) one after another on a new keyspace under
/// `semantics`, on a thread of their own; their replies and the keyspace, or a failure
/// naming the script still running at the watchdog.
fn run_watched(semantics: Semantics, scripts: &[&str]) -> (Vec<Reply>, Keyspace) {
    let (tx, rx) = mpsc::channel();
    let owned: Vec<String> = scripts.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let mut ks = Keyspace::default();
        let mut revision = 0;
        let mut replies = Vec::new();
        for (i, script) in owned.iter().enumerate() {
            let _ = tx.send(Err(i));
            revision += 1;
            let argv = vec![
                b"EVAL".to_vec(),
                script.as_bytes().to_vec(),
                b"1".to_vec(),
                b"k".to_vec(),
            ];
            let mut r = ks.apply(
                &mut revision,
                semantics,
                NOW,
                &KvCommand::Batch(vec![argv]),
                &mut Vec::new(),
            );
            replies.push(r.replies.remove(0));
        }
        let _ = tx.send(Ok((replies, ks)));
    });
    let mut running = 0;
    loop {
        match rx.recv_timeout(WATCHDOG) {
            Ok(Err(i)) => running = i,
            Ok(Ok(done)) => return done,
            Err(_) => panic!(
                "script {running} did not stop within {WATCHDOG:?}: {:?}",
                scripts[running]
            ),
        }
    }
}

fn one(semantics: Semantics, script: &str) -> Reply {
    run_watched(semantics, &[script]).0.remove(0)
}

fn is_busy(r: &Reply) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with("BUSY script exceeded the budget of"))
}

#[test]
fn every_hostile_script_stops_with_the_budget_error() {
    let (replies, _) = run_watched(Semantics::BOUNDED, HOSTILE);
    for (script, reply) in HOSTILE.iter().zip(&replies) {
        assert!(
            is_busy(reply),
            "{script:?} should stop at the budget, got {reply:?}"
        );
        if let Reply::Error(e) = reply {
            assert!(e.contains(&format!("{LUA_STEP_BUDGET} steps")), "{e}");
        }
    }
}

#[test]
fn deep_pattern_recursion_is_refused_not_a_stack_overflow() {
    // 100 000 repeated items recurse 100 000 deep in C (a stack overflow, which kills the
    // process): Lua 5.2's limit of 200 applies.
    let r = one(
        Semantics::BOUNDED,
        "local s=string.rep('a',10) return s:find(string.rep('a*',100000))",
    );
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("pattern too complex")),
        "{r:?}"
    );
    // Catchable like any error, and the run goes on.
    let r = one(
        Semantics::BOUNDED,
        "local ok, e = pcall(string.find, 'aaa', string.rep('a*', 300)) \
         redis.call('SET', KEYS[1], tostring(ok) .. ' ' .. e) return redis.call('GET', KEYS[1])",
    );
    assert_eq!(r, Reply::bulk("false pattern too complex"));
}

#[test]
fn ordinary_scripts_give_the_same_results_under_both_rules() {
    let scripts = [
        "return {string.find('hello world', 'o w'), string.find('hello', 'l+')}",
        "return {string.match('key:123:x', '^(%a+):(%d+)'), ('a,b,,c'):gsub(',', ';')}",
        "local out = {} for w in ('one two three'):gmatch('%a+') do out[#out+1] = w end return out",
        "return {('x'):rep(5), ('ab'):rep(3, nil), (''):rep(1000000000), ('%d'):format(42)}",
        "local t = {5, 3, 9, 1} table.sort(t) table.insert(t, 1, 0) table.remove(t) \
         return {table.concat(t, ','), table.maxn(t), #t}",
        "return {tonumber('ff', 16), tonumber('  12  '), '10' + 5, 'abc' < 'abd'}",
        "return ('f(a(b)c)d'):match('%b()')",
        "local s = string.rep('ab', 1000) return {#s:gsub('b', '%0%0'), s:find('ba', 1000, true)}",
        "redis.call('RPUSH', KEYS[1], 'a', 'b', 'c') return redis.call('LRANGE', KEYS[1], 0, -1)",
    ];
    let (old, _) = run_watched(Semantics::ELECTIONS, &scripts);
    let (new, _) = run_watched(Semantics::BOUNDED, &scripts);
    assert_eq!(old, new);
    assert!(old.iter().all(|r| !matches!(r, Reply::Error(_))), "{old:?}");
}

#[test]
fn older_entries_keep_their_budget_and_uncharged_library_work() {
    // 10 M instructions: within the old budget of 50 M, past the new one of 3 M steps.
    let loop10m = "local n = 0 for i = 1, 3000000 do n = n + i end return n";
    assert_eq!(
        one(Semantics::ELECTIONS, loop10m),
        Reply::Int(4_500_001_500_000)
    );
    assert!(is_busy(&one(Semantics::BOUNDED, loop10m)));
    // Work in C that the old rules did not count: a finite backtracking match.
    let matching = "local s=string.rep('a',60) return tostring(s:find(string.rep('a*',4)..'b'))";
    assert_eq!(one(Semantics::ELECTIONS, matching), Reply::bulk("nil"));
    let r = one(
        Semantics::BOUNDED,
        "local s=string.rep('a',60) local n=0 \
         for i=1,100000 do s:find(string.rep('a*',4)..'b') n=n+1 end return n",
    );
    assert!(is_busy(&r), "{r:?}");
}

#[test]
fn a_stopped_script_keeps_the_same_writes_on_every_run() {
    // Writes between bursts of C work; the stop falls at the same write every time, in a new
    // interpreter or a reused one.
    let script = "local s=string.rep('a',40) while true do redis.call('INCR', KEYS[1]) \
                  s:find(string.rep('a*',5)..'b') end";
    let count = |ks: &mut Keyspace| {
        let mut revision = 100;
        let get = vec![b"GET".to_vec(), b"k".to_vec()];
        ks.apply(
            &mut revision,
            Semantics::BOUNDED,
            NOW,
            &KvCommand::Batch(vec![get]),
            &mut Vec::new(),
        )
        .replies
        .remove(0)
    };
    let (replies, mut first) = run_watched(Semantics::BOUNDED, &[script]);
    assert!(is_busy(&replies[0]), "{replies:?}");
    let (replies, mut twice) = run_watched(
        Semantics::BOUNDED,
        &[script, "redis.call('DEL', KEYS[1])", script],
    );
    assert!(is_busy(&replies[2]), "{replies:?}");
    let once = count(&mut first);
    assert!(
        matches!(&once, Reply::Bulk(b) if b.as_slice() != b"0"),
        "{once:?}"
    );
    assert_eq!(once, count(&mut twice));
}
