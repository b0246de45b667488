//! What a script can observe is replica-independent under [`Semantics::DETERMINISTIC`], and
//! exactly what it was under [`Semantics::REVISIONS`] (entries written before the change).

use crate::kv::{Keyspace, KvCommand, Reply};
use crate::Semantics;

const NOW: u64 = 1_000_000;

/// A keyspace that applies every command under one set of rules.
struct K {
    ks: Keyspace,
    revision: u64,
    semantics: Semantics,
}

impl K {
    fn new(semantics: Semantics) -> K {
        K {
            ks: Keyspace::default(),
            revision: 0,
            semantics,
        }
    }

    fn eval(&mut self, script: &str) -> Reply {
        self.revision += 1;
        let argv = vec![b"EVAL".to_vec(), script.as_bytes().to_vec(), b"0".to_vec()];
        let mut r = self.ks.apply(
            &mut self.revision,
            self.semantics,
            NOW,
            &KvCommand::Batch(vec![argv]),
            &mut Vec::new(),
        );
        r.replies.remove(0)
    }

    fn text(&mut self, script: &str) -> String {
        match self.eval(script) {
            Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
            Reply::Error(e) => e,
            Reply::Status(s) => s,
            other => panic!("expected text from {script:?}, got {other:?}"),
        }
    }
}

fn det() -> K {
    K::new(Semantics::DETERMINISTIC)
}

fn bulk(s: &str) -> Reply {
    Reply::bulk(s)
}

#[test]
fn tostring_numbers_objects_per_run_in_order_of_first_sight() {
    let mut k = det();
    let script = "local t, f, co = {}, function() end, coroutine.create(function() end) \
                  return tostring(t) .. ' ' .. tostring(f) .. ' ' .. tostring(co) .. ' ' \
                  .. tostring(t) .. ' ' .. tostring({}) .. ' ' .. tostring(coroutine.running()) \
                  .. ' ' .. tostring(type) .. ' ' .. tostring(tostring)";
    let want = "table: 1 function: 2 thread: 3 table: 1 table: 4 nil function: 5 function: 6";
    assert_eq!(k.text(script), want);
    // The same text on every run (the numbering starts again), reused interpreter or not.
    assert_eq!(k.text(script), want);
    assert_eq!(det().text(script), want);
    // Scalars and __tostring are as in Lua.
    assert_eq!(
        k.text(
            "return tostring(1.5) .. tostring(nil) .. tostring(true) .. tostring('s') \
             .. tostring(setmetatable({}, {__tostring = function() return '<mine>' end, \
             __metatable = false}))"
        ),
        "1.5niltrues<mine>"
    );
    assert_eq!(
        k.text("return tostring(cjson.null)"),
        "userdata: (nil)",
        "cjson.null (a NULL pointer) shows no address"
    );
    assert_eq!(
        k.eval("local ok, e = pcall(tostring) return e"),
        bulk("bad argument #1 to 'tostring' (value expected)")
    );
    // Errors raised by a Rust helper are userdata whose __tostring is the message.
    assert_eq!(
        k.text("local ok, e = pcall(redis.sha1hex) return tostring(e)"),
        k.text("local ok, e = pcall(redis.sha1hex) return tostring(e)"),
    );
}

#[test]
fn a_value_stored_from_tostring_is_the_same_on_every_replica() {
    // The reproduction: the stored value used to be `table: 0x…`.
    let script = "redis.call('SET', 'addr', tostring({}) .. tostring(function() end)) \
                  return redis.call('GET', 'addr')";
    let mut a = det();
    assert_eq!(a.eval(script), bulk("table: 1function: 2"));
    // Another replica, whose interpreter ran other scripts before.
    let mut b = det();
    b.eval("local t = {} for i = 1, 100 do t[i] = {} end return tostring(t[50])");
    assert_eq!(b.eval(script), bulk("table: 1function: 2"));
}

#[test]
fn iteration_over_object_keys_is_refused() {
    let mut k = det();
    for setup in [
        "local t = {a = 1, b = 2} t[{}] = 3",
        "local t = {1, 2} t[function() end] = 3",
        "local t = {} t[coroutine.create(function() end)] = 1",
        "local ok, e = pcall(redis.sha1hex) local t = {x = 1} t[e] = 2",
    ] {
        for iterate in [
            "for k in pairs(t) do redis.call('RPUSH', 'seen', type(k)) end",
            "local k = next(t) while k ~= nil do redis.call('RPUSH', 'seen', type(k)) k = next(t, k) end",
            "table.foreach(t, function(k) redis.call('RPUSH', 'seen', type(k)) end)",
        ] {
            let script = format!("{setup} {iterate} return 'iterated'");
            let e = k.text(&script);
            assert!(
                e.contains("cannot iterate over a table with table, function, thread or userdata keys"),
                "{script}: {e}"
            );
            // Refused before the first key: nothing was written.
            assert_eq!(k.eval("return redis.call('LLEN', 'seen')"), Reply::Int(0), "{script}");
        }
    }
    // pcall catches it, like any error.
    assert_eq!(
        k.eval("local t = {} t[{}] = 1 return tostring(pcall(next, t))"),
        bulk("false")
    );
    // Scalar keys iterate as in Lua; an empty table too; errors keep Lua's wording.
    assert_eq!(
        k.eval(
            "local t, n = {a = 1, [2] = 2, [true] = 3, [1.5] = 4}, 0 \
             for k, v in pairs(t) do n = n + v end \
             table.foreach(t, function(k, v) n = n + v end) \
             return {n, next({}) == nil and 1 or 0}"
        ),
        Reply::Array(vec![Reply::Int(20), Reply::Int(1)])
    );
    assert_eq!(
        k.eval("local ok, e = pcall(pairs) return e"),
        bulk("bad argument #1 to 'pairs' (table expected, got no value)")
    );
    assert_eq!(
        k.eval("local ok, e = pcall(next, 1) return e"),
        bulk("bad argument #1 to 'next' (table expected, got number)")
    );
    // The sandbox's own keys (globals, libraries) are strings: iterable.
    assert_eq!(
        k.eval("local n = 0 for _ in pairs(_G) do n = n + 1 end return n > 10 and 1 or 0"),
        Reply::Int(1)
    );
}

