//! ACL users (`fenced serve --acl-file`) on a 3-node cluster of real `fenced` processes: exact
//! NOAUTH / WRONGPASS / NOPERM replies over a raw RESP connection, `ACL WHOAMI/LIST/CAT`,
//! key, channel and command limits (front end and state machine), a script that declares an
//! allowed key but writes another one, MULTI refusing a forbidden command at queue time,
//! redis-rs, redis-cli `--user/--pass` and redis-py's `Lock` (RESP2 and RESP3) as a
//! key-restricted user; and `fenced serve` refusing bad ACL files before it starts.
//!
//! redis-cli and python3's `redis` package are installed by `.ci/run`; a part whose external
//! client is missing says so and is skipped.

mod support;

use std::process::Command;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use support::{
    follower_of, require, resp_cmd as cmd, resp_connect_with, run_bounded, within, Raw,
    TestCluster, LEADER_TIMEOUT, R,
};

const STEP: Duration = Duration::from_secs(20);

/// The users of the cluster test (passwords: `<name minus "er">pw`, see below).
const ACL_FILE: &str = "\
# fenced ACL test users
user default off

user admin on >adminpw allkeys allchannels +@all
user locker on >lockpw ~lock:* &* -@all +@connection +@transaction +get +set +del +pttl +pexpire +eval +evalsha +script +fence.token +lock.acquire +lock.release +lock.renew +lock.info
user reader on >readpw allkeys -@all +@read +@connection
user pubsub on >pubpw allkeys &news.* -@all +@pubsub +@connection
user disabled off >pw +@all allkeys
";

const NOAUTH: &str = "NOAUTH Authentication required.";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NOPERM_KEY: &str = "NOPERM No permissions to access a key";
const NOPERM_CHANNEL: &str = "NOPERM No permissions to access a channel";

fn noperm(user: &str, cmd: &str) -> String {
    format!("NOPERM User {user} has no permissions to run the '{cmd}' command")
}

async fn connect_as(c: &TestCluster, id: u64, user: &str, pass: &str) -> MultiplexedConnection {
    resp_connect_with(c, id, Some((user, pass))).await
}

/// redis-py as `locker`: its `Lock` (SET NX PX, then EVALSHA scripts) on `lock:*` works, on
/// another key it fails with NoPermissionError; wrong passwords and disabled users fail
/// with AuthenticationError; `reader` cannot write.
const REDIS_PY: &str = r#"
import sys
import redis
from redis.exceptions import AuthenticationError, NoPermissionError

host, port, proto = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def client(user, password):
    return redis.Redis(host=host, port=port, protocol=proto, socket_timeout=10,
                       username=user, password=password)

r = client("locker", "lockpw")
assert r.ping()
lock = r.lock(f"lock:py{proto}", timeout=5)
assert lock.acquire(blocking=False), "acquire"
assert lock.owned() and lock.locked()
assert not r.lock(f"lock:py{proto}", timeout=5).acquire(blocking=False), "held"
assert lock.extend(10)
assert r.pttl(f"lock:py{proto}") > 9000
assert lock.reacquire()
lock.release()
assert not lock.locked()
try:
    r.lock(f"other:py{proto}", timeout=5).acquire(blocking=False)
    raise SystemExit("a lock outside lock:* was granted")
except NoPermissionError as e:
    assert "No permissions to access a key" in str(e), e
try:
    r.incr(f"lock:n{proto}")
    raise SystemExit("INCR was allowed")
except NoPermissionError as e:
    assert "has no permissions to run the 'incrby' command" in str(e), e
for user, password in [("locker", "nope"), ("disabled", "pw"), ("nobody", "x")]:
    try:
        client(user, password).ping()
        raise SystemExit(f"{user} authenticated")
    except AuthenticationError:
        pass
try:
    client("reader", "readpw").set("x", "1")
    raise SystemExit("reader wrote")
except NoPermissionError:
    pass
