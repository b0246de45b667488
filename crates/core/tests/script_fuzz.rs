//! The script-cost and differential script fuzzer (issues 49 and 39): generated scripts —
//! pattern matching, string building, table functions, comparisons and conversions, cjson,
//! `redis.call`, loops of every length (endless ones included), errors caught midway, and
//! tables with mixed keys: tables, functions, coroutines and userdata as keys, inserted and
//! removed, walked with `pairs`, `next(t, k)` from a non-nil key and `table.foreach`, `#t`
//! with holes, `unpack`, `tostring`, cjson of them — each applied under the newest rules:
//!
//! * every script stops (a watchdog fails the run naming the script that did not);
//! * replicas agree: the same scripts applied in a fresh keyspace, in one whose interpreters
//!   have run other scripts before (reused VMs, another allocation history), and in another
//!   process give the same replies and the same state digest. The other process has another
//!   address layout (ASLR) and another allocation history (it allocates and frees a varying
//!   amount before every script), and runs the comparison's second half with the opposite
//!   interpreter-cache history (reused where this one rebuilt);
//! * the longest apply is printed (`--nocapture`): the pause a script caused here, which
//!   docs/operations.md bounds. It is reported, not asserted (timing is the bench's).
//!
//! CI runs `FUZZ_CASES` (default 300) seeds; a long run:
//! `FENCED_SCRIPT_FUZZ_CASES=1000000 cargo test --release -p fenced-core --test script_fuzz -- --nocapture`
//! (`FENCED_SCRIPT_FUZZ_FROM=N` starts at seed N, to split a long run).
//! `FENCED_SCRIPT_FUZZ_RULES=6` runs the same scripts under the rules before the budget
//! charged work in C: the watchdog then fails on the first backtracking pattern;
//! `FENCED_SCRIPT_FUZZ_RULES=8`, under the rules before objects hashed by creation id: the
//! two processes then differ (a walk from an object key, issue 39) — how the fuzzer shows it
//! can fail.

use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "support/child.rs"]
mod child;

use fenced_core::kv::{KvCommand, Reply};
use fenced_core::{Batch, Command, Request, RequestId, Semantics, StateMachine};

const CHILD: &str = "FENCED_SCRIPT_FUZZ_CHILD";
const MARK: &str = "DIGEST ";
const FUZZ_CASES: u64 = 300;
/// Far above any stopped script's time (tens of ms in release, a few hundred in debug).
const WATCHDOG: Duration = Duration::from_secs(60);

