//! Two replicas in two processes apply the same entries — Lua scripts that would show memory
//! addresses — and end in byte-identical states (issue 23, bug 1).
//!
//! The test runs its own binary again as a child (`current_exe`, this test's name, and an
//! environment variable that makes the child print its state instead of spawning). The two
//! processes have different heap addresses (ASLR, and a different allocation history), so any
//! address a script can observe ends up in the state differently.

#[path = "support/child.rs"]
mod child;

use fenced_core::kv::KvCommand;
use fenced_core::{Batch, Command, Request, RequestId, StateMachine};

const CHILD: &str = "FENCED_LUA_TWO_PROCESSES_CHILD";
const MARK: &str = "STATE ";

/// Scripts whose results used to depend on where the interpreter put things.
const SCRIPTS: &[&str] = &[
    // The reproduction: a stored value.
    "redis.call('SET', KEYS[1], tostring({})) return redis.call('GET', KEYS[1])",
    "redis.call('SET', KEYS[1], tostring(function() end) .. tostring(coroutine.create(function() end)) \
       .. tostring(coroutine.running())) return 1",
    // A returned function, thread or userdata lands in the dedup record.
    "return function() end",
    "return {1, type, coroutine.create(function() end), 4}",
    // An error raised with a non-string value.
    "redis.call('INCR', KEYS[1]) error(function() end)",
    // Iteration over table keys: the order came from the addresses' low bits.
    "local t = {} for i = 1, 8 do t[{}] = i end for i = 1, 8 do t['s' .. i] = i end \
       for k, v in pairs(t) do redis.call('RPUSH', KEYS[1], v) end return 1",
    "local t = {a = 1} t[type] = 2 t[tostring] = 3 \
       return {pcall(function() local out = {} table.foreach(t, function(k, v) out[#out + 1] = v end) \
       redis.call('SET', KEYS[1], table.concat(out, ',')) end)}",
    "local t = {x = 1} t[{}] = 2 local ok, e = pcall(next, t) \
       redis.call('SET', KEYS[1], tostring(ok) .. tostring(e)) return e",
    // cjson's error names the first key it trips on.
    "local t = {a = 1} t[{}] = 1 t[type] = 2 t[true] = 3 \
       local ok, e = pcall(cjson.encode, t) redis.call('SET', KEYS[1], e) return e",
    // An error a Rust helper raised, shown by its __tostring.
    "local ok, e = pcall(redis.sha1hex) redis.call('SET', KEYS[1], tostring(e)) return e",
    "local ok, e = pcall(cjson.encode, {[{}] = 1}) return {tostring(ok), e, tostring(cjson.null)}",
    // Stopped by the budget between writes, the work in C (pattern matching, allocating)
    // charged to it (Semantics::BOUNDED): the same number of writes on every replica.
    "local s = string.rep('a', 40) while true do redis.call('INCR', KEYS[1]) \
       s:find(string.rep('a*', 5) .. 'b') end",
    "local s = string.rep('x', 1000) local t = {} \
       while true do t[#t + 1] = s:rep(10) redis.call('INCR', KEYS[1]) end",
    // Issue 39, item 1: a walk with `next(t, k)` from an object key visits the keys after
    // it — which ones, in the old rules, depended on where the object hashed (its address).
    "local t = {} for i = 1, 9 do t['k' .. i] = i end local o = {} t[o] = true \
       local out, k = {}, o \
       while true do k = next(t, k) if k == nil then break end out[#out + 1] = tostring(k) end \
       redis.call('SET', KEYS[1], table.concat(out, ',')) return #out",
    "local t, objs = {}, {} for i = 1, 12 do t['k' .. i] = i end \
       for i = 1, 6 do objs[i] = (i % 3 == 0) and function() end or {} t[objs[i]] = i end \
       t[objs[2]] = nil t[coroutine.create(function() end)] = 0 \
       for i = 1, 6, 2 do local k, n = objs[i], 0 \
         repeat k = next(t, k) n = n + 1 until k == nil or type(k) ~= 'string' \
         redis.call('RPUSH', KEYS[1], n) end \
       local h = {} for i = 1, 30 do h[i] = i end for i = 1, 30, 3 do h[i] = nil end \
       h[{}] = 1 h[{}] = 2 redis.call('RPUSH', KEYS[1], #h) return 1",
    // A table key moving other keys between a table's parts.
    "local t = {} for i = 1, 20 do t[i] = i end t[5] = nil t[{}] = 1 t[{}] = 2 t[9] = nil \
       local ok, e = pcall(function() local n = 0 for _ in pairs(t) do n = n + 1 end return n end) \
       return {tostring(ok), tostring(e)}",
];

fn batches() -> Vec<Batch> {
    let mut out = Vec::new();
    for round in 0..3u64 {
        for (i, script) in SCRIPTS.iter().enumerate() {
            let seq = round * SCRIPTS.len() as u64 + i as u64 + 1;
            let argv = vec![
                b"EVAL".to_vec(),
                script.as_bytes().to_vec(),
                b"1".to_vec(),
                format!("k{i}").into_bytes(),
            ];
            out.push(Batch::one(Request {
                time_ms: 1_000 + seq,
                client: Some(RequestId { client_id: 7, seq }),
                cmd: Command::Kv(KvCommand::Batch(vec![argv])),
            }));
        }
    }
    out
}

fn replica() -> StateMachine {
    let mut sm = StateMachine::new();
    // Allocate differently in each process too, so that addresses differ even without ASLR.
    let noise: Vec<Vec<u8>> = (0..std::process::id() % 97)
        .map(|i| vec![0; i as usize * 13])
        .collect();
    for (i, batch) in batches().iter().enumerate() {
        sm.apply_batch(i as u64 + 1, batch);
    }
    drop(noise);
    sm
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn replicas_in_two_processes_store_the_same_bytes() {
    let mine = replica();
    if std::env::var_os(CHILD).is_some() {
        println!("\n{MARK}{}", hex(&mine.to_bytes()));
        return;
    }
    // Under the newest rules nothing is refused for its order (issue 39): the walks ran.
    assert!(
        !format!("{mine:?}").contains("cannot iterate"),
        "an iteration was refused: {mine:?}"
    );
    let theirs = child::rerun_marked(
        "replicas_in_two_processes_store_the_same_bytes",
        CHILD,
        MARK,
    );
    let theirs = theirs.as_str();
    let ours = hex(&mine.to_bytes());
    if theirs != ours {
        let other =
            StateMachine::from_bytes(&hex_decode(theirs)).expect("the child's state decodes");
        let (a, b) = (format!("{mine:?}"), format!("{other:?}"));
        let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let from = at.saturating_sub(200);
        panic!(
            "the replicas differ at byte {at} of their Debug text:\nthis process: …{}\nthe child:    …{}",
            a.get(from..(at + 200).min(a.len())).unwrap_or(""),
            b.get(from..(at + 200).min(b.len())).unwrap_or("")
        );
    }
    assert_eq!(
        StateMachine::from_bytes(&hex_decode(theirs))
            .expect("decodes")
            .digest(),
        mine.digest()
    );
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}