print("redis-py acl ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_on_a_cluster() {
    let c = TestCluster::start_with("resp_acl", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let addr = c.resp_addr(node);

    // Unauthenticated (`default` is off), wrong passwords, disabled users.
    let mut anon = Raw::connect(&addr);
    assert_eq!(anon.send(&["PING"]), R::err(NOAUTH));
    assert_eq!(anon.send(&["GET", "x"]), R::err(NOAUTH));
    assert_eq!(anon.send(&["AUTH", "disabled", "pw"]), R::err(WRONGPASS));
    assert_eq!(anon.send(&["AUTH", "admin", "wrong"]), R::err(WRONGPASS));
    assert_eq!(anon.send(&["AUTH", "nobody", "x"]), R::err(WRONGPASS));
    assert_eq!(
        anon.send(&["AUTH", "adminpw"]),
        R::err(WRONGPASS),
        "= default"
    );
    assert_eq!(
        anon.send(&["HELLO", "3", "AUTH", "locker", "nope"]),
        R::err(WRONGPASS)
    );
    assert_eq!(anon.send(&["PING"]), R::err(NOAUTH));
    let hello = anon.send(&["HELLO", "3", "AUTH", "locker", "lockpw"]);
    assert!(matches!(hello, R::Map(_)), "{hello:?}");
    assert_eq!(
        anon.send(&["ACL", "WHOAMI"]),
        R::err(&noperm("locker", "acl"))
    );
    assert_eq!(
        anon.send(&["AUTH", "admin", "adminpw"]),
        R::Status("OK".into())
    );
    assert_eq!(anon.send(&["ACL", "WHOAMI"]), R::bulk("admin"));
    let R::Bulk(Some(info)) = anon.send(&["CLIENT", "INFO"]) else {
        panic!("CLIENT INFO")
    };
    assert!(info.contains(" user=admin "), "{info}");
    assert_eq!(anon.send(&["RESET"]), R::Status("RESET".into()));
    assert_eq!(anon.send(&["PING"]), R::err(NOAUTH), "RESET logs out");

    // ACL introspection as admin (redis-rs).
    let mut admin = connect_as(&c, node, "admin", "adminpw").await;
    let whoami: String = cmd(&mut admin, &["ACL", "WHOAMI"]).await;
    assert_eq!(whoami, "admin");
    let users: Vec<String> = cmd(&mut admin, &["ACL", "USERS"]).await;
    assert_eq!(
        users,
        ["admin", "default", "disabled", "locker", "pubsub", "reader"]
    );
    let list: Vec<String> = cmd(&mut admin, &["ACL", "LIST"]).await;
    let locker_line = list
        .iter()
        .find(|l| l.starts_with("user locker "))
        .unwrap_or_else(|| panic!("{list:?}"));
    assert!(
        locker_line.starts_with(
            "user locker on #f179645118f490fa073dee00c249b7823bd832c21d9faf48685e0820e20086dc \
             ~lock:* &* -@all +@connection +@transaction +get +set"
        ),
        "{locker_line}"
    );
    assert!(
        list.iter()
            .all(|l| !l.contains("lockpw") && !l.contains("adminpw")),
        "{list:?}"
    );
    assert!(
        list.contains(&"user default off resetchannels -@all".to_string()),
        "{list:?}"
    );
    let cats: Vec<String> = cmd(&mut admin, &["ACL", "CAT"]).await;
    for cat in [
        "read",
        "write",
        "keyspace",
        "scripting",
        "fencing",
        "dangerous",
    ] {
        assert!(cats.iter().any(|c| c == cat), "{cat}: {cats:?}");
    }
    let fencing: Vec<String> = cmd(&mut admin, &["ACL", "CAT", "fencing"]).await;
    assert_eq!(
        fencing,
        [
            "fence.set",
            "fence.token",
            "lock.acquire",
            "lock.read",
            "lock.write",
            "lock.permit",
            "lock.macquire",
            "lock.release",
            "lock.mrelease",
            "lock.renew",
            "lock.info",
            "session.open",
            "session.keepalive",
            "session.close",
            "session.info"
        ]
    );
    let mut raw_admin = Raw::connect(&addr);
    raw_admin.send(&["AUTH", "admin", "adminpw"]);
    assert_eq!(
        raw_admin.send(&["ACL", "SETUSER", "eve", "on", "+@all"]),
        R::err(
            "ERR ACL rules are read from --acl-file at startup; fenced does not change them at run time"
        )
    );
    assert_eq!(
        raw_admin.send(&["ACL", "CAT", "nosuch"]),
        R::err("ERR Unknown category 'nosuch'")
    );

    // reader: reads only.
    let mut reader = Raw::connect(&addr);
    assert_eq!(
        reader.send(&["AUTH", "reader", "readpw"]),
        R::Status("OK".into())
    );
    assert_eq!(reader.send(&["GET", "x"]), R::Bulk(None));
    assert_eq!(
        reader.send(&["SET", "x", "1"]),
        R::err(&noperm("reader", "set"))
    );
    assert_eq!(
        reader.send(&["EVAL", "return 1", "0"]),
        R::err(&noperm("reader", "eval"))
    );

    // locker: its keys and commands only.
    let mut locker = Raw::connect(&c.resp_addr(leader));
    assert_eq!(
        locker.send(&["AUTH", "locker", "lockpw"]),
        R::Status("OK".into())
    );
    assert_eq!(locker.send(&["SET", "lock:a", "v"]), R::Status("OK".into()));
    assert_eq!(locker.send(&["GET", "lock:a"]), R::bulk("v"));
    assert_eq!(locker.send(&["SET", "other", "v"]), R::err(NOPERM_KEY));
    assert_eq!(locker.send(&["GET", "other"]), R::err(NOPERM_KEY));
    assert_eq!(locker.send(&["DEL", "lock:a", "other"]), R::err(NOPERM_KEY));
    assert_eq!(
        locker.send(&["INCR", "lock:n"]),
        R::err(&noperm("locker", "incr"))
    );
    assert!(matches!(
        locker.send(&["LOCK.ACQUIRE", "lock:job", "me", "30000"]),
        R::Int(t) if t > 0
    ));
    assert_eq!(
        locker.send(&["LOCK.ACQUIRE", "job", "me", "30000"]),
        R::err(NOPERM_KEY)
    );
    assert!(matches!(locker.send(&["FENCE.TOKEN", "lock:a"]), R::Int(t) if t > 0));
    // A script declaring lock:a that writes `other`: refused at that call by the state
    // machine, the write before it stays (Redis's script-error semantics).
    let sneaky = "redis.call('SET', KEYS[1], 'before'); \
                  redis.call('SET', 'other', 'sneaky'); return 1";
    assert_eq!(
        locker.send(&["EVAL", sneaky, "1", "lock:a"]),
        R::err(NOPERM_KEY)
    );
    // Commands the user may not run are refused inside scripts too; pcall sees the error.
    assert_eq!(
        locker.send(&["EVAL", "return redis.call('INCR', KEYS[1])", "1", "lock:n"]),
        R::err(&noperm("locker", "incr"))
    );
    assert_eq!(
        locker.send(&[
            "EVAL",
            "return redis.pcall('GET', 'other')['err']",
            "1",
            "lock:a"
        ]),
        R::bulk(NOPERM_KEY)
    );
    assert_eq!(
        locker.send(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "lock:a"]),
        R::bulk("before")
    );
    // Declaring a forbidden key: refused before the script runs.
    assert_eq!(
        locker.send(&["EVAL", "return 1", "1", "other"]),
        R::err(NOPERM_KEY)
    );
    // MULTI: a forbidden command is refused while queuing and aborts EXEC.
    assert_eq!(locker.send(&["MULTI"]), R::Status("OK".into()));
    assert_eq!(
        locker.send(&["SET", "lock:m", "1"]),
        R::Status("QUEUED".into())
    );
    assert_eq!(locker.send(&["SET", "other", "1"]), R::err(NOPERM_KEY));
    assert_eq!(
        locker.send(&["EXEC"]),
        R::err("EXECABORT Transaction discarded because of previous errors.")
    );
    assert_eq!(locker.send(&["GET", "lock:m"]), R::Bulk(None));
    // As admin, on every node: `other` was never written; lock:a kept the script's write.
    for id in c.ids() {
        let mut a = connect_as(&c, id, "admin", "adminpw").await;
        let other: Option<String> = cmd(&mut a, &["GET", "other"]).await;
        assert_eq!(other, None, "node {id}");
        let kept: String = cmd(&mut a, &["GET", "lock:a"]).await;
        assert_eq!(kept, "before", "node {id}");
    }

    // Channels: SUBSCRIBE/PUBLISH channels match &patterns, PSUBSCRIBE patterns literally.
    let mut ps = Raw::connect(&addr);
    assert_eq!(
        ps.send(&["AUTH", "pubsub", "pubpw"]),
        R::Status("OK".into())
    );
    assert_eq!(ps.send(&["PUBLISH", "other", "m"]), R::err(NOPERM_CHANNEL));
    assert_eq!(ps.send(&["PUBLISH", "news.a", "m"]), R::Int(0));
    assert_eq!(ps.send(&["SUBSCRIBE", "other"]), R::err(NOPERM_CHANNEL));
    assert_eq!(ps.send(&["PSUBSCRIBE", "news.a*"]), R::err(NOPERM_CHANNEL));
    assert_eq!(
        ps.send(&["PSUBSCRIBE", "news.*"]),
        R::Array(Some(vec![
            R::bulk("psubscribe"),
            R::bulk("news.*"),
            R::Int(1)
        ]))
    );

    // redis-rs as locker: a key-restricted user's ordinary traffic.
    let mut rs = connect_as(&c, node, "locker", "lockpw").await;
    let ok: String = cmd(&mut rs, &["SET", "lock:rs", "1", "NX", "PX", "30000"]).await;
    assert_eq!(ok, "OK");
    let script = redis::Script::new("return redis.call('GET', KEYS[1])");
    let v: String = within(
        "redis-rs script",
        STEP,
        script.key("lock:rs").invoke_async(&mut rs),
    )
    .await
    .expect("EVALSHA/EVAL as locker");
    assert_eq!(v, "1");

    // redis-cli --user/--pass.
    require("redis-cli", &["--version"]);
    {
        let mut cli = Command::new("redis-cli");
        cli.args(["-h", &c.ip(node), "-p", "7379", "--no-auth-warning"])
            .args(["--user", "locker", "--pass", "lockpw"]);
        let (ok, out, err) = run_bounded(
            cli,
            "SET lock:cli v\nGET lock:cli\nSET other v\nACL WHOAMI\n",
            Duration::from_secs(60),
        );
        assert!(ok, "redis-cli: {err}");
        // redis-cli prints an empty line after each error.
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            lines,
            ["OK", "v", NOPERM_KEY, &noperm("locker", "acl")],
            "{out}"
        );
        let mut cli = Command::new("redis-cli");
        cli.args(["-h", &c.ip(node), "-p", "7379", "--no-auth-warning"])
            .args(["--user", "disabled", "--pass", "pw", "PING"]);
        let (_, out, err) = run_bounded(cli, "", Duration::from_secs(60));
        assert!(
            format!("{out}{err}").contains("WRONGPASS"),
            "disabled user: {out} {err}"
        );
    }

    // redis-py's Lock as locker, RESP2 against the leader and RESP3 against a follower.
    require("python3", &["-c", "import redis"]);
    {
        for (proto, id) in [("2", leader), ("3", node)] {
            let mut py = Command::new("python3");
            py.args(["-c", REDIS_PY, &c.ip(id), "7379", proto]);
            let (ok, out, err) = run_bounded(py, "", Duration::from_secs(120));
            assert!(ok, "redis-py, protocol {proto}:\n{out}\n{err}");
            assert!(out.contains("redis-py acl ok"), "{out}");
        }
    }
    c.assert_alive();
}