fn cases() -> u64 {
    std::env::var("FENCED_SCRIPT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FUZZ_CASES)
}

fn first_seed() -> u64 {
    std::env::var("FENCED_SCRIPT_FUZZ_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rules() -> Semantics {
    std::env::var("FENCED_SCRIPT_FUZZ_RULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Semantics::NEWEST, Semantics)
}

/// xorshift64*: the generator's only randomness, from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const ATOMS: &[&str] = &[
    "a*", "a-", ".-", ".*", "a?", "%a+", "[ab]*", "(a*)", "%d*", "()", "b", "%b()", "%f[%a]",
];
const STRINGS: &[&str] = &["'a'", "'ab'", "'('", "'x1'", "''", "'(a)'", "'aaab'"];
const COUNTS: &[&str] = &["1", "7", "100", "3000", "100000", "2000000"];
/// Objects that can be table keys (a userdata: an error a Rust helper raised).
const OBJECTS: &[&str] = &[
    "{}",
    "function() end",
    "coroutine.create(function() end)",
    "setmetatable({}, {})",
    "select(2, pcall(redis.sha1hex))",
];

fn pattern(r: &mut Rng) -> String {
    let mut p = String::new();
    if r.below(4) == 0 {
        p.push('^');
    }
    for _ in 0..1 + r.below(12) {
        p.push_str(r.pick(ATOMS));
    }
    if r.below(3) == 0 {
        p.push('b');
    }
    format!("{p:?}")
}

fn statement(r: &mut Rng, depth: u32) -> String {
    let n = r.pick(COUNTS);
    let lit = r.pick(STRINGS);
    let i = r.below(50);
    match r.below(if depth > 1 { 28 } else { 30 }) {
        0 => format!("s = string.rep({lit}, {n})"),
        1 => "s = s .. s".into(),
        2 => format!("s = s:sub({}, {})", r.below(10), r.below(100_000)),
        3 => "s = s:upper():lower()".into(),
        4 => format!("s = string.format('%s%d', s, {n})"),
        5 => format!("n = n + (select(2, s:gsub({}, 'x')) or 0)", pattern(r)),
        6 => format!("if s:find({}) then n = n + 1 end", pattern(r)),
        7 => format!("if s:match({}) then n = n + 1 end", pattern(r)),
        8 => format!("for w in s:gmatch({}) do n = n + 1 end", pattern(r)),
        9 => format!("if s:find({lit}, 1, true) then n = n + 1 end"),
        10 => "t[#t + 1] = s:sub(1, 50)".into(),
        11 => "table.insert(t, 1, tostring(n)) if #t > 3 then table.remove(t, 1) end".into(),
        12 => "s = table.concat(t, ',')".into(),
        13 => "table.sort(t)".into(),
        14 => "if s < s .. 'a' then n = n + 1 end n = n + (tonumber('1' .. s:rep(0)) or 0)".into(),
        15 => "s = cjson.encode({s, n, t}) n = n + #cjson.decode(s)".into(),
        16 => {
            "redis.call('SET', KEYS[1], s:sub(1, 100)) n = n + redis.call('INCR', KEYS[2])".into()
        }
        17 => "local ok = pcall(error, s:sub(1, 10)) if not ok then n = n + 1 end".into(),
        // Tables with mixed keys: `o` holds objects, `u` has them (and scalars) as keys, `a`
        // collects what walks see (kept short).
        18 => format!("o[#o + 1] = {}", r.pick(OBJECTS)),
        19 => format!("if #o > 0 then u[o[{i} % #o + 1]] = n end"),
        20 => format!("if #o > 0 then u[o[{i} % #o + 1]] = nil end"),
        21 => format!("u['k' .. (n % {}) .. s:sub(1, 3)] = #a u[{i}] = n", 1 + i),
        22 => format!("u[{i}] = nil u['k' .. {i}] = nil"),
        23 => "for k, v in pairs(u) do a = a .. type(k):sub(1, 1) .. tostring(v) \
               if #a > 200 then a = a:sub(-100) end end"
            .into(),
        24 => format!(
            "if #o > 0 then local k = o[{i} % #o + 1] if u[k] ~= nil then \
             for _ = 1, 6 do k = next(u, k) if k == nil then break end a = a .. tostring(k) end \
             end end a = a:sub(-150)"
        ),
        25 => "a = (a .. #u .. ',' .. table.maxn(u) .. ',' .. #o):sub(-150)".into(),
        26 => "table.foreach(u, function(k, v) n = n + 1 end) \
               a = (a .. tostring(o[1]) .. tostring((next(u)))):sub(-150)"
            .into(),
        27 => {
            "local ok, e = pcall(cjson.encode, u) a = (a .. tostring(ok) .. tostring(e)):sub(-150) \
               a = a .. select('#', unpack(u, 1, 5)) \
               .. tostring(select(2, pcall(table.concat, {unpack(u, 1, 3)}, ';'))) \
               redis.call('SET', KEYS[1], a:sub(1, 100))"
                .into()
        }
        28 => format!("for i = 1, {n} do {} end", statement(r, depth + 1)),
        _ => format!("while true do {} end", statement(r, depth + 1)),
    }
}

/// The script of `seed`.
fn script(seed: u64) -> String {
    let mut r = Rng::new(seed);
    let mut body = String::from("local s, n, t, o, u, a = 'a', 0, {}, {}, {}, '' ");
    if r.below(2) == 0 {
        // Half the scripts start with objects as keys among string and number keys.
        body.push_str(&format!(
            "for i = 1, {} do o[i] = {} u[o[i]] = i u['k' .. i] = i u[i * {}] = i end ",
            1 + r.below(20),
            r.pick(OBJECTS),
            1 + r.below(3)
        ));
    }
    for _ in 0..1 + r.below(5) {
        body.push_str(&statement(&mut r, 0));
        body.push(' ');
    }
    body.push_str("return {n, #s, #t, redis.call('GET', KEYS[1]), a}");
    body
}

fn batch(seed: u64, script: &str, semantics: Semantics) -> Batch {
    let argv = vec![
        b"EVAL".to_vec(),
        script.as_bytes().to_vec(),
        b"2".to_vec(),
        b"s".to_vec(),
        b"n".to_vec(),
    ];
    Batch {
        requests: vec![Request {
            time_ms: 1_000 + seed,
            client: Some(RequestId {
                client_id: 9,
                seq: seed + 1,
            }),
            cmd: Command::Kv(KvCommand::Batch(vec![argv])),
        }],
        semantics,
    }
}

/// Apply the scripts of `seeds` in order on `sm` under a watchdog: the replies, the longest
/// apply, and the state. With `noise`, a varying amount is allocated and freed before every
/// script, so the interpreters' objects land elsewhere than in a run without it.
fn run(
    mut sm: StateMachine,
    seeds: Vec<u64>,
    semantics: Semantics,
    noise: bool,
) -> (Vec<fenced_core::Response>, (Duration, u64), StateMachine) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut replies = Vec::new();
        let mut longest = (Duration::ZERO, 0);
        let mut junk: Vec<Vec<u8>> = Vec::new();
        let salt = u64::from(std::process::id());
        for seed in &seeds {
            if noise {
                let x = seed.wrapping_mul(0x9E37_79B9).wrapping_add(salt);
                for j in 0..1 + x % 7 {
                    junk.push(vec![j as u8; ((x >> (j * 3)) % 3000) as usize + 1]);
                }
                let drop_n = ((x >> 20) % (junk.len() as u64 + 1)) as usize;
                junk.drain(..drop_n);
            }
            let _ = tx.send(Err(*seed));
            let started = Instant::now();
            let index = sm.last_index() + 1;
            let mut out = sm.apply_batch(index, &batch(*seed, &script(*seed), semantics));
            longest = longest.max((started.elapsed(), *seed));
            replies.push(out.responses.remove(0));
        }
        drop(junk);
        let _ = tx.send(Ok((replies, longest, sm)));
    });
    let mut running = 0;
    loop {
        match rx.recv_timeout(WATCHDOG) {
            Ok(Err(seed)) => running = seed,
            Ok(Ok(done)) => return done,
            Err(_) => panic!(
                "the script of seed {running} did not stop within {WATCHDOG:?}: {}",
                script(running)
            ),
        }
    }
}

