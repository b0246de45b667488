//! Client tooling over RESP on a 3-node cluster of real `fenced` processes: `INFO` (every
//! section, through redis-rs and redis-py), `CLIENT REPLY OFF|ON|SKIP` on a raw pipelined
//! socket, `CLIENT LIST/KILL/UNBLOCK` across connections, `WAIT`/`WAITAOF`, `ROLE`, and the
//! server commands fenced refuses with its reason. A missing python3/redis-py fails the test.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use redis::Value;
use support::{
    follower_of, require, resp_cmd as cmd, resp_cmd_err as cmd_err, resp_connect as connect,
    run_bounded, within, TestCluster, LEADER_TIMEOUT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const STEP: Duration = Duration::from_secs(20);

/// `INFO`'s text as (section title → fields).
fn parse_info(s: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for line in s.split("\r\n") {
        if let Some(t) = line.strip_prefix("# ") {
            section = t.to_string();
            out.entry(section.clone()).or_default();
        } else if let Some((k, v)) = line.split_once(':') {
            out.entry(section.clone())
                .or_default()
                .insert(k.to_string(), v.to_string());
        } else {
            assert!(line.is_empty(), "not an INFO line: {line:?}");
        }
    }
    out
}

/// A raw RESP connection: what is sent and exactly what comes back.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn open(addr: &str) -> Raw {
        let s = within("raw connect", STEP, TcpStream::connect(addr))
            .await
            .expect("raw connect");
        Raw { s, buf: Vec::new() }
    }

    async fn send(&mut self, cmds: &[&[&str]]) {
        let mut out = Vec::new();
        for c in cmds {
            out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
            for a in *c {
                out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        self.s.write_all(&out).await.expect("raw write");
    }

    /// Read until the bytes received end with `end` (bounded in time); returns them all.
    async fn read_until(&mut self, end: &str) -> String {
        let deadline = Instant::now() + STEP;
        while !self.buf.ends_with(end.as_bytes()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(left, self.s.read(&mut chunk)).await {
                Ok(Ok(0)) => panic!(
                    "connection closed; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => panic!("raw read: {e}"),
                Err(_) => panic!(
                    "no {end:?} within {STEP:?}; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
        String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned()
    }

    /// Read until `n` lines (CRLFs) arrived; returns them all.
    async fn read_lines(&mut self, n: usize) -> String {
        let deadline = Instant::now() + STEP;
        while self.buf.windows(2).filter(|w| w == b"\r\n").count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(left, self.s.read(&mut chunk)).await {
                Ok(Ok(0)) => panic!(
                    "connection closed; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
                Ok(Ok(k)) => self.buf.extend_from_slice(&chunk[..k]),
                Ok(Err(e)) => panic!("raw read: {e}"),
                Err(_) => panic!(
                    "no {n} lines within {STEP:?}; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
        String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned()
    }

    /// Whether the server closed the connection within `limit` (reading and dropping
    /// anything it sends first).
    async fn closed_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(left, self.s.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_through_redis_rs_and_redis_py() {
    require("python3", &["-c", "import redis"]);
    let c = TestCluster::start("resp_tooling_info", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);
    let mut lead = connect(&c, leader).await;
    for i in 0..5 {
        let _: String = cmd(&mut lead, &["SET", &format!("k{i}"), "v"]).await;
    }
    let _: String = cmd(&mut lead, &["SET", "ttl", "v", "EX", "600"]).await;
    let mut con = connect(&c, follower).await;

    // The follower's keyspace is its applied state: wait (bounded) until it has all six.
    let start = Instant::now();
    let info = loop {
        let text: String = cmd(&mut con, &["INFO", "everything"]).await;
        let info = parse_info(&text);
        if info["Keyspace"].get("db0").map(String::as_str) == Some("keys=6,expires=1,avg_ttl=0") {
            break info;
        }
        assert!(
            start.elapsed() < STEP,
            "keyspace never showed 6 keys: {:?}",
            info["Keyspace"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let titles: Vec<&str> = info.keys().map(String::as_str).collect();
    for t in [
        "Server",
        "Clients",
        "Memory",
        "Persistence",
        "Stats",
        "Replication",
        "CPU",
        "Cluster",
        "Keyspace",
        "Fenced",
    ] {
        assert!(
            titles.contains(&t),
            "INFO everything lacks # {t}: {titles:?}"
        );
    }
    let field = |s: &str, k: &str| -> String {
        info[s]
            .get(k)
            .unwrap_or_else(|| panic!("# {s} lacks {k}: {:?}", info[s]))
            .clone()
    };
    let num = |s: &str, k: &str| -> u64 {
        field(s, k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}:{} is not a number", field(s, k)))
    };
    // Server.
    assert_eq!(field("Server", "redis_mode"), "standalone");
    assert_eq!(num("Server", "arch_bits"), 64);
    assert!(num("Server", "process_id") > 0);
    assert_eq!(field("Server", "run_id").len(), 40);
    assert_eq!(num("Server", "tcp_port"), 7379);
    assert!(field("Server", "os").starts_with("Linux"));
    assert!(field("Server", "executable").ends_with("fenced"));
    let up = num("Server", "uptime_in_seconds");
    assert_eq!(num("Server", "uptime_in_days"), up / 86_400);
    let _ = field("Server", "config_file");
    let _ = field("Server", "redis_version");
    // Clients.
    assert!(num("Clients", "connected_clients") >= 1);
    assert_eq!(num("Clients", "blocked_clients"), 0);
    assert_eq!(num("Clients", "pubsub_clients"), 0);
    assert_eq!(num("Clients", "maxclients"), 10_000);
    // Memory.
    assert!(num("Memory", "used_memory") > 1 << 20);
    assert!(num("Memory", "used_memory_rss") > 1 << 20);
    assert!(field("Memory", "used_memory_human").ends_with('M'));
    assert_eq!(num("Memory", "maxmemory"), 0);
    assert_eq!(field("Memory", "maxmemory_policy"), "noeviction");
    assert_eq!(field("Memory", "mem_allocator"), "mimalloc");
    // Persistence.
    assert_eq!(num("Persistence", "loading"), 0);
    assert_eq!(num("Persistence", "aof_enabled"), 1);
    assert_eq!(num("Persistence", "rdb_changes_since_last_save"), 0);
    assert_eq!(num("Persistence", "fenced_wal_enabled"), 1);
    assert_eq!(field("Persistence", "fenced_wal_fsync"), "always");
    // Stats.
    assert!(num("Stats", "total_connections_received") >= 1);
    assert!(num("Stats", "total_commands_processed") >= 1);
    let _ = num("Stats", "instantaneous_ops_per_sec");
    assert_eq!(num("Stats", "rejected_connections"), 0);
    // Replication: master on a follower too.
    assert_eq!(field("Replication", "role"), "master");
    assert_eq!(num("Replication", "connected_slaves"), 0);
    assert_eq!(field("Replication", "master_replid").len(), 40);
    // CPU, Cluster.
    assert!(field("CPU", "used_cpu_user").parse::<f64>().is_ok());
    assert!(field("CPU", "used_cpu_sys").parse::<f64>().is_ok());
    assert_eq!(num("Cluster", "cluster_enabled"), 0);
    // Fenced.
    assert_eq!(field("Fenced", "fenced_role"), "follower");
    assert_eq!(num("Fenced", "fenced_node_id"), follower);
    assert_eq!(num("Fenced", "fenced_leader_id"), leader);
    assert!(num("Fenced", "fenced_term") >= 1);
    assert!(num("Fenced", "fenced_applied_index") >= 6);
    assert_eq!(num("Fenced", "fenced_members"), 3);
    assert_eq!(num("Fenced", "fenced_voters"), 3);
    for id in c.ids() {
        assert!(
            field("Fenced", &format!("fenced_member_{id}")).ends_with(",voter=1"),
            "{:?}",
            info["Fenced"]
        );
    }
    // The same cluster id as `fenced status` prints (16 hex digits).
    let status = c.status_ok(follower).await;
    assert_eq!(
        field("Fenced", "fenced_cluster_id"),
        format!("{:016x}", status.cluster_id)
    );
    // The leader says leader in # Fenced and master in # Replication too.
    let lead_info = parse_info(&cmd::<String>(&mut lead, &["INFO", "replication", "FENCED"]).await);
    assert_eq!(
        lead_info.keys().collect::<Vec<_>>(),
        ["Fenced", "Replication"]
    );
    assert_eq!(lead_info["Replication"]["role"], "master");
    assert_eq!(lead_info["Fenced"]["fenced_role"], "leader");

    // Section selection.
    let server = parse_info(&cmd::<String>(&mut con, &["INFO", "server"]).await);
    assert_eq!(server.keys().collect::<Vec<_>>(), ["Server"]);
    let ks: String = cmd(&mut con, &["INFO", "KEYSPACE"]).await;
    assert_eq!(ks, "# Keyspace\r\ndb0:keys=6,expires=1,avg_ttl=0\r\n");
    let none: String = cmd(&mut con, &["INFO", "nosuch"]).await;
    assert_eq!(none, "");
    let default = parse_info(&cmd::<String>(&mut con, &["INFO"]).await);
    assert_eq!(
        default.keys().collect::<Vec<_>>(),
        info.keys().collect::<Vec<_>>()
    );
    let all = parse_info(&cmd::<String>(&mut con, &["INFO", "all"]).await);
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        info.keys().collect::<Vec<_>>()
    );

    // redis-py reads the same, in both protocols.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/resp/redis_py_info.py"
    );
    for proto in ["2", "3"] {
        let mut py = Command::new("python3");
        py.args([script, &c.ip(follower), "7379", proto, "6"]);
        let (ok, out, err) = run_bounded(py, "", Duration::from_secs(60));
        assert!(ok, "redis-py INFO, protocol {proto}:\n{out}\n{err}");
        assert!(out.contains("redis-py info ok"), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reply_off_on_skip_on_a_raw_pipeline() {
    let c = TestCluster::start("resp_tooling_reply", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let addr = c.resp_addr(follower_of(leader));
    let mut raw = Raw::open(&addr).await;
    // One pipeline: only CLIENT REPLY ON's reply, PING x's, and the reply after the skipped
    // one arrive.
    raw.send(&[
        &["CLIENT", "REPLY", "OFF"],
        &["PING"],
        &["SET", "quiet", "1"],
        &["GET", "quiet"],
        &["NOSUCH"],
        &["CLIENT", "REPLY", "ON"],
        &["PING", "x"],
        &["CLIENT", "REPLY", "SKIP"],
        &["ECHO", "skipped"],
        &["ECHO", "shown"],
        &["GET", "quiet"],
    ])
    .await;
    let got = raw.read_until("$1\r\n1\r\n").await;
    assert_eq!(got, "+OK\r\n$1\r\nx\r\n$5\r\nshown\r\n$1\r\n1\r\n");
    // SKIP then ON: ON's own reply is sent (it clears the skip).
    raw.send(&[
        &["CLIENT", "REPLY", "SKIP"],
        &["CLIENT", "REPLY", "ON"],
        &["ECHO", "end"],
    ])
    .await;
    assert_eq!(
        raw.read_until("$3\r\nend\r\n").await,
        "+OK\r\n$3\r\nend\r\n"
    );
    // Syntax errors are answered.
    raw.send(&[&["CLIENT", "REPLY", "MAYBE"]]).await;
    assert_eq!(raw.read_until("\r\n").await, "-ERR syntax error\r\n");

    // Pub/sub pushes are not silenced (Redis 7.2): with replies off, the subscribe
    // confirmation and published messages still arrive; PING's reply does not.
    let mut sub = Raw::open(&addr).await;
    sub.send(&[&["CLIENT", "REPLY", "OFF"], &["SUBSCRIBE", "news"]])
        .await;
    let conf = sub.read_until(":1\r\n").await;
    assert_eq!(conf, "*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n");
    sub.send(&[&["PING"]]).await;
    let mut con = connect(&c, leader).await;
    // The subscription is on the follower; a PUBLISH anywhere reaches it.
    let _: i64 = cmd(&mut con, &["PUBLISH", "news", "hello"]).await;
    let msg = sub.read_until("$5\r\nhello\r\n").await;
    assert_eq!(msg, "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_kill_and_unblock_across_connections() {
    let c = TestCluster::start("resp_tooling_clients", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let addr = c.resp_addr(node);
    let mut a = Raw::open(&addr).await;
    a.send(&[
        &["CLIENT", "SETNAME", "worker-a"],
        &["CLIENT", "SETINFO", "LIB-NAME", "rawlib"],
        &["CLIENT", "SETINFO", "LIB-VER", "1.2"],
        &["CLIENT", "ID"],
    ])
    .await;
    let got = a.read_lines(4).await;
    let a_id: u64 = got
        .trim_end()
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("CLIENT ID: {got:?}"));
    assert!(got.starts_with("+OK\r\n+OK\r\n+OK\r\n:"), "{got:?}");

    let mut b = connect(&c, node).await;
    let list: String = cmd(&mut b, &["CLIENT", "LIST"]).await;
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("id={a_id} ")))
        .unwrap_or_else(|| panic!("A is not in CLIENT LIST:\n{list}"));
    for part in [
        "name=worker-a",
        "lib-name=rawlib",
        "lib-ver=1.2",
        "user=default",
        "resp=2",
        "cmd=client|id",
        "flags=N",
        "db=0",
    ] {
        assert!(line.split(' ').any(|p| p == part), "{part} not in {line}");
    }
    assert!(line.contains(" addr=127.") && line.contains(&format!(" laddr={addr} ")));
    // B is listed too, and CLIENT LIST ID filters.
    let b_id: i64 = cmd(&mut b, &["CLIENT", "ID"]).await;
    let only_b: String = cmd(&mut b, &["CLIENT", "LIST", "ID", &b_id.to_string()]).await;
    assert_eq!(only_b.lines().count(), 1, "{only_b}");
    assert!(only_b.contains("cmd=client|list"), "{only_b}");
    let info_b: String = cmd(&mut b, &["CLIENT", "INFO"]).await;
    assert!(info_b.starts_with(&format!("id={b_id} ")), "{info_b}");

    // CLIENT UNBLOCK wakes A's BLPOP with an error.
    a.send(&[&["BLPOP", "nothing", "30"]]).await;
    let start = Instant::now();
    loop {
        let n: i64 = cmd(&mut b, &["CLIENT", "UNBLOCK", &a_id.to_string(), "ERROR"]).await;
        if n == 1 {
            break;
        }
        assert!(start.elapsed() < STEP, "A never blocked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        a.read_until("\r\n").await,
        "-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"
    );
    let n: i64 = cmd(&mut b, &["CLIENT", "UNBLOCK", &a_id.to_string()]).await;
    assert_eq!(n, 0, "A is not blocked any more");

    // CLIENT KILL ID closes A's connection.
    let n: i64 = cmd(&mut b, &["CLIENT", "KILL", "ID", &a_id.to_string()]).await;
    assert_eq!(n, 1);
    assert!(
        a.closed_within(STEP).await,
        "A's connection stayed open after CLIENT KILL"
    );
    let list: String = cmd(&mut b, &["CLIENT", "LIST"]).await;
    assert!(!list.contains(&format!("id={a_id} ")), "{list}");
    let n: i64 = cmd(&mut b, &["CLIENT", "KILL", "ID", &a_id.to_string()]).await;
    assert_eq!(n, 0);

    // Old form: CLIENT KILL addr:port.
    let mut d = Raw::open(&addr).await;
    let d_addr = d.s.local_addr().expect("local addr").to_string();
    d.send(&[&["PING"]]).await;
    assert_eq!(d.read_until("\r\n").await, "+PONG\r\n");
    let ok: String = cmd(&mut b, &["CLIENT", "KILL", &d_addr]).await;
    assert_eq!(ok, "OK");
    assert!(d.closed_within(STEP).await);
    let e = cmd_err(&mut b, &["CLIENT", "KILL", &d_addr]).await;
    assert!(e.contains("No such client"), "{e}");

    // USER filter, skipping the caller: kills the other default-user connection E only.
    let mut e_con = Raw::open(&addr).await;
    e_con.send(&[&["PING"]]).await;
    assert_eq!(e_con.read_until("\r\n").await, "+PONG\r\n");
    let n: i64 = cmd(
        &mut b,
        &["CLIENT", "KILL", "USER", "default", "SKIPME", "yes"],
    )
    .await;
    assert!(n >= 1, "{n}");
    assert!(e_con.closed_within(STEP).await);
    let pong: String = cmd(&mut b, &["PING"]).await;
    assert_eq!(pong, "PONG", "SKIPME yes spared the caller");

    // The other CLIENT subcommands answer as Redis does or say why not.
    assert_eq!(cmd::<i64>(&mut b, &["CLIENT", "GETREDIR"]).await, -1);
    assert_eq!(cmd::<String>(&mut b, &["CLIENT", "UNPAUSE"]).await, "OK");
    assert_eq!(
        cmd::<String>(&mut b, &["CLIENT", "NO-EVICT", "on"]).await,
        "OK"
    );
    assert_eq!(
        cmd::<String>(&mut b, &["CLIENT", "NO-TOUCH", "off"]).await,
        "OK"
    );
    assert_eq!(
        cmd::<String>(&mut b, &["CLIENT", "TRACKING", "off"]).await,
        "OK"
    );
    let help: Vec<String> = cmd(&mut b, &["CLIENT", "HELP"]).await;
    assert!(help.iter().any(|l| l.starts_with("KILL")), "{help:?}");
    let e = cmd_err(&mut b, &["CLIENT", "TRACKING", "on"]).await;
    assert!(
        e.contains("fenced does not support client-side caching (CLIENT TRACKING)"),
        "{e}"
    );
    let e = cmd_err(&mut b, &["CLIENT", "PAUSE", "100"]).await;
    assert!(e.contains("CLIENT PAUSE") && e.contains("step-down"), "{e}");
    let e = cmd_err(&mut b, &["CLIENT", "CACHING", "yes"]).await;
    assert!(e.contains("tracking mode"), "{e}");
    let e = cmd_err(&mut b, &["CLIENT", "SETINFO", "LIB-NAME", "a b"]).await;
    assert!(e.contains("cannot contain spaces"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_role_and_refusals_that_name_their_reason() {
    let c = TestCluster::start("resp_tooling_refusals", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let mut con = connect(&c, follower_of(leader)).await;
    let _: String = cmd(&mut con, &["SET", "w", "1"]).await;
    // Acknowledged = on a majority (2 of 3): one other member has it, at once.
    let start = Instant::now();
    assert_eq!(cmd::<i64>(&mut con, &["WAIT", "2", "5000"]).await, 1);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "WAIT did not answer at once"
    );
    assert_eq!(
        cmd::<Vec<i64>>(&mut con, &["WAITAOF", "1", "1", "0"]).await,
        [1, 1]
    );
    let e = cmd_err(&mut con, &["WAIT", "1", "-1"]).await;
    assert!(e.contains("timeout is negative"), "{e}");
    let role: Vec<Value> = cmd(&mut con, &["ROLE"]).await;
    assert_eq!(role.first(), Some(&Value::BulkString(b"master".to_vec())));
    let last: i64 = cmd(&mut con, &["LASTSAVE"]).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!((now - last).abs() < 60, "LASTSAVE {last}, now {now}");
    let modules: Vec<Value> = cmd(&mut con, &["MODULE", "LIST"]).await;
    assert!(modules.is_empty());
    assert_eq!(
        cmd::<String>(&mut con, &["REPLICAOF", "NO", "ONE"]).await,
        "OK"
    );
    let e = cmd_err(&mut con, &["CLUSTER", "INFO"]).await;
    assert!(e.contains("cluster support disabled"), "{e}");

    for (args, why) in [
        (&["SAVE"][..], "fsynced to a majority's WAL"),
        (&["BGSAVE"], "fenced snapshot save"),
        (&["BGREWRITEAOF"], "--snapshot-logs"),
        (&["SHUTDOWN", "NOSAVE"], "SIGTERM"),
        (&["REPLICAOF", "10.0.0.1", "6379"], "fenced member add"),
        (&["SLAVEOF", "10.0.0.1", "6379"], "fenced member add"),
        (&["SYNC"], "Raft"),
        (&["PSYNC", "?", "-1"], "Raft"),
        (&["FAILOVER"], "fenced leader step-down"),
        (&["MONITOR"], "metrics"),
        (&["DEBUG", "SLEEP", "0"], "fenced debug digest"),
        (&["MODULE", "LOAD", "/x.so"], "built in"),
        (&["MIGRATE", "h", "1", "k", "0", "10"], "every member"),
        (&["OBJECT", "ENCODING", "w"], "object encodings"),
        (&["MEMORY", "USAGE", "w"], "INFO memory"),
        (&["LATENCY", "LATEST"], "/metrics"),
        (&["SLOWLOG", "GET"], "/metrics"),
    ] {
        let e = cmd_err(&mut con, args).await;
        assert!(e.contains(why), "{args:?}: {e}");
        assert!(!e.contains("unknown command"), "{args:?}: {e}");
        // Known to the command table, so ACLs and COMMAND INFO see it.
        let info: Vec<Value> = cmd(&mut con, &["COMMAND", "INFO", args[0]]).await;
        assert_ne!(info.first(), Some(&Value::Nil), "{}", args[0]);
    }
}
