use super::script::sha1hex;
use super::*;
use crate::{Millis, Revision, Semantics};

fn argv(s: &str) -> Argv {
    s.split_whitespace()
        .map(|w| w.as_bytes().to_vec())
        .collect()
}

struct T {
    ks: Keyspace,
    revision: Revision,
    now: Millis,
    events: Vec<KvEvent>,
    /// The rules commands are applied by (the newest unless a test says otherwise).
    semantics: Semantics,
}

impl T {
    fn new() -> T {
        T {
            ks: Keyspace::default(),
            revision: 0,
            now: 1_000_000,
            events: vec![],
            semantics: Semantics::NEWEST,
        }
    }
    fn run(&mut self, cmd: &str) -> Reply {
        self.runv(argv(cmd))
    }
    fn runv(&mut self, a: Argv) -> Reply {
        self.revision += 1;
        self.ks.expire_due(self.now);
        let mut r = self.ks.apply(
            &mut self.revision,
            self.semantics,
            self.now,
            &KvCommand::Batch(vec![a]),
            &mut self.events,
        );
        r.replies.remove(0)
    }
    fn read(&self, cmd: &str) -> Reply {
        self.ks.read(self.now, &argv(cmd)).expect("a read command")
    }
}

fn bulk(s: &str) -> Reply {
    Reply::bulk(s)
}

#[test]
fn strings_and_revisions() {
    let mut t = T::new();
    assert_eq!(t.run("SET k v NX PX 1000"), Reply::ok());
    assert_eq!(t.run("SET k w NX PX 1000"), Reply::Nil);
    assert_eq!(t.read("FENCE.TOKEN k"), Reply::Int(1));
    assert_eq!(t.run("SET k w XX KEEPTTL"), Reply::ok());
    assert_eq!(
        t.read("FENCE.TOKEN k"),
        Reply::Int(1),
        "create revision survives updates"
    );
    assert_eq!(t.ks.get(b"k", t.now).map(|e| e.mod_revision), Some(3));
    assert_eq!(t.read("PTTL k"), Reply::Int(1000));
    assert_eq!(t.run("SET k x GET"), bulk("w"));
    assert_eq!(t.read("PTTL k"), Reply::Int(-1));
    assert_eq!(
        t.run("INCR k"),
        Reply::err("ERR value is not an integer or out of range")
    );
    assert_eq!(t.run("INCR n"), Reply::Int(1));
    assert_eq!(t.run("INCRBY n 41"), Reply::Int(42));
    assert_eq!(t.run("DECR n"), Reply::Int(41));
    assert_eq!(t.run("HSET k f v"), Reply::err(WRONGTYPE));
    assert_eq!(
        t.run("SET k v EX 0"),
        Reply::err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(t.run("SET k v NX XX"), Reply::err("ERR syntax error"));
    assert_eq!(t.run("DEL k n nope"), Reply::Int(2));
    assert_eq!(t.read("FENCE.TOKEN k"), Reply::Nil);
}

/// `FENCE.TOKEN key value` answers only for the value's holder: a client whose `SET NX` lease
/// ran out before it asked must not get the next holder's token.
#[test]
fn fence_token_for_a_value() {
    let mut t = T::new();
    assert_eq!(t.run("SET lk alice NX PX 100"), Reply::ok());
    assert_eq!(t.read("FENCE.TOKEN lk alice"), Reply::Int(1));
    assert_eq!(t.read("FENCE.TOKEN lk bob"), Reply::Nil);
    t.now += 200; // alice's lease runs out; bob takes the lock
    assert_eq!(t.run("SET lk bob NX PX 100"), Reply::ok());
    assert_eq!(
        t.read("FENCE.TOKEN lk alice"),
        Reply::Nil,
        "alice must not get bob's token"
    );
    assert_eq!(t.read("FENCE.TOKEN lk bob"), Reply::Int(2));
    assert_eq!(t.read("FENCE.TOKEN lk"), Reply::Int(2));
    assert_eq!(t.run("SET lk carol XX KEEPTTL"), Reply::ok());
    assert_eq!(
        t.read("FENCE.TOKEN lk bob"),
        Reply::Nil,
        "overwritten by another value"
    );
    assert_eq!(t.read("FENCE.TOKEN nope bob"), Reply::Nil);
    assert_eq!(t.run("HSET h f v"), Reply::Int(1));
    assert_eq!(t.read("FENCE.TOKEN h x"), Reply::err(WRONGTYPE));
    assert_eq!(t.read("FENCE.TOKEN lk a b"), Reply::err("ERR syntax error"));
}

#[test]
fn expiry_is_evaluated_at_the_read_time() {
    let mut t = T::new();
    t.run("SET k v PX 100");
    assert_eq!(t.read("GET k"), bulk("v"));
    // No entry applied since, but a read at a later log time sees the key gone.
    assert_eq!(t.ks.read(t.now + 100, &argv("GET k")), Some(Reply::Nil));
    assert_eq!(
        t.ks.read(t.now + 99, &argv("EXISTS k")),
        Some(Reply::Int(1))
    );
    assert_eq!(t.ks.next_deadline(), Some(t.now + 100));
    t.now += 100;
    t.run("PING_NOT_A_COMMAND");
    assert_eq!(t.ks.next_deadline(), None);
    assert!(t.ks.is_empty(t.now));
}

#[test]
fn unknown_and_arity_errors_are_redis_exact() {
    let mut t = T::new();
    assert_eq!(
        t.run("FOO a b"),
        Reply::err("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
    );
    assert_eq!(
        t.run("get"),
        Reply::err("ERR wrong number of arguments for 'get' command")
    );
}

/// A command that fails on a container changes nothing: not its value, not its revision
/// (so it aborts no `WATCH`).
#[test]
fn a_failed_container_command_changes_nothing() {
    let mut t = T::new();
    t.run("HSET h word abc");
    t.run("RPUSH l a");
    t.run("ZADD z inf m");
    let before = t.ks.clone();
    assert_eq!(
        t.run("HINCRBY h word 1"),
        Reply::err("ERR hash value is not an integer")
    );
    assert_eq!(t.run("LSET l 5 x"), Reply::err("ERR index out of range"));
    assert_eq!(
        t.run("ZINCRBY z -inf m"),
        Reply::err("ERR resulting score is not a number (NaN)")
    );
    assert_eq!(
        t.run("ZADD z INCR -inf m"),
        Reply::err("ERR resulting score is not a number (NaN)")
    );
    assert_eq!(t.ks, before, "failed commands changed the keyspace");
}

#[test]
fn hincrbyfloat_as_redis_documents_it() {
    let mut t = T::new();
    // The examples of https://redis.io/commands/hincrbyfloat/.
    assert_eq!(t.run("HSET mykey field 10.50"), Reply::Int(1));
    assert_eq!(t.run("HINCRBYFLOAT mykey field 0.1"), bulk("10.6"));
    assert_eq!(t.run("HINCRBYFLOAT mykey field -5"), bulk("5.6"));
    assert_eq!(t.run("HSET mykey field 5.0e3"), Reply::Int(0));
    assert_eq!(t.run("HINCRBYFLOAT mykey field 2.0e2"), bulk("5200"));
    assert_eq!(t.read("HGET mykey field"), bulk("5200"));
    // A new field starts at 0; a new key is created.
    assert_eq!(t.run("HINCRBYFLOAT fresh f 1.5"), bulk("1.5"));
    // Errors change nothing.
    t.run("HSET mykey word abc");
    let before = t.ks.clone();
    assert_eq!(
        t.run("HINCRBYFLOAT mykey word 1"),
        Reply::err("ERR hash value is not a float")
    );
    assert_eq!(
        t.run("HINCRBYFLOAT mykey field x"),
        Reply::err("ERR value is not a valid float")
    );
    assert_eq!(
        t.run("HINCRBYFLOAT mykey field inf"),
        Reply::err("ERR increment would produce NaN or Infinity")
    );
    assert_eq!(t.ks, before);
    // A hash made for a failed increment is not left behind.
    assert_eq!(
        t.run("HINCRBYFLOAT nokey f -inf"),
        Reply::err("ERR increment would produce NaN or Infinity")
    );
    assert_eq!(t.read("EXISTS nokey"), Reply::Int(0));
    t.run("SET s v");
    assert_eq!(t.run("HINCRBYFLOAT s f 1"), Reply::err(WRONGTYPE));
    assert_eq!(
        t.run("HINCRBYFLOAT mykey field"),
        Reply::err("ERR wrong number of arguments for 'hincrbyfloat' command")
    );
}

#[test]
fn hashes_lists_zsets() {
    let mut t = T::new();
    assert_eq!(t.run("HSET h a 1 b 2"), Reply::Int(2));
    assert_eq!(t.run("HINCRBY h a 5"), Reply::Int(6));
    assert_eq!(t.read("HGET h a"), bulk("6"));
    assert_eq!(t.read("HLEN h"), Reply::Int(2));
    assert_eq!(t.run("HDEL h a b"), Reply::Int(2));
    assert_eq!(t.read("EXISTS h"), Reply::Int(0), "empty hash is removed");
    assert_eq!(t.run("RPUSH l a b c d"), Reply::Int(4));
    assert_eq!(t.run("LPUSH l z"), Reply::Int(5));
    assert_eq!(
        t.read("LRANGE l 0 -1"),
        Reply::Array(["z", "a", "b", "c", "d"].iter().map(|s| bulk(s)).collect())
    );
    assert_eq!(t.run("LPOP l"), bulk("z"));
    assert_eq!(t.run("RPOP l 2"), Reply::Array(vec![bulk("d"), bulk("c")]));
    assert_eq!(t.run("LTRIM l 1 1"), Reply::ok());
    assert_eq!(t.read("LRANGE l 0 -1"), Reply::Array(vec![bulk("b")]));
    assert_eq!(t.run("ZADD z 1 a 2 b 3 c"), Reply::Int(3));
    assert_eq!(t.read("ZSCORE z b"), Reply::Double("2".into()));
    assert_eq!(t.read("ZCOUNT z (1 +inf"), Reply::Int(2));
    assert_eq!(
        t.read("ZRANGEBYSCORE z -inf 2"),
        Reply::Array(vec![bulk("a"), bulk("b")])
    );
    assert_eq!(t.run("ZREMRANGEBYSCORE z 0 1.5"), Reply::Int(1));
    assert_eq!(t.read("ZCARD z"), Reply::Int(2));
    assert_eq!(
        t.read("ZRANGE z 0 -1 REV"),
        Reply::Array(vec![bulk("c"), bulk("b")])
    );
    assert!(t.events.iter().any(|e| matches!(e, KvEvent::Pushed { .. })));
}

#[test]
fn fence_set_rejects_older_tokens() {
    let mut t = T::new();
    assert_eq!(t.run("FENCE.SET x a 10"), Reply::ok());
    assert_eq!(t.run("FENCE.SET x b 10"), Reply::ok());
    assert_eq!(
        t.run("FENCE.SET x c 9"),
        Reply::err("STALE token 9 is older than 10")
    );
    assert_eq!(t.read("GET x"), bulk("b"));
    t.run("DEL x");
    assert_eq!(
        t.run("FENCE.SET x c 9"),
        Reply::err("STALE token 9 is older than 10")
    );
    assert_eq!(t.run("FENCE.SET x d 11"), Reply::ok());
}

#[test]
fn multi_aborts_on_watched_change() {
    let mut t = T::new();
    t.run("SET w 1");
    let rev = t.ks.mod_revision(b"w", t.now);
    let m = KvCommand::Multi {
        watches: vec![(b"w".to_vec(), rev)],
        cmds: vec![argv("INCR w"), argv("GET w")],
    };
    let r =
        t.ks.apply(&mut 10, Semantics::NEWEST, t.now, &m, &mut vec![]);
    assert_eq!(
        r.replies,
        vec![Reply::Array(vec![Reply::Int(2), bulk("2")])]
    );
    let r =
        t.ks.apply(&mut 11, Semantics::NEWEST, t.now, &m, &mut vec![]);
    assert_eq!(r.replies, vec![Reply::NilArray]);
}

fn eval(t: &mut T, script: &str, keys: &[&str], args: &[&str]) -> Reply {
    let mut a: Argv = vec![
        b"EVAL".to_vec(),
        script.as_bytes().to_vec(),
        keys.len().to_string().into_bytes(),
    ];
    a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    a.extend(args.iter().map(|k| k.as_bytes().to_vec()));
    t.runv(a)
}

#[test]
fn lua_basics_and_conversions() {
    let mut t = T::new();
    assert_eq!(eval(&mut t, "return 1", &[], &[]), Reply::Int(1));
    assert_eq!(eval(&mut t, "return 3.9", &[], &[]), Reply::Int(3));
    assert_eq!(
        eval(&mut t, "return {1,2,{3,'x'},nil,5}", &[], &[]),
        Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(2),
            Reply::Array(vec![Reply::Int(3), bulk("x")])
        ])
    );
    assert_eq!(
        eval(
            &mut t,
            "return redis.call('SET', KEYS[1], ARGV[1])",
            &["k"],
            &["v"]
        ),
        Reply::ok()
    );
    assert_eq!(
        eval(&mut t, "return redis.call('GET', KEYS[1])", &["k"], &[]),
        bulk("v")
    );
    assert_eq!(
        eval(&mut t, "return redis.call('GET', 'nope')", &[], &[]),
        Reply::Nil
    );
    assert_eq!(
        eval(
            &mut t,
            "return redis.call('GET', 'nope') == false",
            &[],
            &[]
        ),
        Reply::Int(1)
    );
    assert_eq!(
        eval(&mut t, "return redis.error_reply('MY err')", &[], &[]),
        Reply::err("MY err")
    );
    assert_eq!(
        eval(&mut t, "return redis.status_reply('FINE')", &[], &[]),
        Reply::Status("FINE".into())
    );
    assert_eq!(
        eval(&mut t, "return redis.sha1hex('')", &[], &[]),
        bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")
    );
    assert_eq!(
        eval(&mut t, "return redis.call('INCRBY', 'n', 5)", &[], &[]),
        Reply::Int(5)
    );
    // redis.call raises; redis.pcall returns the error table.
    assert_eq!(
        eval(&mut t, "return redis.call('HGET', 'k', 'f')", &[], &[]),
        Reply::err(WRONGTYPE)
    );
    assert_eq!(
        eval(
            &mut t,
            "local r = redis.pcall('HGET', 'k', 'f'); return r.err",
            &[],
            &[]
        ),
        bulk(WRONGTYPE)
    );
    // Runtime errors, sandbox.
    let r = eval(&mut t, "return os.time()", &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("ERR ")),
        "{r:?}"
    );
    let r = eval(&mut t, "return loadstring('return 1')", &[], &[]);
    assert!(r.is_error(), "{r:?}");
    let r = eval(&mut t, "return (", &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("compiling")),
        "{r:?}"
    );
    // TIME is log time.
    assert_eq!(
        eval(&mut t, "return redis.call('TIME')[1]", &[], &[]),
        bulk("1000")
    );
}

