use super::*;
use fenced_core::kv::{NOPERM_CHANNEL, NOPERM_KEY};

fn argv(s: &str) -> Argv {
    s.split_whitespace()
        .map(|w| w.as_bytes().to_vec())
        .collect()
}

fn parse(text: &str) -> Acl {
    Acl::parse(text, "users.acl", None).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(text: &str) -> String {
    match Acl::parse(text, "users.acl", None) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

fn user(acl: &Acl, name: &str) -> Arc<User> {
    acl.user(name)
        .unwrap_or_else(|| panic!("no user {name}"))
        .clone()
}

fn sha_hex(s: &str) -> String {
    hex(&sha256(s.as_bytes()))
}

const TEST_FILE: &str = "\
# fenced users
user default off

user admin on >adminpw allkeys allchannels +@all
user locker on >lockpw ~lock:* &* -@all +@connection +get +set +del +eval +evalsha +script +fence.token +lock.acquire +lock.release +lock.renew +lock.info
user reader on >readpw allkeys -@all +@read +@connection
user disabled off >pw +@all allkeys
";

#[test]
fn renders_users_like_redis() {
    let acl = parse(TEST_FILE);
    // The first four lines are what Redis 7.0.15 answers for the same file.
    let list: Vec<String> = acl.users.values().map(|u| u.describe()).collect();
    assert_eq!(
        list,
        [
            "user admin on #5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9 ~* &* +@all",
            "user default off resetchannels -@all",
            "user disabled off #30c952fab122c3f9759f02a6d95c3758b246b4fee239957b2d4fee46e26170c4 ~* resetchannels +@all",
            &format!(
                "user locker on #{} ~lock:* &* -@all +@connection +get +set +del +eval +evalsha \
                 +script +fence.token +lock.acquire +lock.release +lock.renew +lock.info",
                sha_hex("lockpw")
            ),
            "user reader on #58d5ea977110f496f363782c2d79b74692a7ee2bbf77276d394dc9e5ac50ebca ~* resetchannels -@all +@read +@connection",
        ]
    );
    // Rendered lines parse back to the same users.
    let again = parse(&list.join("\n"));
    assert_eq!(again.users, acl.users);
}

#[test]
fn defaults_without_a_file_and_with_requirepass() {
    let open = Acl::new(None);
    assert_eq!(
        user(&open, "default").describe(),
        "user default on nopass ~* &* +@all"
    );
    assert!(
        open.initial_user().is_some(),
        "nopass default: no AUTH needed"
    );
    assert!(open.default_is_nopass());
    assert!(
        open.authenticate(b"default", b"anything").is_some(),
        "nopass takes any password"
    );

    let locked = Acl::new(Some("s3cret"));
    assert_eq!(
        user(&locked, "default").describe(),
        format!("user default on #{} ~* &* +@all", sha_hex("s3cret"))
    );
    assert!(locked.initial_user().is_none(), "AUTH needed");
    assert!(locked.authenticate(b"default", b"s3cret").is_some());
    assert!(locked.authenticate(b"default", b"wrong").is_none());
    assert!(locked.authenticate(b"nobody", b"s3cret").is_none());

    // A file without `default` gets the same default user, with --requirepass too.
    let acl = Acl::parse("user a on nopass", "f", Some("s3cret")).expect("parse");
    assert_eq!(user(&acl, "default"), user(&locked, "default"));
    let acl = parse("user a on nopass");
    assert_eq!(user(&acl, "default"), user(&open, "default"));
    // A file `default` and --requirepass: ambiguous.
    let e = Acl::parse("user default on >x +@all", "users.acl", Some("pw"))
        .expect_err("ambiguous")
        .to_string();
    assert!(
        e.contains("users.acl") && e.contains("--requirepass"),
        "{e}"
    );
    // A file `default` that is off or has a password: connections start unauthenticated.
    assert!(parse("user default off nopass").initial_user().is_none());
    assert!(parse("user default on >pw").initial_user().is_none());
    assert!(parse("user default on nopass").initial_user().is_some());
}

#[test]
fn new_users_start_with_nothing() {
    let acl = parse("user bob");
    let bob = user(&acl, "bob");
    assert_eq!(bob.describe(), "user bob off resetchannels -@all");
    assert!(!bob.enabled());
    assert!(acl.authenticate(b"bob", b"").is_none());
    assert!(bob.commands.is_empty());
    assert!(!bob.allkeys && bob.keys.is_empty());
    assert!(!bob.allchannels && bob.channels.is_empty());
}

#[test]
fn password_rules() {
    let h = sha_hex("hashed");
    let acl = parse(&format!(
        "user a on >one >two <one\n\
         user b on #{h}\n\
         user c on >x nopass\n\
         user d on nopass >y\n\
         user e on >x resetpass\n\
         user f on >x #{h} !{h}\n\
         user g on >\"pass word\" >'it\\'s' >\"tab\\there\\x41\"\n\
         user h off >pw\n"
    ));
    let ok = |u: &str, p: &str| acl.authenticate(u.as_bytes(), p.as_bytes()).is_some();
    assert!(!ok("a", "one") && ok("a", "two"));
    assert!(
        ok("b", "hashed") && !ok("b", &h),
        "#<hash> stores the hash itself"
    );
    assert!(
        ok("c", "x") && ok("c", "whatever"),
        "nopass drops passwords"
    );
    assert!(ok("d", "y") && !ok("d", "other"), ">pass clears nopass");
    assert!(!ok("e", "x") && !ok("e", ""), "resetpass: nothing works");
    assert!(ok("f", "x") && !ok("f", "hashed"));
    assert!(ok("g", "pass word") && ok("g", "it's") && ok("g", "tab\thereA"));
    assert!(!ok("h", "pw"), "off: a right password is refused too");
    // Passwords are never rendered in clear.
    let listed: String = acl.users.values().map(|u| u.describe()).collect();
    for clear in ["two", "pass word", "hashed\""] {
        assert!(!listed.contains(clear), "{listed}");
    }
}

#[test]
fn key_channel_and_command_rules() {
    let acl = parse(
        "user k on nopass ~a:* ~b allkeys resetkeys ~c:* +@all\n\
         user ch on nopass &x.* allchannels resetchannels &y.* +@all allkeys\n\
         user cmd on nopass allkeys allchannels +@all -@write +set -get nocommands +@read -@fencing +ping\n\
         user all on nopass allkeys allchannels nocommands allcommands\n\
         user r on >pw ~k &c +get reset\n",
    );
    let k = user(&acl, "k");
    assert_eq!(k.keys, vec![b"c:*".to_vec()]);
    assert!(k.check(&argv("GET c:1")).is_ok());
    assert_eq!(k.check(&argv("GET a:1")), Err(NOPERM_KEY.into()));
    let ch = user(&acl, "ch");
    assert_eq!(ch.channels, vec![b"y.*".to_vec()]);
    assert!(ch.check(&argv("PUBLISH y.1 m")).is_ok());
    assert_eq!(ch.check(&argv("PUBLISH x.1 m")), Err(NOPERM_CHANNEL.into()));
    let cmd = user(&acl, "cmd");
    assert_eq!(
        cmd.describe().split(" -@all ").nth(1),
        Some("+@read -@fencing +ping")
    );
    assert!(cmd.check(&argv("GET a")).is_ok());
    assert!(cmd.check(&argv("PING")).is_ok());
    assert!(cmd.check(&argv("SET a b")).is_err());
    assert!(cmd.check(&argv("FENCE.TOKEN a")).is_err(), "-@fencing");
    let all = user(&acl, "all");
    assert!(all.all_commands());
    assert!(all.describe().ends_with(" +@all"));
    assert_eq!(
        user(&acl, "r"),
        user(&parse("user r"), "r"),
        "reset = a new user"
    );
    // Keywords and command names are case-insensitive, like Redis's.
    let acl = parse("user u ON NoPass AllKeys +GET -@ALL +@Read");
    let u = user(&acl, "u");
    assert!(u.enabled() && u.nopass && u.allkeys);
    assert!(u.check(&argv("get x")).is_ok());
}

#[test]
fn bad_rules_name_file_line_and_rule() {
    let cases = [
        ("%R~foo", "access type"),
        ("%RW~foo", "access type"),
        ("+get|x", "subcommand"),
        ("-client|kill", "subcommand"),
        ("(~x", "selectors"),
        ("clearselectors", "selectors"),
        ("+@nosuch", "unknown command category 'nosuch'"),
        ("+nosuch", "unknown command 'nosuch'"),
        ("-nosuch", "unknown command 'nosuch'"),
        ("bogus", "unknown or unsupported"),
        ("#abc", "64 characters"),
        (
            "#5E884898DA28047151D0E56F8DC6292773603D0D6AABBDD62A11EF721D1542D8",
            "lowercase",
        ),
        ("<notset", "does not exist"),
        (
            "!5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
            "does not exist",
        ),
    ];
    for (rule, why) in cases {
        let text = format!("# header\n\nuser ok on nopass\nuser bad on {rule} +get\n");
        let e = parse_err(&text);
        assert!(
            e.starts_with("ACL file users.acl, line 4: rule '")
                && e.contains(rule)
                && e.contains(why),
            "{rule}: {e}"
        );
    }
    let e = parse_err("user a allkeys ~x");
    assert!(
        e.contains("line 1: rule '~x'") && e.contains("resetkeys"),
        "{e}"
    );
    let e = parse_err("user a allchannels &x");
    assert!(
        e.contains("rule '&x'") && e.contains("resetchannels"),
        "{e}"
    );
    let e = parse_err("user a on\nuser b on\nuser a off");
    assert_eq!(e, "ACL file users.acl, line 3: duplicate user 'a'");
    let e = parse_err("\n\nadmin on >pw");
    assert!(
        e.starts_with("ACL file users.acl, line 3: a line must start with 'user'"),
        "{e}"
    );
    let e = parse_err("user");
    assert!(e.contains("line 1: expected 'user <name>"), "{e}");
    let e = parse_err("user a on >\"unterminated");
    assert!(e.contains("line 1: unbalanced quotes"), "{e}");
    let e = parse_err("user a on >\"x\"y");
    assert!(e.contains("closing quote"), "{e}");
    let e = parse_err("user \"a b\" on");
    assert!(e.contains("invalid user name 'a b'"), "{e}");
    let missing = Acl::load(Path::new("/nonexistent/users.acl"), None)
        .expect_err("missing file")
        .to_string();
    assert!(missing.contains("/nonexistent/users.acl"), "{missing}");
}

#[test]
fn command_permissions_and_exact_errors() {
    let acl = parse(TEST_FILE);
    let reader = user(&acl, "reader");
    assert!(reader.check(&argv("GET k")).is_ok());
    assert!(reader.check(&argv("MGET a b")).is_ok());
    assert!(
        reader.check(&argv("KEYS *")).is_ok(),
        "allkeys: KEYS is fine"
    );
    assert!(reader.check(&argv("LOCK.INFO job")).is_ok());
    assert_eq!(
        reader.check(&argv("set k v")),
        Err("NOPERM User reader has no permissions to run the 'set' command".into())
    );
    assert!(reader.check(&argv("EVAL x 0")).is_err());
    assert!(reader.check(&argv("LOCK.ACQUIRE j o 1")).is_err());
    // AUTH, HELLO, QUIT and RESET are always allowed.
    let nothing = user(&acl, "default");
    for cmd in ["AUTH a b", "hello 3", "QUIT", "RESET"] {
        assert!(nothing.check(&argv(cmd)).is_ok(), "{cmd}");
    }
    assert_eq!(
        nothing.check(&argv("PING")),
        Err("NOPERM User default has no permissions to run the 'ping' command".into())
    );

    let locker = user(&acl, "locker");
    for ok in [
        "GET lock:a",
        "SET lock:a v NX PX 100",
        "DEL lock:a lock:b",
        "EVAL s 1 lock:a",
        "EVALSHA s 0",
        "SCRIPT LOAD x",
        "LOCK.ACQUIRE lock:job me 100",
        "FENCE.TOKEN lock:a",
        "PING",
        "CLIENT SETINFO LIB-NAME x",
    ] {
        assert_eq!(locker.check(&argv(ok)), Ok(()), "{ok}");
    }
    for (cmd, err) in [
        ("GET other", NOPERM_KEY.to_string()),
        ("DEL lock:a other", NOPERM_KEY.into()),
        ("EVAL s 2 lock:a other", NOPERM_KEY.into()),
        ("LOCK.ACQUIRE job me 100", NOPERM_KEY.into()),
        (
            "INCR lock:a",
            "NOPERM User locker has no permissions to run the 'incr' command".into(),
        ),
        (
            "KEYS *",
            "NOPERM User locker has no permissions to run the 'keys' command".into(),
        ),
    ] {
        assert_eq!(locker.check(&argv(cmd)), Err(err), "{cmd}");
    }
    // Whole-keyspace commands need allkeys even when the command is allowed.
    let acl = parse("user u on nopass ~a* &news +@all");
    let u = user(&acl, "u");
    for cmd in ["KEYS a*", "SCAN 0", "DBSIZE", "FLUSHDB", "FLUSHALL"] {
        assert_eq!(u.check(&argv(cmd)), Err(NOPERM_KEY.into()), "{cmd}");
    }
    assert!(u.check(&argv("MSET a1 x a2 y")).is_ok());
    assert_eq!(u.check(&argv("MSET a1 x b y")), Err(NOPERM_KEY.into()));
    assert!(u.check(&argv("BLPOP a1 a2 0")).is_ok());
    assert_eq!(u.check(&argv("BLPOP a1 b 0")), Err(NOPERM_KEY.into()));
    assert!(u.check(&argv("WATCH a1")).is_ok());
    assert_eq!(u.check(&argv("WATCH b")), Err(NOPERM_KEY.into()));
    assert!(u.check(&argv("SUBSCRIBE news")).is_ok());
    assert_eq!(
        u.check(&argv("SUBSCRIBE other")),
        Err(NOPERM_CHANNEL.into())
    );
    assert!(u.check(&argv("PSUBSCRIBE news")).is_ok());
    assert_eq!(u.check(&argv("PSUBSCRIBE n*")), Err(NOPERM_CHANNEL.into()));
    assert!(u.check(&argv("UNSUBSCRIBE other")).is_ok());
}

#[test]
fn categories_come_from_the_command_table() {
    let cat = |c: &str| category_commands(c).unwrap_or_else(|| panic!("no category {c}"));
    let read = cat("read");
    for c in [
        "GET",
        "MGET",
        "HGETALL",
        "ZRANGE",
        "FENCE.TOKEN",
        "LOCK.INFO",
        "KEYS",
    ] {
        assert!(read.contains(&c), "read: {c}");
    }
    for c in ["SET", "TIME", "EVAL", "LOCK.ACQUIRE", "PING"] {
        assert!(!read.contains(&c), "read: {c}");
    }
    let write = cat("WRITE");
    for c in [
        "SET",
        "DEL",
        "BLPOP",
        "FENCE.SET",
        "LOCK.ACQUIRE",
        "LOCK.RELEASE",
        "LOCK.RENEW",
    ] {
        assert!(write.contains(&c), "write: {c}");
    }
    for c in ["GET", "EVAL", "SCRIPT", "PUBLISH", "LOCK.INFO"] {
        assert!(!write.contains(&c), "write: {c}");
    }
    assert_eq!(
        cat("fencing"),
        [
            "FENCE.SET",
            "FENCE.TOKEN",
            "LOCK.ACQUIRE",
            "LOCK.READ",
            "LOCK.WRITE",
            "LOCK.PERMIT",
            "LOCK.MACQUIRE",
            "LOCK.RELEASE",
            "LOCK.MRELEASE",
            "LOCK.RENEW",
            "LOCK.INFO",
            "SESSION.OPEN",
            "SESSION.KEEPALIVE",
            "SESSION.CLOSE",
            "SESSION.INFO"
        ]
    );
    assert_eq!(cat("scripting"), ["EVAL", "EVALSHA", "SCRIPT"]);
    assert_eq!(
        cat("blocking"),
        [
            "BLPOP",
            "BRPOP",
            "LOCK.ACQUIRE",
            "LOCK.READ",
            "LOCK.WRITE",
            "LOCK.PERMIT",
            "LOCK.MACQUIRE"
        ]
    );
    assert!(cat("admin").contains(&"LOCK.FORCEUNLOCK"));
    assert!(cat("admin").contains(&"ACL"));
    let admin = cat("admin");
    for c in [
        "CONFIG",
        "ACL",
        "SAVE",
        "SHUTDOWN",
        "REPLICAOF",
        "DEBUG",
        "MONITOR",
        "ROLE",
        "LASTSAVE",
    ] {
        assert!(admin.contains(&c), "admin: {c}");
    }
    assert!(cat("dangerous").contains(&"FLUSHALL"));
    assert_eq!(cat("all").len(), command_table().len());
    assert!(category_commands("nosuch").is_none());
    // Every command is in some category besides `all` (TIME is only @fast in Redis, a
    // category fenced does not have), and every category is non-empty.
    for name in command_table()
        .iter()
        .map(|c| c.name)
        .filter(|n| *n != "TIME")
    {
        assert!(
            categories().any(|c| cat(c).contains(&name)),
            "{name} is in no category"
        );
    }
    for c in categories() {
        assert!(!cat(c).is_empty(), "{c}");
    }
}

#[test]
fn limits_sent_to_the_state_machine() {
    let acl = parse(TEST_FILE);
    assert_eq!(user(&acl, "admin").limits_for(&[argv("EVAL s 0")]), None);
    let reader = user(&acl, "reader");
    assert_eq!(
        reader.limits_for(&[argv("GET a")]),
        None,
        "allkeys, no script"
    );
    let r = reader
        .limits_for(&[argv("GET a"), argv("EVALSHA s 0")])
        .expect("a script of a command-restricted user");
    assert_eq!(
        (r.keys, r.channels),
        (None, Some(vec![])),
        "allkeys, no channels"
    );
    assert!(r
        .commands
        .as_ref()
        .is_some_and(|c| c.contains(&"GET".to_string())));
    assert!(!r
        .commands
        .as_ref()
        .is_some_and(|c| c.contains(&"SET".to_string())));
    let locker = user(&acl, "locker");
    let r = locker
        .limits_for(&[argv("SET lock:a 1")])
        .expect("key-restricted");
    assert_eq!(r.user, "locker");
    assert_eq!(r.keys, Some(vec![b"lock:*".to_vec()]));
    assert_eq!(r.channels, None, "&*");
    assert_eq!(
        r.commands, None,
        "no script: the front end checked every command"
    );
    let r = locker
        .limits_for(&[argv("eval s 1 lock:a")])
        .expect("script");
    assert!(r.commands.is_some());
    // allkeys but no channels (Redis's default for new users): only scripts need wrapping.
    let acl = parse("user app on nopass allkeys +@all");
    let app = user(&acl, "app");
    assert_eq!(
        app.limits_for(&[argv("SET a 1"), argv("PUBLISH c m")]),
        None
    );
    let r = app.limits_for(&[argv("EVAL s 0")]).expect("script");
    assert_eq!((r.keys, r.channels, r.commands), (None, Some(vec![]), None));
}

#[test]
fn acl_command_replies() {
    let acl = parse(TEST_FILE);
    let admin = user(&acl, "admin");
    let run = |args: &str| acl.command(&admin, &argv(args));
    assert_eq!(run("WHOAMI"), Reply::bulk("admin"));
    assert_eq!(
        run("users"),
        Reply::Array(
            ["admin", "default", "disabled", "locker", "reader"]
                .iter()
                .map(Reply::bulk)
                .collect()
        )
    );
    let Reply::Array(list) = run("LIST") else {
        panic!("ACL LIST")
    };
    assert_eq!(list.len(), 5);
    assert_eq!(list[1], Reply::bulk("user default off resetchannels -@all"));
    let Reply::Array(cats) = run("CAT") else {
        panic!("ACL CAT")
    };
    assert!(cats.contains(&Reply::bulk("fencing")) && cats.contains(&Reply::bulk("read")));
    let Reply::Array(fencing) = run("CAT fencing") else {
        panic!("ACL CAT fencing")
    };
    assert!(fencing.contains(&Reply::bulk("lock.acquire")), "lower case");
    assert_eq!(
        run("CAT nosuch"),
        Reply::err("ERR Unknown category 'nosuch'")
    );
    assert_eq!(run("GETUSER nobody"), Reply::Nil);
    let Reply::Map(fields) = run("GETUSER locker") else {
        panic!("ACL GETUSER")
    };
    assert_eq!(fields[0].1, Reply::Array(vec![Reply::bulk("on")]));
    assert_eq!(
        fields[1].1,
        Reply::Array(vec![Reply::bulk(sha_hex("lockpw"))])
    );
    assert_eq!(fields[3].1, Reply::bulk("~lock:*"));
    assert_eq!(fields[4].1, Reply::bulk("&*"));
    for sub in ["SETUSER bob on", "DELUSER bob", "LOAD", "SAVE"] {
        assert_eq!(run(sub), Reply::err(NOT_AT_RUNTIME), "{sub}");
    }
    assert_eq!(
        run("WHOAMI x"),
        Reply::err("ERR wrong number of arguments for 'acl|whoami' command")
    );
    assert_eq!(
        run("FOO"),
        Reply::err("ERR unknown subcommand 'FOO'. Try ACL HELP.")
    );
}

/// The users of issue 13's example: `alice` may take `lock:a*` (lock and string commands),
/// `admin` may do anything.
const PORTS_FILE: &str = "\
user default off
user alice on >alicepw ~lock:a* -@all +@fencing +@string +@connection
user admin on >adminpw +@all ~*
user ops on >opspw ~* -@all +@admin
user notquite on >pw ~* +@all -acl
";

#[test]
fn permit_is_one_check_for_lock_names_and_keys() {
    let acl = parse(PORTS_FILE);
    let alice = user(&acl, "alice");
    // Lock names (the gRPC Lock calls ask for LOCK.*) and keys alike.
    assert_eq!(alice.permit("LOCK.ACQUIRE", &[b"lock:a1"]), Ok(()));
    assert_eq!(
        alice.permit("lock.acquire", &[b"lock:a1", b"lock:a2"]),
        Ok(())
    );
    assert_eq!(alice.permit("FENCE.SET", &[b"lock:a1"]), Ok(()));
    assert_eq!(alice.permit("GET", &[b"lock:a"]), Ok(()));
    let denied = alice.permit("LOCK.ACQUIRE", &[b"lock:a1", b"lock:b"]);
    assert_eq!(
        denied,
        Err(Denied::Key {
            user: "alice".into(),
            command: "lock.acquire".into(),
            key: "lock:b".into(),
        })
    );
    let text = denied.err().map(|d| d.to_string()).unwrap_or_default();
    assert!(
        text.contains("alice") && text.contains("'lock:b'") && text.contains("lock.acquire"),
        "{text}"
    );
    // The same refusal over RESP, with Redis's text.
    assert_eq!(
        alice.check(&argv("LOCK.ACQUIRE lock:b me 1000")),
        Err(NOPERM_KEY.into())
    );
    assert_eq!(alice.check(&argv("LOCK.ACQUIRE lock:a9 me 1000")), Ok(()));
    assert_eq!(
        alice.check(&argv("LOCK.RELEASE lock:b me 7")),
        Err(NOPERM_KEY.into())
    );
    // Commands outside the rules, whatever the keys.
    assert_eq!(
        alice.permit("HSET", &[b"lock:a1"]),
        Err(Denied::Command {
            user: "alice".into(),
            command: "hset".into()
        })
    );
    assert_eq!(
        alice.check(&argv("HSET lock:a1 f v")),
        Err("NOPERM User alice has no permissions to run the 'hset' command".into())
    );
    // No keys: only the command counts.
    assert_eq!(alice.permit("LOCK.ACQUIRE", &[]), Ok(()));
    // Whole-keyspace commands name no key but still need allkeys.
    let d = alice.permit_argv(&argv("KEYS *"));
    assert!(matches!(d, Err(Denied::Command { .. })), "{d:?}");
    let u = user(&parse("user u on nopass ~a* +@all"), "u");
    assert!(matches!(
        u.permit_argv(&argv("SCAN 0")),
        Err(Denied::Keyspace { .. })
    ));
    // Unrestricted users pass anything.
    let admin = user(&acl, "admin");
    assert_eq!(admin.permit("LOCK.ACQUIRE", &[b"anything"]), Ok(()));
    assert_eq!(admin.permit("FLUSHALL", &[]), Ok(()));
}

#[test]
fn administrators_are_users_with_every_admin_command() {
    let acl = parse(PORTS_FILE);
    for (name, admin) in [
        ("admin", true),
        ("ops", true),
        ("alice", false),
        ("notquite", false),
        ("default", false),
    ] {
        let u = user(&acl, name);
        assert_eq!(u.is_admin(), admin, "{name}");
        assert_eq!(
            u.require_admin("Cluster.MemberAdd").is_ok(),
            admin,
            "{name}"
        );
    }
    let e = user(&acl, "alice")
        .require_admin("Cluster.MemberRemove")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("alice") && e.contains("Cluster.MemberRemove") && e.contains("@admin"),
        "{e}"
    );
    // Without a file, the default user is an unrestricted administrator (nothing changes
    // for clusters without users).
    assert!(user(&Acl::new(None), "default").is_admin());
    assert!(user(&Acl::new(Some("pw")), "default").is_admin());
}

#[test]
fn prefix_ranges_need_a_literal_star_pattern_covering_them_and_other_ranges_allkeys() {
    let acl = parse(
        "user app on nopass ~app/* ~x?/* ~[ab]* -@all +get +set\n\
         user all on nopass allkeys -@all +get\n",
    );
    let app = user(&acl, "app");
    assert_eq!(app.permit_prefix("GET", b"app/"), Ok(()));
    assert_eq!(app.permit_prefix("get", b"app/sub/"), Ok(()));
    // Wider than the pattern, or patterns that do not match every key of the prefix.
    for p in [&b"app"[..], b"ap", b"xy/", b"a"] {
        let e = app.permit_prefix("GET", p).err().map(|d| d.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("no permissions to access the key")),
            "{p:?}: {e:?}"
        );
    }
    // The command comes first.
    assert!(matches!(
        app.permit_prefix("DEL", b"app/"),
        Err(Denied::Command { .. })
    ));
    assert!(matches!(
        app.permit_keyspace("GET"),
        Err(Denied::Keyspace { .. })
    ));
    let all = user(&acl, "all");
    assert_eq!(all.permit_prefix("GET", b""), Ok(()));
    assert_eq!(all.permit_keyspace("GET"), Ok(()));
    assert!(matches!(
        all.permit_keyspace("SET"),
        Err(Denied::Command { .. })
    ));
}

#[test]
fn request_ids_are_namespaced_by_user() {
    let acl = Acl::parse(
        "user alice on nopass ~* +@all\nuser bob on nopass ~* +@all\n",
        "test",
        None,
    )
    .expect("acl");
    let (alice, bob) = (
        acl.user("alice").expect("alice"),
        acl.user("bob").expect("bob"),
    );
    let a = alice.request_id(77, 3);
    assert_eq!(
        a,
        alice.request_id(77, 3),
        "stable: a retry finds its answer"
    );
    assert_eq!(a.seq, 3);
    assert_ne!(a.client_id, bob.request_id(77, 3).client_id, "per user");
    assert_ne!(a.client_id, alice.request_id(78, 3).client_id, "per client");
    assert_ne!(a.client_id, 77, "not the client's own id");
    assert_ne!(alice.request_id(0, 1).client_id, 0);
}
