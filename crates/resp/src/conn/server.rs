//! Connection, server and transaction commands the front end answers itself: `PING`,
//! `HELLO`, `AUTH`, `ACL`, `CLIENT`, `INFO`, `COMMAND`, `CONFIG`, `MULTI`/`EXEC`/`WATCH`,
//! `WAIT`/`WAITAOF`, `ROLE`, and the Redis server commands fenced refuses with its reason
//! (`SAVE`, `REPLICAOF`, `DEBUG`, …; docs/resp.md, "Differences from Redis").

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use fenced_core::kv::{
    command_table, lookup, CommandClass, CommandSpec, KeySpec, KvCommand, Reply,
};

use super::{backend_error, restricted, upper, Connection, Multi, NOAUTH, WRONGPASS};
use crate::acl::User;
use crate::frame::Proto;
use crate::info::FrontInfo;

impl Connection {
    /// Connection, server, transaction and pub/sub commands. `None`: the replies were
    /// written already (pub/sub confirmations).
    pub(super) async fn connection_cmd(&mut self, name: &str, a: &[Vec<u8>]) -> Option<Reply> {
        let st = &mut self.st;
        Some(match name {
            "PING" => {
                if st.subscribed() && st.proto == Proto::Resp2 {
                    Reply::Array(vec![
                        Reply::bulk("pong"),
                        Reply::bulk(a.first().cloned().unwrap_or_default()),
                    ])
                } else {
                    match a {
                        [] => Reply::Status("PONG".into()),
                        [m] => Reply::Bulk(m.clone()),
                        _ => Reply::err("ERR wrong number of arguments for 'ping' command"),
                    }
                }
            }
            "ECHO" => Reply::Bulk(a[0].clone()),
            "QUIT" => {
                st.closing = true;
                Reply::ok()
            }
            "RESET" => {
                st.multi = None;
                st.watches.clear();
                st.proto = Proto::Resp2;
                st.name = None;
                st.reply_off = false;
                st.skip = 0;
                st.user = self.shared.config.acl.initial_user();
                self.cleanup();
                Reply::Status("RESET".into())
            }
            "SELECT" => match a[0].as_slice() {
                b"0" => Reply::ok(),
                _ => Reply::err("ERR DB index is out of range"),
            },
            "AUTH" => self.auth(a),
            "ACL" => match &st.user {
                Some(me) => self.shared.config.acl.command(me, a),
                None => Reply::err(NOAUTH),
            },
            "HELLO" => self.hello(a),
            "CLIENT" => self.client_cmd(a),
            "INFO" => Reply::Bulk(self.info(a).into_bytes()),
            "WAIT" | "WAITAOF" => self.wait(name, a),
            "ROLE" => Reply::Array(vec![
                Reply::bulk("master"),
                Reply::Int(self.shared.backend.info().applied_index as i64),
                Reply::Array(vec![]),
            ]),
            "LASTSAVE" => Reply::Int(unix_secs() as i64),
            "CLUSTER" | "READONLY" | "READWRITE" => {
                Reply::err("ERR This instance has cluster support disabled")
            }

            "COMMAND" => command_cmd(a),
            "CONFIG" => config_cmd(a),
            "MULTI" => {
                if st.multi.is_some() {
                    Reply::err("ERR MULTI calls can not be nested")
                } else {
                    st.multi = Some(Multi {
                        cmds: Vec::new(),
                        dirty: false,
                    });
                    Reply::ok()
                }
            }
            "DISCARD" => match st.multi.take() {
                None => Reply::err("ERR DISCARD without MULTI"),
                Some(_) => {
                    st.watches.clear();
                    Reply::ok()
                }
            },
            "EXEC" => match st.multi.take() {
                None => Reply::err("ERR EXEC without MULTI"),
                Some(m) => {
                    let watches = std::mem::take(&mut self.st.watches);
                    if m.dirty {
                        Reply::err("EXECABORT Transaction discarded because of previous errors.")
                    } else {
                        let limits = self.limits_for(&m.cmds);
                        let cmd = restricted(
                            limits,
                            KvCommand::Multi {
                                watches,
                                cmds: m.cmds,
                            },
                        );
                        let rid = self.st.next_rid();
                        match self.shared.backend.write(rid, cmd).await {
                            Ok(mut r) if r.replies.len() == 1 => r.replies.remove(0),
                            Ok(_) => Reply::err("ERR internal: bad EXEC reply"),
                            Err(e) => backend_error(e),
                        }
                    }
                }
            },
            "WATCH" => {
                if st.multi.is_some() {
                    return Some(Reply::err("ERR WATCH inside MULTI is not allowed"));
                }
                let keys: Vec<Vec<u8>> = a.to_vec();
                let f = {
                    let keys = keys.clone();
                    Box::new(move |sm: &fenced_core::StateMachine, now| {
                        keys.iter()
                            .map(|k| Reply::Int(sm.kv().mod_revision(k, now) as i64))
                            .collect()
                    })
                };
                match self.shared.backend.read(f).await {
                    Ok(revs) => {
                        for (k, r) in keys.into_iter().zip(revs) {
                            if let Reply::Int(r) = r {
                                self.st.watches.push((k, r as u64));
                            }
                        }
                        Reply::ok()
                    }
                    Err(e) => backend_error(e),
                }
            }
            "UNWATCH" => {
                st.watches.clear();
                Reply::ok()
            }
            "SUBSCRIBE" | "PSUBSCRIBE" => {
                self.subscribe(name == "PSUBSCRIBE", a);
                return None;
            }
            "UNSUBSCRIBE" | "PUNSUBSCRIBE" => {
                self.unsubscribe(name == "PUNSUBSCRIBE", a);
                return None;
            }
            "MOVE" => match a[1].as_slice() {
                b"0" => Reply::err("ERR source and destination objects are the same"),
                _ => Reply::err("ERR DB index is out of range"),
            },
            "SWAPDB" => match (a[0].as_slice(), a[1].as_slice()) {
                (b"0", b"0") => Reply::ok(),
                _ => Reply::err("ERR DB index is out of range"),
            },
            "REPLICAOF" | "SLAVEOF"
                if a[0].eq_ignore_ascii_case(b"NO") && a[1].eq_ignore_ascii_case(b"ONE") =>
            {
                // Every member already takes writes (role:master): nothing to change.
                Reply::ok()
            }
            "MODULE" if a[0].eq_ignore_ascii_case(b"LIST") => Reply::Array(vec![]),
            other => match refusal(other) {
                Some(why) => Reply::err(why),
                None => Reply::err(format!(
                    "ERR unknown command '{}'",
                    other.to_ascii_lowercase()
                )),
            },
        })
    }