#[test]
fn lua_error_keeps_earlier_writes_and_budgets_hold() {
    let mut t = T::new();
    let r = eval(&mut t, "redis.call('SET','a','1'); error('boom')", &[], &[]);
    assert!(matches!(&r, Reply::Error(e) if e.contains("boom")), "{r:?}");
    assert_eq!(t.read("GET a"), bulk("1"));
    let r = eval(&mut t, "while true do end", &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
        "{r:?}"
    );
    let r = eval(
        &mut t,
        "while true do pcall(function() while true do end end) end",
        &[],
        &[],
    );
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
        "{r:?}"
    );
    // Coroutines the script creates are budgeted too.
    for s in [
        "return coroutine.wrap(function() while true do end end)()",
        "local co = coroutine.create(function() while true do end end) return coroutine.resume(co)",
    ] {
        let r = eval(&mut t, s, &[], &[]);
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
            "{s}: {r:?}"
        );
    }
    let r = eval(
        &mut t,
        "local t = {} for i=1,1e9 do t[i] = string.rep('x', 1000) .. i end",
        &[],
        &[],
    );
    assert!(r.is_error(), "{r:?}");
}

#[test]
fn evalsha_and_script_cache() {
    let mut t = T::new();
    let src = "return ARGV[1]";
    let r = t.runv(vec![
        b"SCRIPT".to_vec(),
        b"LOAD".to_vec(),
        src.as_bytes().to_vec(),
    ]);
    let Reply::Bulk(sha) = r else { panic!("{r:?}") };
    let sha = String::from_utf8(sha).unwrap_or_default();
    assert_eq!(t.run(&format!("EVALSHA {sha} 0 hi")), bulk("hi"));
    assert_eq!(
        t.read(&format!("SCRIPT EXISTS {sha} ffff")),
        Reply::Array(vec![Reply::Int(1), Reply::Int(0)])
    );
    assert_eq!(
        t.run("EVALSHA ffff 0"),
        Reply::err("NOSCRIPT No matching script. Please use EVAL.")
    );
}

#[test]
fn lua_random_is_seeded_by_index() {
    let mut a = T::new();
    let mut b = T::new();
    let s = "return {math.random(1000000), math.random(1000000)}";
    assert_eq!(eval(&mut a, s, &[], &[]), eval(&mut b, s, &[], &[]));
}

/// The message of a script's error reply (panics on any other reply).
fn eval_err(t: &mut T, script: &str, args: &[&str]) -> String {
    match eval(t, script, &[], args) {
        Reply::Error(e) => e,
        other => panic!("expected an error from {script:?}, got {other:?}"),
    }
}

