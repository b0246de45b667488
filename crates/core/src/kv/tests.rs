use super::*;

fn argv(s: &str) -> Argv {
    s.split_whitespace()
        .map(|w| w.as_bytes().to_vec())
        .collect()
}

struct T {
    ks: Keyspace,
    index: Index,
    now: Millis,
    events: Vec<crate::Event>,
}

impl T {
    fn new() -> T {
        T {
            ks: Keyspace::default(),
            index: 0,
            now: 1_000_000,
            events: vec![],
        }
    }
    fn run(&mut self, cmd: &str) -> Reply {
        self.runv(argv(cmd))
    }
    fn runv(&mut self, a: Argv) -> Reply {
        self.index += 1;
        self.ks.expire_due(self.now);
        let mut r = self.ks.apply(
            self.index,
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
    assert_eq!(t.run("HSET k f v"), Reply::err(exec::WRONGTYPE));
    assert_eq!(
        t.run("SET k v EX 0"),
        Reply::err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(t.run("SET k v NX XX"), Reply::err("ERR syntax error"));
    assert_eq!(t.run("DEL k n nope"), Reply::Int(2));
    assert_eq!(t.read("FENCE.TOKEN k"), Reply::Nil);
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
    assert!(t
        .events
        .iter()
        .any(|e| matches!(e, crate::Event::Kv(KvEvent::Pushed { .. }))));
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
    let r = t.ks.apply(10, t.now, &m, &mut vec![]);
    assert_eq!(
        r.replies,
        vec![Reply::Array(vec![Reply::Int(2), bulk("2")])]
    );
    let r = t.ks.apply(11, t.now, &m, &mut vec![]);
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
        Reply::err(exec::WRONGTYPE)
    );
    assert_eq!(
        eval(
            &mut t,
            "local r = redis.pcall('HGET', 'k', 'f'); return r.err",
            &[],
            &[]
        ),
        bulk(exec::WRONGTYPE)
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