/// An ACL file `fenced serve` must refuse, and what its error must say.
struct BadFile {
    name: &'static str,
    /// `None`: the file does not exist.
    text: Option<&'static str>,
    extra_args: &'static [&'static str],
    want: &'static [&'static str],
}

#[test]
fn bad_acl_files_stop_fenced_serve() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        BadFile {
            name: "rule.acl",
            text: Some("# users\nuser admin on >pw allkeys +@all\nuser w on >x %R~data:* +get\n"),
            extra_args: &[],
            want: &["line 3", "'%R~data:*'", "not supported"],
        },
        BadFile {
            name: "subcommand.acl",
            text: Some("user w on >x allkeys +client|kill\n"),
            extra_args: &[],
            want: &["line 1", "'+client|kill'"],
        },
        BadFile {
            name: "default.acl",
            text: Some("user default on >pw allkeys +@all\n"),
            extra_args: &["--requirepass", "other"],
            want: &["defines the 'default' user and --requirepass"],
        },
        BadFile {
            name: "missing.acl",
            text: None,
            extra_args: &[],
            want: &["cannot read ACL file"],
        },
    ];
    for BadFile {
        name,
        text,
        extra_args: extra,
        want,
    } in cases
    {
        let path = dir.path().join(name);
        if let Some(text) = text {
            std::fs::write(&path, text).expect("writing the ACL file");
        }
        let data = dir.path().join(format!("data-{name}"));
        let mut cmd = Command::new(support::bin());
        cmd.arg("serve")
            .args(["--id", "1", "--data-dir"])
            .arg(&data)
            .args(["--grpc-addr", "127.0.0.1:0", "--resp-addr", "127.0.0.1:0"])
            .arg("--acl-file")
            .arg(&path)
            .args(extra)
            .env_remove("FENCED_REQUIREPASS");
        let (ok, out, err) = run_bounded(cmd, "", Duration::from_secs(60));
        assert!(!ok, "{name}: fenced serve started:\n{out}\n{err}");
        for w in want {
            assert!(err.contains(w), "{name}: {w:?} not in:\n{err}");
        }
        assert!(
            err.contains(&path.display().to_string()),
            "{name}: the file is named:\n{err}"
        );
        assert!(
            !data.exists(),
            "{name}: refused before touching the data dir"
        );
    }
}