#[test]
fn cjson_round_trips_with_sorted_keys() {
    let mut t = T::new();
    let rt = "return cjson.encode(cjson.decode(ARGV[1]))";
    for (input, want) in [
        (
            r#"{"b":1,"a":[1,2,{"d":null,"c":true}],"e":"x"}"#,
            r#"{"a":[1,2,{"c":true,"d":null}],"b":1,"e":"x"}"#,
        ),
        (
            "[1,1.5,-0.25,1e20,0.1,123456789,-0,1e-7]",
            "[1,1.5,-0.25,1e+20,0.1,123456789,-0,1e-07]",
        ),
        // %.14g, as lua-cjson: 15-digit integers lose their last digit.
        ("[123456789012345]", "[1.2345678901234e+14]"),
        (
            r#""a\"b\\c\/d\n\t\u0001\u00e9 ü 日本 \ud83d\ude00""#,
            r#""a\"b\\c\/d\n\t\u0001é ü 日本 😀""#,
        ),
        // Empty tables encode as objects (lua-cjson).
        ("[]", "{}"),
        ("[[[]],{}]", "[[{}],{}]"),
        (
            r#" { "k" : [ 1 , 2 ] , "j" : false } "#,
            r#"{"j":false,"k":[1,2]}"#,
        ),
        (
            r#"{"a":3,"B":4,"9":2,"10":1}"#,
            r#"{"10":1,"9":2,"B":4,"a":3}"#,
        ),
    ] {
        assert_eq!(eval(&mut t, rt, &[], &[input]), bulk(want), "{input}");
    }
}