#[test]
fn iteration_order_of_scalar_keys_is_lua_s() {
    // The same order under both rule sets (Lua 5.1's string hash has no seed).
    let script = "local t, out = {}, {} for i = 1, 40 do t['k' .. i] = i t[i * 3] = i end \
                  t[true] = 0 t[2.5] = 0 for k in pairs(t) do out[#out + 1] = tostring(k) end \
                  return table.concat(out, ',')";
    let old = K::new(Semantics::REVISIONS).text(script);
    assert_eq!(det().text(script), old);
}

#[test]
fn cjson_refuses_object_keys_with_one_message() {
    let mut k = det();
    // Which key lua-cjson trips on first depends on the iteration order; the message must not.
    let script = "local seen, n = {}, 0 for i = 1, 64 do \
                    local t = {a = 1} t[{}] = 1 t[function() end] = 2 t[true] = 3 \
                    local ok, e = pcall(cjson.encode, t) \
                    if not seen[e] then seen[e] = true n = n + 1 end \
                  end \
                  local ok, e = pcall(cjson.encode, {x = {[{}] = 1, [true] = 2}}) \
                  return {n, e}";
    assert_eq!(
        k.eval(script),
        Reply::Array(vec![
            Reply::Int(1),
            bulk("Cannot serialise boolean: table key must be a number or string")
        ])
    );
    assert_eq!(
        k.text("local t = {} t[{}] = 1 return select(2, pcall(cjson.encode, t))"),
        "Cannot serialise table: table key must be a number or string"
    );
}

#[test]
fn a_returned_function_thread_or_userdata_is_nil() {
    let mut k = det();
    assert_eq!(k.eval("return function() end"), Reply::Nil);
    assert_eq!(
        k.eval("return coroutine.running() or coroutine.create(function() end)"),
        Reply::Nil
    );
    assert_eq!(
        k.eval("return {1, type, 3}"),
        Reply::Array(vec![Reply::Int(1), Reply::Nil, Reply::Int(3)])
    );
    assert_eq!(k.eval("return cjson.null"), Reply::Nil);
    // Raised as an error: no address in the message either.
    let e = k.text("error(function() end)");
    assert!(!e.contains("0x"), "{e}");
}

#[test]
fn entries_stamped_revisions_behave_as_before() {
    let mut k = K::new(Semantics::REVISIONS);
    assert!(k.text("return tostring({})").starts_with("table: 0x"));
    assert!(k.text("return function() end").starts_with("function: 0x"));
    assert_eq!(
        k.eval("local t = {} t[{}] = 1 local n = 0 for _ in pairs(t) do n = n + 1 end return n"),
        Reply::Int(1)
    );
}

/// Issue 49: only the server publishes on `fenced:*`. A script's `PUBLISH` there is refused
/// with the front end's error under `Semantics::REQUEST_DIGESTS` (it used to be applied and
/// only suppressed at delivery, so the script saw success); other channels still publish,
/// and older entries replay as they did.
#[test]
fn a_script_publishing_on_a_reserved_channel_is_refused() {
    let reserved = "return redis.call('PUBLISH', 'fenced:lost:owner:bob', 'forged')";
    let mut k = K::new(Semantics::NEWEST);
    assert_eq!(
        k.text(reserved),
        "ERR channels starting with 'fenced:' are reserved for the server's own events",
        "PUBLISH fenced:* from a script"
    );
    assert_eq!(
        k.text("return redis.pcall('PUBLISH', 'fenced:x', 'm')['err']"),
        "ERR channels starting with 'fenced:' are reserved for the server's own events"
    );
    assert_eq!(
        k.eval("return redis.call('PUBLISH', 'news', 'm')"),
        Reply::Int(0)
    );
    let mut old = K::new(Semantics::LUA_IDS);
    assert_eq!(
        old.eval(reserved),
        Reply::Int(0),
        "older rules replay as before"
    );
}