    /// `WAIT numreplicas timeout` / `WAITAOF numlocal numreplicas timeout`, answered at once:
    /// a write fenced acknowledged is already in the WAL, fsynced, of a majority of the
    /// voters, so at least majority − 1 members other than one holding it have it. `WAIT`
    /// answers that number; `WAITAOF` answers `[1, majority − 1]`, the fsynced copies a
    /// majority makes (fenced does not track whether this very member is among them).
    fn wait(&self, name: &str, a: &[Vec<u8>]) -> Reply {
        let (numbers, timeout) = a.split_at(a.len() - 1);
        for n in numbers {
            if let Err(e) = parse_i64(n) {
                return e;
            }
        }
        match parse_i64(&timeout[0]) {
            Err(_) => return Reply::err("ERR timeout is not an integer or out of range"),
            Ok(t) if t < 0 => return Reply::err("ERR timeout is negative"),
            Ok(_) => {}
        }
        let voters = self
            .shared
            .backend
            .info()
            .members
            .iter()
            .filter(|m| m.voter)
            .count()
            .max(1) as i64;
        let others = voters / 2; // majority − 1
        if name == "WAIT" {
            Reply::Int(others)
        } else {
            Reply::Array(vec![Reply::Int(1), Reply::Int(others)])
        }
    }

    /// `INFO [section …]`.
    fn info(&self, a: &[Vec<u8>]) -> String {
        let node = self.shared.backend.info();
        crate::info::render(a, &node, &self.front_info())
    }