#[test]
fn cjson_encodes_lua_values_like_lua_cjson() {
    let mut t = T::new();
    let enc = |t: &mut T, expr: &str| eval(t, &format!("return cjson.encode({expr})"), &[], &[]);
    for (expr, want) in [
        ("{a=1,b={1,2,3}}", r#"{"a":1,"b":[1,2,3]}"#),
        (
            "{z=1,y=2,x=3,[10]=4,[2]=5}",
            r#"{"10":4,"2":5,"x":3,"y":2,"z":1}"#,
        ),
        ("{1,2,a=3}", r#"{"1":1,"2":2,"a":3}"#),
        ("{[1.5]=1}", r#"{"1.5":1}"#),
        // Holes: null-padded unless excessively sparse.
        ("{1,nil,3}", "[1,null,3]"),
        ("{}", "{}"),
        ("'x'", r#""x""#),
        ("nil", "null"),
        ("cjson.null", "null"),
        ("{cjson.null, true, false}", "[null,true,false]"),
        ("-3", "-3"),
        ("1/3", "0.33333333333333"),
        ("1e15", "1e+15"),
        (r"'\127/\0'", r#""\u007f\/\u0000""#),
    ] {
        assert_eq!(enc(&mut t, expr), bulk(want), "{expr}");
    }
    // Bytes >= 0x80 pass through unchanged, valid UTF-8 or not.
    assert_eq!(
        enc(&mut t, r"'\200\255'"),
        Reply::Bulk(b"\"\xc8\xff\"".to_vec())
    );
}

#[test]
fn cjson_decodes_to_lua_values() {
    let mut t = T::new();
    let null_check = "local t = cjson.decode(ARGV[1]) return {t.x == cjson.null, type(t.x)}";
    assert_eq!(
        eval(&mut t, null_check, &[], &[r#"{"x":null}"#]),
        Reply::Array(vec![Reply::Int(1), bulk("userdata")])
    );
    assert_eq!(
        eval(
            &mut t,
            "return cjson.decode(ARGV[1])",
            &[],
            &[r#"[1,"a",true,false]"#]
        ),
        Reply::Array(vec![Reply::Int(1), bulk("a"), Reply::Int(1), Reply::Nil])
    );
    // Numbers as lua-cjson reads them by default (strtod, invalid numbers allowed).
    assert_eq!(
        eval(
            &mut t,
            "local d = cjson.decode('[1.,01,+2,0x10,-1e2,1E+2,2.5]') return {d[1],d[2],d[3],d[4],d[5],d[6],d[7]*2}",
            &[],
            &[]
        ),
        Reply::Array([1, 1, 2, 16, -100, 100, 5].map(Reply::Int).to_vec())
    );
    assert_eq!(
        eval(
            &mut t,
            "local n = cjson.decode('NaN') return {cjson.decode('-Infinity') == -math.huge, n ~= n, cjson.decode(12)}",
            &[],
            &[]
        ),
        Reply::Array(vec![Reply::Int(1), Reply::Int(1), Reply::Int(12)])
    );
}

#[test]
fn cjson_invalid_json_is_a_script_error() {
    let mut t = T::new();
    let dec = "return cjson.decode(ARGV[1])";
    for (input, want) in [
        ("x", "Expected value but found invalid token at character 1"),
        ("", "Expected value but found T_END at character 1"),
        (
            r#"{"a":1,}"#,
            "Expected object key string but found T_OBJ_END at character 8",
        ),
        (
            "[1 2]",
            "Expected comma or array end but found T_NUMBER at character 4",
        ),
        (
            r#"{"a" 1}"#,
            "Expected colon but found T_NUMBER at character 6",
        ),
        (
            "[1] x",
            "Expected the end but found invalid token at character 5",
        ),
        (
            r#""abc"#,
            "Expected value but found unexpected end of string at character 5",
        ),
        (
            r#""\x""#,
            "Expected value but found invalid escape code at character 2",
        ),
        (
            r#""\ud800""#,
            "Expected value but found invalid unicode escape code at character 2",
        ),
        (
            "[-]",
            "Expected value but found invalid number at character 2",
        ),
        (
            "{\"a\":[1,{\"b\":tru}]}",
            "Expected value but found invalid token at character 14",
        ),
    ] {
        let e = eval_err(&mut t, dec, &[input]);
        assert!(
            e.starts_with(&format!("ERR {want} script: ")),
            "{input}: {e}"
        );
    }
    // A plain string error, so pcall sees lua-cjson's message.
    assert_eq!(
        eval(
            &mut t,
            "local ok, e = pcall(cjson.decode, '{') return {tostring(ok), e}",
            &[],
            &[]
        ),
        Reply::Array(vec![
            bulk("false"),
            bulk("Expected object key string but found T_END at character 2")
        ])
    );
    let deep_ok = "local s = string.rep('[', 1000) .. string.rep(']', 1000) return cjson.encode(cjson.decode(s))";
    assert_eq!(
        eval(&mut t, deep_ok, &[], &[]),
        bulk(&format!("{}{{}}{}", "[".repeat(999), "]".repeat(999)))
    );
    let e = eval_err(&mut t, "return cjson.decode(string.rep('[', 1001))", &[]);
    assert!(
        e.contains("Found too many nested data structures (1001) at character 1001"),
        "{e}"
    );
}

#[test]
fn cjson_encode_errors() {
    let mut t = T::new();
    for (script, want) in [
        (
            "return cjson.encode(0/0)",
            "Cannot serialise number: must not be NaN or Inf",
        ),
        (
            "return cjson.encode({math.huge})",
            "Cannot serialise number: must not be NaN or Inf",
        ),
        (
            "return cjson.encode({f=function() end})",
            "Cannot serialise function: type not supported",
        ),
        (
            "return cjson.encode({[true]=1})",
            "Cannot serialise boolean: table key must be a number or string",
        ),
        (
            "return cjson.encode({[1000]=1})",
            "Cannot serialise table: excessively sparse array",
        ),
        (
            "return cjson.encode()",
            "bad argument #1 to 'encode' (expected 1 argument)",
        ),
        (
            "local t = {} t[1] = t return cjson.encode(t)",
            "Cannot serialise, excessive nesting (1001)",
        ),
    ] {
        let e = eval_err(&mut t, script, &[]);
        assert!(
            e.starts_with(&format!("ERR {want} script: ")),
            "{script}: {e}"
        );
    }
}

#[test]
fn cjson_settings_last_for_one_run() {
    let mut t = T::new();
    let s = "cjson.encode_invalid_numbers('null') local a = cjson.encode({0/0}) \
             cjson.encode_sparse_array(true) local b = cjson.encode({[1000]=1}) \
             cjson.encode_number_precision(3) local c = cjson.encode({math.pi, [1000]=1}) \
             return {a, b, c, cjson.encode_max_depth(), tostring(cjson.encode_keep_buffer(false))}";
    assert_eq!(
        eval(&mut t, s, &[], &[]),
        Reply::Array(vec![
            bulk("[null]"),
            bulk(r#"{"1000":1}"#),
            // Precision applies to number keys too, as in lua-cjson.
            bulk(r#"{"1":3.14,"1e+03":1}"#),
            Reply::Int(1000),
            bulk("false")
        ])
    );
    assert_eq!(
        eval(&mut t, "return cjson.encode(math.pi)", &[], &[]),
        bulk("3.1415926535898"),
        "a new run starts from the defaults"
    );
    let e = eval_err(&mut t, "return cjson.encode_max_depth(2000)", &[]);
    assert!(
        e.contains("bad argument #1 to 'encode_max_depth' (expected integer between 1 and 1000)"),
        "{e}"
    );
    let e = eval_err(
        &mut t,
        "cjson.encode_max_depth(2) return cjson.encode({{{}}})",
        &[],
    );
    assert!(e.contains("Cannot serialise, excessive nesting (3)"), "{e}");
}

#[test]
fn cjson_is_deterministic() {
    let s = "local a, b = {}, {} \
             for i = 1, 200 do a['k' .. i] = i end \
             for i = 200, 1, -1 do b['k' .. i] = i end \
             for i = 1, 150 do a['k' .. i] = nil; b['k' .. i] = nil end \
             a[7.5] = true b[7.5] = true \
             return {cjson.encode(a), cjson.encode(b)}";
    let (mut x, mut y) = (T::new(), T::new());
    let rx = eval(&mut x, s, &[], &[]);
    let Reply::Array(items) = &rx else {
        panic!("{rx:?}")
    };
    assert_eq!(items[0], items[1], "insertion order does not matter");
    assert_eq!(rx, eval(&mut x, s, &[], &[]), "same bytes on a second run");
    assert_eq!(
        rx,
        eval(&mut y, s, &[], &[]),
        "same bytes on another replica"
    );
}

#[test]
fn cjson_state_in_a_key() {
    let mut t = T::new();
    let s = "local d = cjson.decode(redis.call('GET', KEYS[1]) or '{}') \
             d.count = (d.count or 0) + 1 \
             d.owner = ARGV[1] \
             redis.call('SET', KEYS[1], cjson.encode(d)) \
             return d.count";
    assert_eq!(eval(&mut t, s, &["lock"], &["alice"]), Reply::Int(1));
    assert_eq!(eval(&mut t, s, &["lock"], &["bob"]), Reply::Int(2));
    assert_eq!(t.read("GET lock"), bulk(r#"{"count":2,"owner":"bob"}"#));
}

#[test]
fn cjson_is_bounded_by_the_script_budgets() {
    let mut t = T::new();
    // Under the bounded rules the step budget stops a 12 MB encode before the memory limit.
    let r = eval(
        &mut t,
        "local s = string.rep('\\1', 12e6) return #cjson.encode({s})",
        &[],
        &[],
    );
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
        "{r:?}"
    );
    // Under the older, larger instruction budget the memory limits do.
    t.semantics = Semantics::ELECTIONS;
    // Output past the memory limit fails (catchably) instead of growing a Rust buffer.
    let e = eval_err(
        &mut t,
        "local s = string.rep('\\1', 12e6) return #cjson.encode({s})",
        &[],
    );
    assert!(e.contains("output exceeds the script memory limit"), "{e}");
    // So do copies of object keys held while nested tables are written.
    let s = "local big = string.rep('b', 1e7) local root = {} local cur = root \
             for i = 1, 20 do local nxt = {} cur.a = nxt cur[big] = 1 cur = nxt end \
             return cjson.encode(root)";
    let e = eval_err(&mut t, s, &[]);
    assert!(e.contains("keys exceed the script memory limit"), "{e}");
    // Work inside cjson counts against the instruction budget, and pcall cannot swallow it.
    let r = eval(
        &mut t,
        "local s = string.rep('\\1', 1e6) while true do pcall(cjson.encode, s) end",
        &[],
        &[],
    );
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("BUSY")),
        "{r:?}"
    );
}

// ---- ACL restrictions (KvCommand::Restricted) ------------------------------------------

fn only_keys(user: &str, patterns: &[&str]) -> Restriction {
    Restriction {
        user: user.into(),
        keys: Some(patterns.iter().map(|p| p.as_bytes().to_vec()).collect()),
        channels: None,
        commands: None,
    }
}

fn restricted(limits: &Restriction, cmds: Vec<Argv>) -> KvCommand {
    KvCommand::Restricted {
        limits: limits.clone(),
        cmd: Box::new(KvCommand::Batch(cmds)),
    }
}

fn eval_argv(script: &str, keys: &[&str], args: &[&str]) -> Argv {
    let mut a: Argv = vec![
        b"EVAL".to_vec(),
        script.as_bytes().to_vec(),
        keys.len().to_string().into_bytes(),
    ];
    a.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
    a.extend(args.iter().map(|k| k.as_bytes().to_vec()));
    a
}

impl T {
    fn apply(&mut self, cmd: &KvCommand) -> Vec<Reply> {
        self.revision += 1;
        self.ks.expire_due(self.now);
        self.ks
            .apply(
                &mut self.revision,
                Semantics::NEWEST,
                self.now,
                cmd,
                &mut self.events,
            )
            .replies
    }
}

#[test]
fn command_keys_follow_the_key_specs() {
    let keys = |s: &str| -> Vec<String> {
        match command_keys(&argv(s)) {
            Keys::Args(k) => k
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
            other => panic!("{s}: {other:?}"),
        }
    };
    assert_eq!(keys("GET a"), ["a"]);
    assert_eq!(keys("set a v NX PX 10"), ["a"]);
    assert_eq!(keys("HSET h f v"), ["h"]);
    assert_eq!(keys("DEL a b c"), ["a", "b", "c"]);
    assert_eq!(keys("MGET a b"), ["a", "b"]);
    assert_eq!(keys("EXISTS a b"), ["a", "b"]);
    assert_eq!(keys("WATCH a b"), ["a", "b"]);
    assert_eq!(keys("MSET a 1 b 2"), ["a", "b"]);
    assert_eq!(keys("BLPOP a b 0"), ["a", "b"]);
    assert_eq!(keys("EVAL s 2 a b c"), ["a", "b"]);
    assert_eq!(keys("EVALSHA s 0 c"), Vec::<String>::new());
    assert_eq!(keys("EVAL s x a"), Vec::<String>::new(), "bad numkeys");
    assert_eq!(
        keys("EVAL s 3 a"),
        Vec::<String>::new(),
        "numkeys too large"
    );
    assert_eq!(keys("EVAL s -1 a"), Vec::<String>::new());
    assert_eq!(keys("LOCK.ACQUIRE job alice 100"), ["job"]);
    assert_eq!(keys("LOCK.PERMIT pool alice 3 100 WAIT 5"), ["pool"]);
    assert_eq!(keys("LOCK.MACQUIRE alice 100 2 a b WAIT 5"), ["a", "b"]);
    assert_eq!(keys("LOCK.MRELEASE alice 7 3 a b c"), ["a", "b", "c"]);
    assert_eq!(
        keys("LOCK.MACQUIRE alice 100 3 a b"),
        Vec::<String>::new(),
        "numnames too large"
    );
    assert_eq!(keys("LOCK.FORCEUNLOCK job"), ["job"]);
    assert_eq!(keys("FENCE.SET k v 3"), ["k"]);
    assert_eq!(keys("FENCE.TOKEN k"), ["k"]);
    for whole in ["KEYS *", "SCAN 0", "DBSIZE", "FLUSHDB", "FLUSHALL"] {
        assert_eq!(command_keys(&argv(whole)), Keys::Whole, "{whole}");
    }
    for none in [
        "TIME",
        "PUBLISH ch m",
        "SCRIPT FLUSH",
        "PING",
        "SUBSCRIBE a",
        "ACL WHOAMI",
        "NOSUCH a",
    ] {
        assert_eq!(command_keys(&argv(none)), Keys::None, "{none}");
    }
    // Every keyspace and lock command has a spec other than None, except these.
    for c in command_table() {
        let (name, spec) = (&c.name, key_spec(c.name));
        let keyless =
            matches!(*name, "TIME" | "SCRIPT" | "PUBLISH") || name.starts_with("SESSION.");
        match c.base_class() {
            CommandClass::Connection => {
                assert!(
                    spec == KeySpec::None || *name == "WATCH",
                    "{name}: {spec:?}"
                )
            }
            _ if keyless => assert_eq!(spec, KeySpec::None, "{name}"),
            _ => assert_ne!(spec, KeySpec::None, "{name}"),
        }
    }
}

#[test]
fn restriction_checks_commands_keys_and_channels() {
    let r = Restriction {
        user: "u".into(),
        keys: Some(vec![b"lock:*".to_vec()]),
        channels: Some(vec![b"news.*".to_vec(), b"ch?".to_vec()]),
        commands: Some(vec![
            "GET".into(),
            "set".into(),
            "PUBLISH".into(),
            "PSUBSCRIBE".into(),
        ]),
    };
    assert_eq!(r.check(&argv("get lock:a")), Ok(()));
    assert_eq!(r.check(&argv("SET lock:a v")), Ok(()));
    assert_eq!(r.check(&argv("GET other")), Err(NOPERM_KEY.into()));
    assert_eq!(
        r.check(&argv("INCR lock:a")),
        Err("NOPERM User u has no permissions to run the 'incr' command".into())
    );
    assert_eq!(r.check(&argv("PUBLISH news.x m")), Ok(()));
    assert_eq!(r.check(&argv("PUBLISH chx m")), Ok(()));
    assert_eq!(
        r.check(&argv("PUBLISH sports m")),
        Err(NOPERM_CHANNEL.into())
    );
    // PSUBSCRIBE patterns are compared literally.
    assert_eq!(r.check(&argv("PSUBSCRIBE news.*")), Ok(()));
    assert_eq!(
        r.check(&argv("PSUBSCRIBE news.a*")),
        Err(NOPERM_CHANNEL.into())
    );
    let all_cmds = Restriction {
        commands: None,
        ..r.clone()
    };
    assert_eq!(all_cmds.check(&argv("SUBSCRIBE news.a ch1")), Ok(()));
    assert_eq!(
        all_cmds.check(&argv("SUBSCRIBE news.a other")),
        Err(NOPERM_CHANNEL.into())
    );
    assert_eq!(all_cmds.check(&argv("KEYS lock:*")), Err(NOPERM_KEY.into()));
    assert_eq!(
        all_cmds.check(&argv("MSET lock:a 1 x 2")),
        Err(NOPERM_KEY.into())
    );
    assert_eq!(all_cmds.check(&argv("MSET lock:a 1 lock:b x")), Ok(()));
    assert_eq!(
        all_cmds.check(&argv("DEL lock:a x")),
        Err(NOPERM_KEY.into())
    );
    assert_eq!(all_cmds.check(&argv("PING")), Ok(()));
}

#[test]
fn restricted_direct_commands_are_refused_in_apply() {
    let mut t = T::new();
    t.run("SET other keep");
    let lim = only_keys("locker", &["lock:*"]);
    let r = t.apply(&restricted(
        &lim,
        vec![
            argv("SET lock:a 1"),
            argv("SET other x"),
            argv("GET other"),
            argv("DEL lock:a other"),
            argv("FLUSHALL"),
            argv("INCR lock:n"),
        ],
    ));
    let noperm = Reply::err(NOPERM_KEY);
    assert_eq!(
        r,
        vec![
            Reply::ok(),
            noperm.clone(),
            noperm.clone(),
            noperm.clone(),
            noperm,
            Reply::Int(1)
        ]
    );
    assert_eq!(
        t.read("GET other"),
        bulk("keep"),
        "FLUSHALL/SET/DEL refused"
    );
    assert_eq!(t.read("GET lock:a"), bulk("1"));
    // MULTI under a restriction: the refused command fails, the others run.
    let m = KvCommand::Restricted {
        limits: lim.clone(),
        cmd: Box::new(KvCommand::Multi {
            watches: vec![],
            cmds: vec![argv("INCR lock:n"), argv("DEL other"), argv("INCR lock:n")],
        }),
    };
    assert_eq!(
        t.apply(&m),
        vec![Reply::Array(vec![
            Reply::Int(2),
            Reply::err(NOPERM_KEY),
            Reply::Int(3)
        ])]
    );
    // Unrestricted commands afterwards are not limited (the restriction is per entry).
    assert_eq!(t.run("SET other y"), Reply::ok());
}

#[test]
fn restricted_script_is_refused_at_the_forbidden_call() {
    let lim = only_keys("locker", &["lock:*"]);
    let script = "redis.call('SET', KEYS[1], 'before'); \
                  redis.call('SET', 'other', 'x'); \
                  redis.call('SET', KEYS[1], 'after'); return 1";
    let entry = restricted(&lim, vec![eval_argv(script, &["lock:a"], &[])]);
    let mut t = T::new();
    let r = t.apply(&entry);
    assert_eq!(
        r,
        vec![Reply::err(NOPERM_KEY)],
        "redis.call raises the error"
    );
    assert_eq!(t.read("GET lock:a"), bulk("before"), "earlier writes stay");
    assert_eq!(
        t.read("EXISTS other"),
        Reply::Int(0),
        "forbidden write refused"
    );
    // Deterministic: the same entry on another replica gives the same keyspace.
    let mut u = T::new();
    assert_eq!(u.apply(&entry), r);
    assert_eq!(t.ks, u.ks);
    // Without the restriction the same script writes `other`.
    let mut free = T::new();
    assert_eq!(
        free.runv(eval_argv(script, &["lock:a"], &[])),
        Reply::Int(1)
    );
    assert_eq!(free.read("GET other"), bulk("x"));

    // redis.pcall returns the refusal as an error table; the script goes on.
    let pcall = "local r = redis.pcall('GET', 'other'); \
                 redis.call('SET', KEYS[1], 'after-pcall'); return r['err']";
    let r = t.apply(&restricted(&lim, vec![eval_argv(pcall, &["lock:a"], &[])]));
    assert_eq!(r, vec![bulk(NOPERM_KEY)]);
    assert_eq!(t.read("GET lock:a"), bulk("after-pcall"));
    // Declaring a forbidden key is refused before the script runs.
    let r = t.apply(&restricted(
        &lim,
        vec![eval_argv("redis.call('SET','lock:b','1')", &["other"], &[])],
    ));
    assert_eq!(r, vec![Reply::err(NOPERM_KEY)]);
    assert_eq!(t.read("EXISTS lock:b"), Reply::Int(0));
    // Whole-keyspace commands inside a script are refused too.
    let r = t.apply(&restricted(
        &lim,
        vec![eval_argv("return redis.call('KEYS', '*')", &[], &[])],
    ));
    assert_eq!(r, vec![Reply::err(NOPERM_KEY)]);
}

#[test]
fn restricted_scripts_keep_command_and_channel_limits() {
    let lim = Restriction {
        user: "locker".into(),
        keys: None,
        channels: Some(vec![b"ok.*".to_vec()]),
        commands: Some(vec!["EVAL".into(), "SET".into(), "PUBLISH".into()]),
    };
    let mut t = T::new();
    let r = t.apply(&restricted(
        &lim,
        vec![eval_argv(
            "redis.call('SET', 'a', '1'); return redis.call('INCR', 'n')",
            &["a"],
            &[],
        )],
    ));
    assert_eq!(
        r,
        vec![Reply::err(
            "NOPERM User locker has no permissions to run the 'incr' command"
        )]
    );
    assert_eq!(t.read("GET a"), bulk("1"));
    assert_eq!(t.read("EXISTS n"), Reply::Int(0));
    t.events.clear();
    let r = t.apply(&restricted(
        &lim,
        vec![eval_argv(
            "redis.call('PUBLISH', 'ok.1', 'm'); return redis.call('PUBLISH', 'secret', 'm')",
            &[],
            &[],
        )],
    ));
    assert_eq!(r, vec![Reply::err(NOPERM_CHANNEL)]);
    let published: Vec<_> = t
        .events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Published { channel, .. } => Some(channel.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(published, vec![b"ok.1".to_vec()]);
}

#[test]
fn nested_restrictions_all_apply() {
    let mut t = T::new();
    let entry = KvCommand::Restricted {
        limits: only_keys("a", &["x*"]),
        cmd: Box::new(restricted(
            &only_keys("b", &["*1"]),
            vec![argv("SET x1 v"), argv("SET x2 v"), argv("SET y1 v")],
        )),
    };
    let noperm = Reply::err(NOPERM_KEY);
    assert_eq!(t.apply(&entry), vec![Reply::ok(), noperm.clone(), noperm]);
}

#[test]
fn restricted_is_appended_so_old_entries_decode() {
    // Variant indexes of the entries already in logs are unchanged.
    let batch = bincode::serialize(&KvCommand::Batch(vec![argv("SET a 1")])).expect("encode");
    assert_eq!(&batch[..4], &0u32.to_le_bytes());
    let multi = bincode::serialize(&KvCommand::Multi {
        watches: vec![],
        cmds: vec![],
    })
    .expect("encode");
    assert_eq!(&multi[..4], &1u32.to_le_bytes());
    let entry = restricted(&only_keys("u", &["k*"]), vec![argv("SET k 1")]);
    let bytes = bincode::serialize(&entry).expect("encode");
    assert_eq!(&bytes[..4], &2u32.to_le_bytes());
    let back: KvCommand = bincode::deserialize(&bytes).expect("decode");
    assert_eq!(back, entry);
}

// ---- reused Lua interpreters (lua::LuaCache) -------------------------------------------

/// Fills the memory limit with 64 KiB strings, then with small tables (a finer measure of
/// where the limit fell), and reports both counts as one number (a table would not fit).
const OOM: &str = "local t, i, l, j = {}, 0, nil, 0 \
    pcall(function() while true do i = i + 1 t[i] = string.rep(ARGV[1], 65536) .. i end end) \
    pcall(function() while true do j = j + 1 l = {l} end end) \
    return i * 1000000 + j";

/// The last [`HEAVY`] of [`REUSE_SCRIPTS`] run to a budget (seconds each in a debug build).
const HEAVY: usize = 3;

/// Scripts for the reuse tests; each takes `KEYS[1]` and `ARGV[1]` (a small number).
const REUSE_SCRIPTS: &[&str] = &[
    // Pure computation.
    "local s = 0 for i = 1, tonumber(ARGV[1]) * 100 do s = s + i % 7 end return s",
    // Keyspace writes and reads.
    "redis.call('SET', KEYS[1], ARGV[1]) return {redis.call('INCR', 'ctr'), redis.call('GET', KEYS[1])}",
    "return redis.call('DEL', KEYS[1], 'ctr')",
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    // Globals, and every shared object a script can reach, changed.
    "local seen = {tostring(g), tostring(rawget(_G, 'h')), type(string.upper), type(('x').rep), \
       type(getmetatable('').__index.len), type(redis.call), type(cjson.encode), type(math.random), \
       type(getfenv(0).KEYS), type(pcall), tostring(coroutine.running())} \
     g = ARGV[1] h = {} string.upper = nil getmetatable('').__index = {} getmetatable('').__add = 1 \
     redis.call = nil cjson.encode = nil math.random = nil pcall = nil \
     setfenv(1, {}) return seen",
    "local e = getfenv(3) e.leak = ARGV[1] setfenv(0, {}) return tostring(e.KEYS ~= nil)",
    // Random numbers, reseeded by the script or not.
    "return {math.random(1000000), math.random(10, 20)}",
    "math.randomseed(tonumber(ARGV[1])) return {math.random(1000000), tostring(math.random())}",
    // cjson, with settings that last one run.
    "cjson.encode_number_precision(3) return cjson.encode({a = ARGV[1], n = math.pi, l = {1, 2, ARGV[1]}})",
    "local d = cjson.decode('{\"x\":[1,2,{\"y\":\"' .. ARGV[1] .. '\"}]}') return {d.x[3].y, cjson.encode(math.pi)}",
    // Objects shown and iterated: numbered and refused under the deterministic rules; under
    // the old ones (which show addresses) only what does not depend on them.
    "local det = tostring({}) == 'table: 1' local t = {a = ARGV[1]} t[{}] = 1 \
       if not det then return {string.sub(tostring(t), 1, 8), #t} end \
       local ok, e = pcall(next, t) \
       return {tostring({}), tostring(t), tostring(print or type), tostring(ok), e}",
    // Errors after a write, caught and not.
    "redis.call('SET', 'e', ARGV[1]) error('boom ' .. ARGV[1])",
    "return {pcall(error, 'caught ' .. ARGV[1])}",
    "return redis.call('HGET', 'ctr', 'x')",
    // Allocation that stays under the limit: many strings, a long concatenation, big tables.
    "local t = {} for i = 1, 2000 * tonumber(ARGV[1]) do t[i] = ARGV[1] .. ':' .. i end return #t",
    "local s = '' for i = 1, 300 do s = s .. ARGV[1] .. i end return #s",
    "local t = {} for i = 1, 50000 do t[i] = {i} end return #t",
    // Budgets: instructions (after a write, through pcall and coroutines) and memory.
    "redis.call('INCR', 'b') while true do end",
    "redis.call('INCR', 'b') return coroutine.wrap(function() while true do pcall(type, 1) end end)()",
    OOM,
];

fn eval_argv_of(script: &str, key: &str, arg: &str) -> Argv {
    vec![
        b"EVAL".to_vec(),
        script.as_bytes().to_vec(),
        b"1".to_vec(),
        key.as_bytes().to_vec(),
        arg.as_bytes().to_vec(),
    ]
}

/// Run `calls` (script, key, argument) on one long-lived keyspace and, in step, on a copy
/// that is cloned before every call (an empty interpreter cache, as after a restart or a
/// snapshot install); every reply and the final state must agree. Every third call is
/// applied by the rules of entries from before the deterministic ones (an interpreter serves
/// both during an upgrade).
fn replay_long_lived_and_fresh(calls: &[(usize, usize, u32)]) {
    let mut long = T::new();
    let mut fresh = T::new();
    for (n, &(s, k, a)) in calls.iter().enumerate() {
        let script = REUSE_SCRIPTS[s % REUSE_SCRIPTS.len()];
        let semantics = if n % 3 == 1 {
            Semantics::REVISIONS
        } else {
            Semantics::NEWEST
        };
        (long.semantics, fresh.semantics) = (semantics, semantics);
        let argv = eval_argv_of(script, &format!("k{}", k % 3), &(a % 9 + 1).to_string());
        let r_long = long.runv(argv.clone());
        fresh.ks = fresh.ks.clone();
        assert_eq!(fresh.ks.lua.usage(), (0, 0), "a clone has no interpreters");
        let r_fresh = fresh.runv(argv);
        assert_eq!(r_long, r_fresh, "call {n}: script {s} ({script})");
    }
    assert_eq!(long.ks, fresh.ks);
    assert_eq!(long.events, fresh.events);
}

#[test]
fn reused_interpreters_match_fresh_ones_on_every_script() {
    // Every script after every light one, and each twice in a row.
    let n = REUSE_SCRIPTS.len();
    let mut calls = Vec::new();
    for round in 0..2u32 {
        for a in 0..n {
            calls.push((a, a % 3, round));
            calls.push((a, a % 3, round + 1));
        }
    }
    for a in 0..n - HEAVY {
        for b in 0..n - HEAVY {
            calls.push((a, 0, b as u32));
            calls.push((b, 1, a as u32));
        }
    }
    replay_long_lived_and_fresh(&calls);
}

/// Mostly light scripts, now and then one that runs to a budget.
fn script_index() -> impl proptest::strategy::Strategy<Value = usize> {
    use proptest::prelude::*;
    let n = REUSE_SCRIPTS.len();
    prop_oneof![12 => 0..n - HEAVY, 1 => n - HEAVY..n]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    #[test]
    fn reused_interpreters_match_fresh_ones(
        calls in proptest::collection::vec((script_index(), 0..3usize, 0..9u32), 1..20)
    ) {
        replay_long_lived_and_fresh(&calls);
    }
}

#[test]
fn a_global_set_in_one_run_is_gone_in_the_next() {
    let mut t = T::new();
    let s = "local before = tostring(counter) counter = (counter or 0) + 1 \
             string.shout = string.upper return before";
    for _ in 0..3 {
        assert_eq!(eval(&mut t, s, &[], &[]), bulk("nil"));
    }
    assert!(
        t.ks.lua.contains(&sha1hex(s.as_bytes())),
        "the interpreter is reused"
    );
    // The libraries a script changed are whole again for the next run.
    let s = "if ARGV[1] == 'break' then string.rep = nil getmetatable('').__index = nil \
             redis.call = nil setfenv(1, {}) return 0 end \
             return {('ab'):rep(2), string.rep('c', 2), redis.call('SET', 'x', '1'), type(shout)}";
    assert_eq!(eval(&mut t, s, &[], &["break"]), Reply::Int(0));
    assert_eq!(
        eval(&mut t, s, &[], &["use"]),
        Reply::Array(vec![bulk("abab"), bulk("cc"), Reply::ok(), bulk("nil")])
    );
    // The interpreter's memory counters are not reachable.
    let r = eval(&mut t, "return collectgarbage('count')", &[], &[]);
    assert!(r.is_error(), "{r:?}");
}

#[test]
fn memory_limit_fails_at_the_same_point_after_many_runs() {
    // Under the older rules' budget of 50 M instructions, which the memory limit stops
    // first; under the bounded rules the allocations count towards the 3 M-step budget,
    // which stops these loops first (at the same point every time: bounded_tests.rs).
    let old = || T {
        semantics: Semantics::ELECTIONS,
        ..T::new()
    };
    let first = eval(&mut old(), OOM, &[], &["x"]);
    assert!(
        matches!(first, Reply::Int(n) if n > 1_000_000 && n % 1_000_000 > 0),
        "both loops ran out of memory: {first:?}"
    );
    let mut t = old();
    for round in 0..2 {
        // Other scripts in between: strings interned, tables and buffers grown, errors,
        // budgets; and this one.
        for (i, s) in REUSE_SCRIPTS.iter().enumerate() {
            t.runv(eval_argv_of(s, "k", &(i + round).to_string()));
        }
        assert_eq!(eval(&mut t, OOM, &[], &["x"]), first, "round {round}");
    }
}

#[test]
fn the_interpreter_cache_is_bounded() {
    let mut t = T::new();
    for i in 0..LUA_CACHE_SCRIPTS + 20 {
        assert_eq!(
            eval(&mut t, &format!("return {i}"), &[], &[]),
            Reply::Int(i as i64)
        );
        let (count, bytes) = t.ks.lua.usage();
        assert!(
            count <= LUA_CACHE_SCRIPTS && bytes <= LUA_CACHE_BYTES,
            "{count} {bytes}"
        );
    }
    assert_eq!(t.ks.lua.usage().0, LUA_CACHE_SCRIPTS);
    // Least recently run first out: the first scripts are gone, the last ones still there.
    assert!(!t.ks.lua.contains(&sha1hex(b"return 0")));
    let last = format!("return {}", LUA_CACHE_SCRIPTS + 19);
    assert!(t.ks.lua.contains(&sha1hex(last.as_bytes())));
    // Not part of the replicated state.
    let mut other = T::new();
    for i in 0..LUA_CACHE_SCRIPTS + 20 {
        eval(&mut other, &format!("return {i}"), &[], &[]);
    }
    other.ks = other.ks.clone();
    assert_eq!(other.ks.lua.usage(), (0, 0));
    assert_eq!(t.ks, other.ks);
    t.run("SCRIPT FLUSH");
    assert_eq!(t.ks.lua.usage(), (0, 0));
}

#[test]
fn the_state_machine_keeps_its_traits_with_the_interpreter_cache() {
    fn traits<
        T: Send
            + Sync
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + PartialEq
            + std::fmt::Debug
            + Default,
    >() {
    }
    traits::<Keyspace>();
    traits::<crate::StateMachine>();
    // Serialized without it, and equal to a copy that has none.
    let mut t = T::new();
    eval(&mut t, "return 1", &[], &[]);
    assert_eq!(t.ks.lua.usage().0, 1);
    let bytes = bincode::serialize(&t.ks).unwrap_or_default();
    let back: Keyspace = bincode::deserialize(&bytes).unwrap_or_default();
    assert_eq!(back, t.ks);
}

// ---- rate limiters ---------------------------------------------------------------------

fn ints(v: &[i64]) -> Reply {
    Reply::Array(v.iter().map(|i| Reply::Int(*i)).collect())
}

/// redis-cell's own test table (`src/cell/mod.rs`, `it_rate_limits`: burst 4, 1 per second),
/// through `CL.THROTTLE`, with its durations in whole seconds as the command reports them.
#[test]
fn cl_throttle_matches_redis_cell_table() {
    let mut t = T::new();
    let start = t.now;
    // (ms after start, quantity, [limited, limit, remaining, retry_after, reset_after])
    let cases: &[(u64, u64, [i64; 5])] = &[
        (0, 6, [1, 5, 5, -1, 0]),
        (0, 1, [0, 5, 4, -1, 1]),
        (0, 1, [0, 5, 3, -1, 2]),
        (0, 1, [0, 5, 2, -1, 3]),
        (0, 1, [0, 5, 1, -1, 4]),
        (0, 1, [0, 5, 0, -1, 5]),
        (0, 1, [1, 5, 0, 1, 5]),
        (3000, 1, [0, 5, 2, -1, 3]),
        (3100, 1, [0, 5, 1, -1, 4]),
        (4000, 1, [0, 5, 1, -1, 4]),
        (8000, 1, [0, 5, 4, -1, 1]),
        (9500, 1, [0, 5, 4, -1, 1]),
        (9500, 0, [0, 5, 4, -1, 1]),
        (9500, 2, [0, 5, 2, -1, 3]),
        (9500, 5, [1, 5, 2, 3, 3]),
    ];
    for (i, (at, q, want)) in cases.iter().enumerate() {
        t.now = start + at;
        assert_eq!(
            t.run(&format!("CL.THROTTLE foo 4 1 1 {q}")),
            ints(want),
            "case {i}"
        );
    }
    // The README's example.
    assert_eq!(
        t.run("CL.THROTTLE user123 15 30 60 1"),
        ints(&[0, 16, 15, -1, 2])
    );
    assert_eq!(
        t.run("CL.THROTTLE user123 15 30 60"),
        ints(&[0, 16, 14, -1, 4])
    );
    // Quantity 0 is a read (peek) and changes nothing.
    let rev = t.ks.mod_revision(b"user123", t.now);
    assert_eq!(
        t.read("CL.THROTTLE user123 15 30 60 0"),
        ints(&[0, 16, 14, -1, 4])
    );
    assert_eq!(
        t.run("CL.THROTTLE user123 15 30 60 0"),
        ints(&[0, 16, 14, -1, 4])
    );
    assert_eq!(t.ks.mod_revision(b"user123", t.now), rev);
    // The key is a ratelimit value that expires when the state is fresh again (tat).
    assert_eq!(t.read("TYPE user123"), Reply::Status("ratelimit".into()));
    assert_eq!(t.read("PTTL user123"), Reply::Int(4000));
    assert_eq!(t.read("EXISTS user123"), Reply::Int(1));
    t.now += 4000;
    assert_eq!(t.read("EXISTS user123"), Reply::Int(0));
    assert_eq!(
        t.run("CL.THROTTLE user123 15 30 60"),
        ints(&[0, 16, 15, -1, 2])
    );
    assert_eq!(t.run("DEL user123"), Reply::Int(1));
    assert_eq!(
        t.run("CL.THROTTLE user123 15 30 60"),
        ints(&[0, 16, 15, -1, 2])
    );
}

#[test]
fn token_bucket_steps_peek_and_reset() {
    let mut t = T::new();
    for left in (0..5).rev() {
        assert_eq!(
            t.run("LIMIT.TOKENBUCKET tb 5 1 1000"),
            ints(&[1, left, -1, (5 - left) * 1000, -1])
        );
    }
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET tb 5 1 1000"),
        ints(&[0, 0, 1000, 5000, -1])
    );
    assert_eq!(t.read("PTTL tb"), Reply::Int(5000));
    t.now += 1500;
    // One step back (at +1000); the next at +2000.
    assert_eq!(
        t.read("LIMIT.TOKENBUCKET tb 5 1 1000 PEEK"),
        ints(&[1, 0, -1, 4500, -1])
    );
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET tb 5 1 1000 2 PEEK"),
        ints(&[0, 1, 500, 3500, -1])
    );
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET tb 5 1 1000"),
        ints(&[1, 0, -1, 4500, -1])
    );
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET tb 5 1 1000"),
        ints(&[0, 0, 500, 4500, -1])
    );
    assert_eq!(t.run("LIMIT.RESET tb"), Reply::Int(1));
    assert_eq!(t.run("LIMIT.RESET tb"), Reply::Int(0));
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET tb 5 1 1000 5"),
        ints(&[1, 0, -1, 5000, -1])
    );
}

#[test]
fn leaky_bucket_drains_continuously() {
    let mut t = T::new();
    // Capacity 3, draining 1 per 300 ms.
    assert_eq!(
        t.run("LIMIT.LEAKYBUCKET lb 3 1 300 3"),
        ints(&[1, 0, -1, 900, -1])
    );
    assert_eq!(
        t.run("LIMIT.LEAKYBUCKET lb 3 1 300"),
        ints(&[0, 0, 300, 900, -1])
    );
    t.now += 100;
    // Level 2⅔: one unit fits in 200 ms; remaining rounds down.
    assert_eq!(
        t.run("LIMIT.LEAKYBUCKET lb 3 1 300"),
        ints(&[0, 0, 200, 800, -1])
    );
    t.now += 200;
    assert_eq!(
        t.run("LIMIT.LEAKYBUCKET lb 3 1 300"),
        ints(&[1, 0, -1, 900, -1])
    );
    assert_eq!(t.read("PTTL lb"), Reply::Int(900));
}

#[test]
fn fixed_and_sliding_windows() {
    let mut t = T::new();
    t.now = 1_000_000; // a window boundary for 1000 ms windows
    assert_eq!(
        t.run("LIMIT.FIXEDWINDOW fw 2 1000"),
        ints(&[1, 1, -1, 1000, -1])
    );
    t.now += 400;
    assert_eq!(
        t.run("LIMIT.FIXEDWINDOW fw 2 1000"),
        ints(&[1, 0, -1, 600, -1])
    );
    assert_eq!(
        t.run("LIMIT.FIXEDWINDOW fw 2 1000"),
        ints(&[0, 0, 600, 600, -1])
    );
    assert_eq!(t.read("PTTL fw"), Reply::Int(600));
    t.now += 600;
    assert_eq!(
        t.run("LIMIT.FIXEDWINDOW fw 2 1000 2"),
        ints(&[1, 0, -1, 1000, -1])
    );
    assert_eq!(
        t.run("LIMIT.FIXEDWINDOW fw 2 500"),
        Reply::err("ERR the key's window is 1000 ms, not 500 ms (LIMIT.RESET it first)")
    );

    // Sliding: 4 per 1000 ms; 4 in the first window, then 25 % into the next the previous
    // window still weighs 3.
    t.now = 2_000_000;
    assert_eq!(
        t.run("LIMIT.SLIDINGWINDOW sw 4 1000 4"),
        ints(&[1, 0, -1, 2000, -1])
    );
    t.now += 1250;
    assert_eq!(
        t.run("LIMIT.SLIDINGWINDOW sw 4 1000"),
        ints(&[1, 0, -1, 1750, -1])
    );
    // prev 4 · 750/1000 + 1 = 4: full. One more fits once prev · (1000 − e) ≤ 2000 → e ≥ 500.
    assert_eq!(
        t.run("LIMIT.SLIDINGWINDOW sw 4 1000"),
        ints(&[0, 0, 250, 1750, -1])
    );
    t.now += 250;
    assert_eq!(
        t.run("LIMIT.SLIDINGWINDOW sw 4 1000"),
        ints(&[1, 0, -1, 1500, -1])
    );
    assert_eq!(t.read("PTTL sw"), Reply::Int(1500));
}

#[test]
fn sliding_log_reports_the_violated_policy() {
    let mut t = T::new();
    // At most 2 per second and 3 per 10 seconds.
    let cmd = "LIMIT.LOG lg 1000 2 10000 3";
    assert_eq!(t.run(cmd), ints(&[1, 1, -1, 10000, -1]));
    assert_eq!(t.run(cmd), ints(&[1, 0, -1, 10000, -1]));
    assert_eq!(t.run(cmd), ints(&[0, 0, 1000, 10000, 0]));
    t.now += 1000;
    assert_eq!(t.run(cmd), ints(&[1, 0, -1, 10000, -1]));
    assert_eq!(t.run(cmd), ints(&[0, 0, 9000, 10000, 1]));
    assert_eq!(t.run(&format!("{cmd} PEEK")), ints(&[0, 0, 9000, 10000, 1]));
    t.now += 9000;
    assert_eq!(t.run(&format!("{cmd} 2")), ints(&[1, 0, -1, 10000, -1]));
    assert_eq!(t.read("PTTL lg"), Reply::Int(10000));
}

#[test]
fn limiters_refuse_bad_input_and_consume_nothing() {
    let mut t = T::new();
    assert_eq!(
        t.run("LIMIT.TOKENBUCKET k 5 1 1000 2"),
        ints(&[1, 3, -1, 2000, -1])
    );
    let rev = t.ks.mod_revision(b"k", t.now);
    for (cmd, err) in [
        ("CL.THROTTLE c -1 30 60", "ERR max_burst must be in 0..=1000000000, got -1"),
        ("CL.THROTTLE c 15 0 60", "ERR count must be in 1..=1000000000, got 0"),
        ("CL.THROTTLE c 15 30 0", "ERR period must be in 1..=86400, got 0"),
        ("CL.THROTTLE c 15 30 86401", "ERR period must be in 1..=86400, got 86401"),
        ("CL.THROTTLE c 15 30 60 -1", "ERR quantity must be in 0..=9223372036854775807, got -1"),
        ("CL.THROTTLE c 15 30 1.5", "ERR value is not an integer or out of range"),
        ("CL.THROTTLE c 15 30 60 1 2", "ERR wrong number of arguments for 'cl.throttle' command"),
        ("LIMIT.TOKENBUCKET k 0 1 1000", "ERR capacity must be in 1..=1000000000, got 0"),
        ("LIMIT.TOKENBUCKET k 5 -3 1000", "ERR refill_tokens must be in 1..=1000000000, got -3"),
        ("LIMIT.TOKENBUCKET k 5 1 0", "ERR refill_period_ms must be in 1..=86400000, got 0"),
        ("LIMIT.TOKENBUCKET k 5 1 86400001", "ERR refill_period_ms must be in 1..=86400000, got 86400001"),
        ("LIMIT.TOKENBUCKET k 5 1 1000 6", "ERR quantity must be in 1..=5, got 6"),
        ("LIMIT.TOKENBUCKET k 5 1 1000 0", "ERR quantity must be in 1..=5, got 0"),
        ("LIMIT.TOKENBUCKET k 5 1 1000 x", "ERR value is not an integer or out of range"),
        ("LIMIT.TOKENBUCKET k 5 1 1000 1 2", "ERR wrong number of arguments for 'limit.tokenbucket' command"),
        ("LIMIT.LEAKYBUCKET k 5 0 1000", "ERR leak_tokens must be in 1..=1000000000, got 0"),
        ("LIMIT.FIXEDWINDOW k 0 1000", "ERR limit must be in 1..=1000000000, got 0"),
        ("LIMIT.SLIDINGWINDOW k 10 -1", "ERR window_ms must be in 1..=86400000, got -1"),
        ("LIMIT.GCRA k 3 1 1000 5", "ERR quantity must be in 1..=4, got 5"),
        ("LIMIT.LOG k 1000 0", "ERR limit must be in 1..=10000, got 0"),
        ("LIMIT.LOG k 1000 10001", "ERR limit must be in 1..=10000, got 10001"),
        ("LIMIT.LOG k 1000 5 10000 20 6", "ERR quantity must be in 1..=5, got 6"),
        ("LIMIT.LOG k 1 1 2 1 3 1 4 1 5 1 6 1 7 1 8 1 9 1", "ERR a sliding log takes 1..=8 policies, got 9"),
        ("LIMIT.LOG k 1000", "ERR wrong number of arguments for 'limit.log' command"),
        // Another algorithm on the same key.
        ("LIMIT.LEAKYBUCKET k 5 1 1000", "ERR the key holds a token-bucket limiter, not a leaky-bucket one (LIMIT.RESET it first)"),
        ("CL.THROTTLE k 4 1 1", "ERR the key holds a token-bucket limiter, not a gcra one (LIMIT.RESET it first)"),
    ] {
        assert_eq!(t.run(cmd), Reply::err(err), "{cmd}");
    }
    assert_eq!(t.ks.mod_revision(b"k", t.now), rev, "nothing consumed");
    assert_eq!(
        t.read("LIMIT.TOKENBUCKET k 5 1 1000 PEEK"),
        ints(&[1, 2, -1, 3000, -1])
    );
    assert_eq!(t.read("EXISTS c"), Reply::Int(0));

    // Keys of other types: WRONGTYPE, and other commands on a limiter key too.
    t.run("SET s v");
    t.run("RPUSH l a");
    for cmd in [
        "CL.THROTTLE s 1 1 1",
        "LIMIT.TOKENBUCKET l 5 1 1000",
        "LIMIT.LOG s 1000 5",
        "LIMIT.RESET s",
        "GET k",
        "INCR k",
        "HSET k f v",
        "LPUSH k x",
    ] {
        assert_eq!(t.run(cmd), Reply::err(WRONGTYPE), "{cmd}");
    }
    assert_eq!(
        t.read("LIMIT.FIXEDWINDOW s 5 1000 PEEK"),
        Reply::err(WRONGTYPE)
    );
    assert_eq!(t.run("GET s"), bulk("v"));
    assert_eq!(t.read("TYPE k"), Reply::Status("ratelimit".into()));
    assert_eq!(
        t.read("SCAN 0 TYPE ratelimit"),
        Reply::Array(vec![bulk("0"), Reply::Array(vec![bulk("k")])])
    );
}

#[test]
fn limiters_inside_eval_and_multi() {
    let mut t = T::new();
    let r = t.runv(vec![
        b"EVAL".to_vec(),
        b"local a = redis.call('CL.THROTTLE', KEYS[1], 1, 1, 60) \
          local b = redis.call('CL.THROTTLE', KEYS[1], 1, 1, 60) \
          local c = redis.call('CL.THROTTLE', KEYS[1], 1, 1, 60) \
          return {a[1], b[1], c[1], c[4]}"
            .to_vec(),
        b"1".to_vec(),
        b"api".to_vec(),
    ]);
    assert_eq!(r, ints(&[0, 0, 1, 60]));
    let mut revision = 100;
    let r = t.ks.apply(
        &mut revision,
        Semantics::NEWEST,
        t.now,
        &KvCommand::Multi {
            watches: vec![],
            cmds: vec![
                argv("LIMIT.FIXEDWINDOW m 1 60000"),
                argv("LIMIT.FIXEDWINDOW m 1 60000"),
                argv("LIMIT.FIXEDWINDOW m 1 60000 PEEK"),
                argv("LIMIT.RESET m"),
            ],
        },
        &mut t.events,
    );
    let Reply::Array(replies) = &r.replies[0] else {
        panic!("{r:?}")
    };
    assert_eq!(replies[0].clone(), ints(&[1, 0, -1, 20000, -1]));
    assert_eq!(replies[1].clone(), ints(&[0, 0, 20000, 20000, -1]));
    assert_eq!(replies[2].clone(), ints(&[0, 0, 20000, 20000, -1]));
    assert_eq!(replies[3].clone(), Reply::Int(1));
}

#[test]
fn every_command_name_is_found_in_any_case() {
    let table = command_table();
    for c in table {
        assert!(
            c.name.len() <= 32,
            "{} is longer than lookup's bound",
            c.name
        );
        assert_eq!(
            c.name,
            c.name.to_ascii_uppercase(),
            "table names are upper case"
        );
        for n in [c.name.to_string(), c.name.to_ascii_lowercase()] {
            assert_eq!(lookup(n.as_bytes()).map(|r| r.name), Some(c.name), "{n}");
        }
    }
    let names: std::collections::BTreeSet<_> = table.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), table.len(), "no name twice");
    assert!(lookup(b"NoSuchCommand").is_none());
    assert!(lookup(&[b'A'; 40]).is_none());
    assert_eq!(
        lookup(b"lock.Acquire").map(|c| c.name),
        Some("LOCK.ACQUIRE")
    );
}