fn seeds() -> Vec<u64> {
    let from = first_seed();
    (from..from + cases()).collect()
}

fn not_reply_of(r: &fenced_core::Response) -> Option<&Reply> {
    match r {
        fenced_core::Response::Kv(k) => k.replies.first(),
        _ => None,
    }
}

/// A short text standing for a run's replies (FNV-1a of their Debug text).
fn fingerprint(replies: &[fenced_core::Response]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{replies:?}").bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The first of our replies the other process did not give, with its script.
fn first_difference(ours: &[fenced_core::Response], theirs: &str) -> String {
    for (seed, r) in seeds().into_iter().zip(ours) {
        let mine = format!("{r:?}");
        if !theirs.contains(&mine) {
            return format!(
                "seed {seed}: this process replied {mine}\nscript: {}",
                script(seed)
            );
        }
    }
    "every reply of ours is among theirs".into()
}

/// A state that ran other scripts and then these keeps their interpreters, so it runs them
/// again with reused ones; its clone starts without any (as a restarted replica does) and
/// runs them with rebuilt ones: (reused replies, that state, rebuilt replies, that state).
fn warm_and_cold(
    semantics: Semantics,
    noise: bool,
) -> (
    Vec<fenced_core::Response>,
    StateMachine,
    Vec<fenced_core::Response>,
    StateMachine,
) {
    let mut history: Vec<u64> = (10_000_000..10_000_040).collect();
    history.extend(seeds());
    let (_, _, warm) = run(StateMachine::new(), history, semantics, noise);
    let cold = warm.clone();
    let (reused, _, warm) = run(warm, seeds(), semantics, noise);
    let (rebuilt, _, cold) = run(cold, seeds(), semantics, noise);
    (reused, warm, rebuilt, cold)
}

const TEST: &str = "generated_scripts_stop_and_agree_across_interpreters_and_processes";

#[test]
fn generated_scripts_stop_and_agree_across_interpreters_and_processes() {
    let semantics = rules();
    if std::env::var_os(CHILD).is_some() {
        // The other process: allocation noise before every script, and the comparison's
        // second half from reused interpreters where the parent's is from rebuilt ones.
        let (replies, _, fresh) = run(StateMachine::new(), seeds(), semantics, true);
        let (reused, warm, _, _) = warm_and_cold(semantics, true);
        println!(
            "\n{MARK}{} {} {} {}",
            fresh.digest(),
            fingerprint(&replies),
            warm.digest(),
            fingerprint(&reused)
        );
        println!("\nREPLIES {replies:?}");
        return;
    }
    let (replies, longest, fresh) = run(StateMachine::new(), seeds(), semantics, false);
    let stopped = replies
        .iter()
        .filter(|r| matches!(not_reply_of(r), Some(Reply::Error(e)) if e.starts_with("BUSY")))
        .count();
    eprintln!(
        "{} scripts: {stopped} stopped by the budget, the longest apply took {:?} (seed {}: {})",
        replies.len(),
        longest.0,
        longest.1,
        script(longest.1)
    );
    let (reused, warm, rebuilt, cold) = warm_and_cold(semantics, false);
    assert_eq!(
        reused, rebuilt,
        "reused and rebuilt interpreters answer differently"
    );
    assert_eq!(
        warm.digest(),
        cold.digest(),
        "reused and rebuilt interpreters differ"
    );
    // Another process: another address layout and allocation history, and reused
    // interpreters against this one's rebuilt ones.
    let theirs = child::rerun_marked(TEST, CHILD, MARK);
    let ours = format!(
        "{} {} {} {}",
        fresh.digest(),
        fingerprint(&replies),
        cold.digest(),
        fingerprint(&rebuilt)
    );
    if theirs != ours {
        let their_replies = child::rerun_marked(TEST, CHILD, "REPLIES ");
        panic!(
            "the two processes differ (fresh state digest, replies; then reused against \
             rebuilt): this one {ours}, the other {theirs}; {}",
            first_difference(&replies, &their_replies)
        );
    }
}

#[test]
fn the_generator_reaches_every_kind_of_work() {
    // Cheap: the scripts only, not their runs. Each kind of statement appears.
    let all: String = (0..cases().min(300)).map(script).collect();
    for needle in [
        ":find(",
        ":gsub(",
        ":gmatch(",
        ":match(",
        "string.rep(",
        "table.sort",
        "table.insert",
        "table.concat",
        "cjson.encode",
        "redis.call('SET'",
        "while true do",
        "pcall(",
        ", 1, true)",
        "next(u, k)",
        "pairs(u)",
        "table.foreach(u",
        "coroutine.create(",
        "unpack(u",
        "cjson.encode, u",
        "u[o[",
    ] {
        assert!(all.contains(needle), "no script has {needle}");
    }
}
