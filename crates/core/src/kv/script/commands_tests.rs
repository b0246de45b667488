//! Under [`Semantics::CHARGED_COMMANDS`] a script's `redis.call` pays the command's own
//! data-dependent work before it runs (`kv/cmd/cost.rs`, issue 49): `KEYS` over a big
//! keyspace, `LREM` over a long list, a `KEYS` pattern that matches nothing. Each case is
//! a loop that counts its calls in a key (`INCR n`, a write that stays when the script is
//! stopped): under the new rules it stops `BUSY` after the same number of calls on every
//! run, the number the charge predicts; under the rules before (16) the same loop finishes.
//! The charge is asserted, not the time.

use super::ids_tests::eval;
use crate::kv::{Keyspace, KvCommand, Reply, LUA_STEP_BUDGET};
use crate::Semantics;

const OLD: Semantics = Semantics::WITHDRAWALS;
const NEW: Semantics = Semantics::CHARGED_COMMANDS;
const NOW: u64 = 1_000_000;

fn apply(ks: &mut Keyspace, revision: &mut u64, argv: Vec<Vec<u8>>) -> Reply {
    *revision += 1;
    let mut r = ks.apply(
        revision,
        NEW,
        NOW,
        &KvCommand::Batch(vec![argv]),
        &mut Vec::new(),
    );
    r.replies.remove(0)
}

/// A keyspace of `n` string keys `k0`… and a list `list` of `elements` items.
fn keyspace(n: usize, elements: usize) -> (Keyspace, u64) {
    let (mut ks, mut rev) = (Keyspace::default(), 0);
    let mut mset = vec![b"MSET".to_vec()];
    for i in 0..n {
        mset.push(format!("k{i}").into_bytes());
        mset.push(b"v".to_vec());
    }
    if n > 0 {
        assert_eq!(apply(&mut ks, &mut rev, mset), Reply::ok());
    }
    let mut push = vec![b"RPUSH".to_vec(), b"list".to_vec()];
    push.extend((0..elements).map(|i| format!("item{}", i % 10).into_bytes()));
    if elements > 0 {
        assert_eq!(apply(&mut ks, &mut rev, push), Reply::Int(elements as i64));
    }
    (ks, rev)
}

fn is_busy(r: &Reply) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with("BUSY script exceeded the budget of"))
}

/// Run `script` (a loop of `calls` commands, each followed by `INCR n`) on a fresh keyspace
/// built by `build`; its reply and how many calls completed.
fn run(semantics: Semantics, build: (usize, usize), script: &str) -> (Reply, i64) {
    let (mut ks, mut rev) = keyspace(build.0, build.1);
    let reply = eval(&mut ks, &mut rev, semantics, script);
    let n = match apply(&mut ks, &mut rev, vec![b"GET".to_vec(), b"n".to_vec()]) {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).parse().unwrap_or(-1),
        _ => 0,
    };
    (reply, n)
}

/// A loop of `KEYS` over 50,000 keys with a pattern matching ten of them: under 16 each
/// call cost its 100 steps, its arguments and its small reply, so 20 walks of the keyspace
/// finished (a script could make ~30,000); under 17 each also pays the walk, 16 steps a key
/// and its glob bytes (~840,000 steps), so the budget of 3 M ends it at the fourth call, on
/// every run. (`KEYS *` over as many keys was stopped before too: its 50,000 strings made
/// in Lua are charged.)
#[test]
fn keys_over_50000_keys_stops_at_the_same_call() {
    let script = "for i = 1, 20 do redis.call('KEYS', 'k4999?') redis.call('INCR', 'n') end \
                  return 'done'";
    let (old, n_old) = run(OLD, (50_000, 0), script);
    assert_eq!(
        (old, n_old),
        (Reply::bulk("done"), 20),
        "under the rules before"
    );
    let walk = 50_000 * crate::kv::cmd::cost::KEY_STEPS;
    assert!(walk * 4 > LUA_STEP_BUDGET && walk * 3 < LUA_STEP_BUDGET);
    let (new, n) = run(NEW, (50_000, 0), script);
    assert!(is_busy(&new), "under the charged-command rules: {new:?}");
    assert_eq!(n, 3, "stopped at the fourth KEYS");
    let (again, n_again) = run(NEW, (50_000, 0), script);
    assert_eq!(
        (again, n_again),
        (new, n),
        "every run stops at the same call"
    );
}

/// `KEYS` matching nothing answers an empty array (its reply cost one step): under 16 a
/// script could walk the keyspace ~30,000 times; under 17 each walk is paid.
#[test]
fn keys_matching_nothing_is_charged_by_the_keys_it_visits() {
    let script = "for i = 1, 100 do redis.call('KEYS', 'nomatch*') redis.call('INCR', 'n') end \
                  return 'done'";
    let (old, n_old) = run(OLD, (10_000, 0), script);
    assert_eq!((old, n_old), (Reply::bulk("done"), 100));
    let (new, n) = run(NEW, (10_000, 0), script);
    assert!(is_busy(&new), "{new:?}");
    // Each call: 10,000 keys × 16 steps, the glob's 48,890 key bytes × 9 / 64 and two
    // calls' 200 steps, ~167,000 steps: 17 fit in 3 M.
    assert_eq!(n, 17);
}

/// `LREM` walks the whole list and answers one integer.
#[test]
fn lrem_on_a_long_list_is_charged_by_its_elements() {
    let script = "for i = 1, 50 do redis.call('LREM', 'list', 0, 'absent') \
                  redis.call('INCR', 'n') end return 'done'";
    let (old, n_old) = run(OLD, (0, 100_000), script);
    assert_eq!((old, n_old), (Reply::bulk("done"), 50));
    let (new, n) = run(NEW, (0, 100_000), script);
    assert!(is_busy(&new), "{new:?}");
    // 100,000 elements × 4 steps each: 7 calls fit in 3 M steps.
    assert_eq!(n, 7);
}

/// Cheap commands on big data are not charged by its size: `LRANGE list 0 9` on a
/// 100,000-element list, `LLEN`, `GET`, an `EXPIRE` in the future pay their range or
/// nothing.
#[test]
fn constant_work_is_not_charged_by_the_size_of_the_data() {
    let script = "for i = 1, 1000 do redis.call('LRANGE', 'list', 0, 9) \
                  redis.call('LLEN', 'list') redis.call('GET', 'k1') \
                  redis.call('EXPIRE', 'list', 100000) end return 'done'";
    let (new, _) = run(NEW, (1_000, 100_000), script);
    assert_eq!(new, Reply::bulk("done"));
}