    fn front_info(&self) -> FrontInfo {
        let sh = &self.shared;
        let stats = &sh.stats;
        let clients = sh.clients.all();
        let (channels, patterns) = sh.subs.counts();
        FrontInfo {
            process_id: std::process::id(),
            run_id: sh.run_id.clone(),
            tcp_port: self.local.map_or(sh.port, |l| l.port()),
            uptime_secs: stats.started.elapsed().as_secs(),
            server_time_usec: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            executable: std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            connected_clients: sh.live.load(Ordering::Relaxed) as u64,
            blocked_clients: stats.blocked.load(Ordering::Relaxed),
            pubsub_clients: clients.iter().filter(|c| c.is_type("pubsub")).count() as u64,
            maxclients: sh.config.max_connections as u64,
            total_connections_received: stats.connections_received.load(Ordering::Relaxed),
            total_commands_processed: stats.commands.load(Ordering::Relaxed),
            instantaneous_ops_per_sec: stats.ops_per_sec(),
            total_net_input_bytes: stats.net_in.load(Ordering::Relaxed),
            total_net_output_bytes: stats.net_out.load(Ordering::Relaxed),
            rejected_connections: stats.rejected_connections.load(Ordering::Relaxed),
            total_error_replies: stats.error_replies.load(Ordering::Relaxed),
            pubsub_channels: channels as u64,
            pubsub_patterns: patterns as u64,
        }
    }

    fn check_password(&self, user: &[u8], pass: &[u8]) -> Result<Arc<User>, Reply> {
        self.shared
            .config
            .acl
            .authenticate(user, pass)
            .ok_or_else(|| Reply::err(WRONGPASS))
    }

    fn auth(&mut self, a: &[Vec<u8>]) -> Reply {
        let r = match a {
            // Redis: the one-argument form is an error while `default` needs no password.
            [_] if self.shared.config.acl.default_is_nopass() => Err(Reply::err(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            )),
            [pass] => self.check_password(b"default", pass),
            [user, pass] => self.check_password(user, pass),
            _ => Err(Reply::err("ERR syntax error")),
        };
        match r {
            Ok(user) => {
                self.st.user = Some(user);
                Reply::ok()
            }
            Err(e) => e,
        }
    }

    fn hello(&mut self, a: &[Vec<u8>]) -> Reply {
        let mut proto = self.st.proto;
        let mut i = 0;
        if let Some(v) = a.first() {
            proto = match v.as_slice() {
                b"2" => Proto::Resp2,
                b"3" => Proto::Resp3,
                _ => {
                    return match std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                    {
                        Some(_) => Reply::err("NOPROTO unsupported protocol version"),
                        None => {
                            Reply::err("ERR Protocol version is not an integer or out of range")
                        }
                    }
                }
            };
            i = 1;
        }
        let mut name = None;
        while i < a.len() {
            if a[i].eq_ignore_ascii_case(b"AUTH") && i + 2 < a.len() {
                match self.check_password(&a[i + 1], &a[i + 2]) {
                    Ok(user) => self.st.user = Some(user),
                    Err(e) => return e,
                }
                i += 3;
            } else if a[i].eq_ignore_ascii_case(b"SETNAME") && i + 1 < a.len() {
                name = Some(a[i + 1].clone());
                i += 2;
            } else {
                return Reply::err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&a[i])
                ));
            }
        }
        if self.st.user.is_none() {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
        }
        self.st.proto = proto;
        if name.is_some() {
            self.st.name = name;
        }
        let s = |x: &str| Reply::bulk(x);
        Reply::Map(vec![
            (s("server"), s("redis")),
            (s("version"), s(crate::REDIS_VERSION)),
            (
                s("proto"),
                Reply::Int(if proto == Proto::Resp3 { 3 } else { 2 }),
            ),
            (s("id"), Reply::Int(self.st.id as i64)),
            (s("mode"), s("standalone")),
            (s("role"), s("master")),
            (s("modules"), Reply::Array(vec![])),
        ])
    }
}

fn command_info(c: &CommandSpec) -> Reply {
    let mut flags = match c.base_class() {
        CommandClass::Read => vec![Reply::Status("readonly".into())],
        CommandClass::Write | CommandClass::Lock | CommandClass::Blocking => {
            vec![Reply::Status("write".into())]
        }
        CommandClass::Connection => vec![Reply::Status("fast".into())],
    };
    let (first, last, step) = match c.keys {
        KeySpec::None | KeySpec::Whole => (0, 0, 0),
        KeySpec::Script | KeySpec::Counted(_) => {
            flags.push(Reply::Status("movablekeys".into()));
            (0, 0, 0)
        }
        KeySpec::First => (1, 1, 1),
        KeySpec::All => (1, -1, 1),
        KeySpec::EveryOther => (1, -1, 2),
        KeySpec::AllButLast => (1, -2, 1),
    };
    Reply::Array(vec![
        Reply::bulk(c.name.to_ascii_lowercase()),
        Reply::Int(c.arity as i64),
        Reply::Array(flags),
        Reply::Int(first),
        Reply::Int(last),
        Reply::Int(step),
    ])
}

fn command_cmd(a: &[Vec<u8>]) -> Reply {
    let table = command_table();
    match a.first().map(|s| upper(s)).as_deref() {
        None => Reply::Array(table.iter().map(|c| command_info(c)).collect()),
        Some("COUNT") => Reply::Int(table.len() as i64),
        Some("DOCS") => Reply::Map(vec![]),
        Some("INFO") => Reply::Array(
            a[1..]
                .iter()
                .map(|n| lookup(n).map_or(Reply::Nil, command_info))
                .collect(),
        ),
        Some("LIST") => Reply::Array(
            table
                .iter()
                .map(|c| Reply::bulk(c.name.to_ascii_lowercase()))
                .collect(),
        ),
        Some(other) => Reply::err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            other.to_ascii_lowercase()
        )),
    }
}

fn config_cmd(a: &[Vec<u8>]) -> Reply {
    const KNOWN: &[(&str, &str)] = &[
        ("save", ""),
        ("appendonly", "yes"),
        ("appendfsync", "always"),
        ("databases", "1"),
        ("maxmemory", "0"),
        ("maxmemory-policy", "noeviction"),
        ("timeout", "0"),
    ];
    match upper(&a[0]).as_str() {
        "GET" => {
            let mut out = Vec::new();
            for pat in &a[1..] {
                for (k, v) in KNOWN {
                    if fenced_core::kv::glob_match(&pat.to_ascii_lowercase(), k.as_bytes()) {
                        out.push((Reply::bulk(k), Reply::bulk(v)));
                    }
                }
            }
            Reply::Map(out)
        }
        "RESETSTAT" => Reply::ok(),
        _ => Reply::err("ERR CONFIG SET/REWRITE are not supported by fenced (configure with command-line flags)"),
    }
}

fn parse_i64(b: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| Reply::err(super::NOT_INT))
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why fenced refuses a Redis server command (the command table's rows for them are in
/// `fenced_core`'s `cmd/frontend.rs`); `None` for a name that is not one of them.
pub(super) fn refusal(name: &str) -> Option<&'static str> {
    Some(match name {
        "SAVE" => "ERR SAVE is not needed: every write is fsynced to a majority's WAL before it is acknowledged; for a backup use `fenced snapshot save`",
        "BGSAVE" => "ERR BGSAVE is not needed: every write is fsynced to a majority's WAL before it is acknowledged; for a backup use `fenced snapshot save`",
        "BGREWRITEAOF" => "ERR BGREWRITEAOF is not needed: fenced compacts its WAL into Raft snapshots by itself (--snapshot-logs)",
        "SHUTDOWN" => "ERR SHUTDOWN: stop the fenced process (SIGTERM); to move leadership first use `fenced leader step-down`",
        "REPLICAOF" | "SLAVEOF" => "ERR REPLICAOF: fenced replicates with Raft and every member takes writes; add members with `fenced member add`",
        "SYNC" | "PSYNC" => "ERR SYNC/PSYNC: fenced members replicate with Raft, not Redis's replication protocol; a new member joins with `fenced serve --join` after `fenced member add`",
        "FAILOVER" => "ERR FAILOVER: Raft elects the leader; to move leadership use `fenced leader step-down`",
        "MONITOR" => "ERR MONITOR is not supported by fenced: it would show only this node's connections, not the cluster's commands; use the Prometheus metrics (--metrics-addr) and the node's log",
        "DEBUG" => "ERR DEBUG is not supported by fenced: the state is replicated and must not be changed behind the log; inspect a stopped member with `fenced debug digest`",
        "MODULE" => "ERR MODULE: fenced cannot load Redis modules; its extensions (LOCK.*, FENCE.*, CL.THROTTLE, LIMIT.*) are built in",
        "MIGRATE" => "ERR MIGRATE: fenced does not move keys to other servers; every member of the cluster already holds every key",
        "OBJECT" => "ERR OBJECT: fenced keeps no Redis object encodings, reference counts or LRU/LFU data",
        "MEMORY" => "ERR MEMORY: fenced does not measure memory per key; INFO memory shows the process's",
        "LATENCY" => "ERR LATENCY: fenced keeps no latency monitor; command latencies are Prometheus histograms at --metrics-addr (/metrics)",
        "SLOWLOG" => "ERR SLOWLOG: fenced keeps no slow log; command latencies are Prometheus histograms at --metrics-addr (/metrics)",
        _ => return None,
    })
}
