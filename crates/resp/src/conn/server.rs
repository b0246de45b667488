//! Connection, server and transaction commands the front end answers itself: `PING`,
//! `HELLO`, `AUTH`, `ACL`, `CLIENT`, `INFO`, `COMMAND`, `CONFIG`, `MULTI`/`EXEC`/`WATCH`,
//! `WAIT`/`WAITAOF`, `ROLE`, and the Redis server commands fenced refuses with its reason
//! (`SAVE`, `REPLICAOF`, `DEBUG`, …; docs/resp.md, "Differences from Redis").

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fenced_core::kv::{
    command_table, lookup, CommandClass, CommandSpec, KeySpec, KvCommand, Reply,
};

use super::{backend_error, parse_u64, restricted, upper, Connection, Multi, NOAUTH, WRONGPASS};
use crate::acl::{Denied, User};
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

    /// `NOPERM` unless this connection's user is an administrator (`CLIENT KILL`, `LIST`,
    /// `UNBLOCK` act on other users' connections: Redis puts them in `@admin`).
    fn admin_only(&self, sub: &str) -> Result<(), Reply> {
        match &self.st.user {
            Some(u) if u.is_admin() => Ok(()),
            Some(u) => Err(Reply::Error(
                Denied::Command {
                    user: u.name().to_string(),
                    command: format!("client|{}", sub.to_ascii_lowercase()),
                }
                .resp_text(),
            )),
            None => Err(Reply::err(NOAUTH)),
        }
    }

    fn client_cmd(&mut self, a: &[Vec<u8>]) -> Reply {
        let sub = upper(&a[0]);
        let args = &a[1..];
        let wrong_arity = || {
            Reply::err(format!(
                "ERR wrong number of arguments for 'client|{}' command",
                sub.to_ascii_lowercase()
            ))
        };
        match (sub.as_str(), args) {
            ("ID", []) => Reply::Int(self.st.id as i64),
            ("SETNAME", [name]) => {
                if name.iter().any(|c| *c <= b' ' || *c > b'~') {
                    return Reply::err(
                        "ERR Client names cannot contain spaces, newlines or special characters.",
                    );
                }
                self.st.name = (!name.is_empty()).then(|| name.clone());
                Reply::ok()
            }
            ("GETNAME", []) => self.st.name.clone().map_or(Reply::Nil, Reply::Bulk),
            ("SETINFO", [attr, value]) => {
                let attr = String::from_utf8_lossy(attr).to_ascii_lowercase();
                if attr != "lib-name" && attr != "lib-ver" {
                    return Reply::err(format!("ERR Unrecognized option '{attr}'"));
                }
                if value.iter().any(|c| *c <= b' ' || *c > b'~') {
                    return Reply::err(format!(
                        "ERR {attr} cannot contain spaces, newlines or special characters."
                    ));
                }
                let value = String::from_utf8_lossy(value).into_owned();
                let mut m = self.client.meta();
                if attr == "lib-name" {
                    m.lib_name = value;
                } else {
                    m.lib_ver = value;
                }
                Reply::ok()
            }
            ("NO-EVICT" | "NO-TOUCH", [v])
                if v.eq_ignore_ascii_case(b"on") || v.eq_ignore_ascii_case(b"off") =>
            {
                // Nothing is evicted (maxmemory 0, noeviction) and no LRU/LFU is kept:
                // either setting changes nothing.
                Reply::ok()
            }
            ("REPLY", [v]) => match upper(v).as_str() {
                "ON" => {
                    self.st.reply_off = false;
                    self.st.skip = 0;
                    Reply::ok()
                }
                "OFF" => {
                    self.st.reply_off = true;
                    Reply::ok()
                }
                "SKIP" => {
                    if !self.st.reply_off {
                        // This command's reply and the next one's.
                        self.st.skip = 2;
                    }
                    Reply::ok()
                }
                _ => Reply::err("ERR syntax error"),
            },
            ("INFO", []) => {
                self.note_self("info");
                Reply::Bulk(format!("{}\n", self.client.line(Instant::now())).into_bytes())
            }
            ("LIST", _) => {
                if let Err(e) = self.admin_only("list") {
                    return e;
                }
                self.note_self("list");
                self.client_list(args)
            }
            ("KILL", [_, ..]) => {
                if let Err(e) = self.admin_only("kill") {
                    return e;
                }
                self.client_kill(args)
            }
            ("UNBLOCK", [id, rest @ ..]) if rest.len() <= 1 => {
                if let Err(e) = self.admin_only("unblock") {
                    return e;
                }
                let error = match rest.first().map(|m| upper(m)).as_deref() {
                    None | Some("TIMEOUT") => false,
                    Some("ERROR") => true,
                    Some(_) => {
                        return Reply::err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
                    }
                };
                let Ok(id) = parse_u64(id) else {
                    return Reply::err("ERR value is not an integer or out of range");
                };
                let done = self
                    .shared
                    .clients
                    .get(id)
                    .is_some_and(|c| c.unblock(error));
                Reply::Int(done as i64)
            }
            ("TRACKING", [v, ..]) if v.eq_ignore_ascii_case(b"off") => Reply::ok(),
            ("TRACKING", [_, ..]) => Reply::err(
                "ERR fenced does not support client-side caching (CLIENT TRACKING): it would \
                 need invalidation messages for every write applied anywhere in the cluster; \
                 read from the server (reads are linearizable) instead",
            ),
            ("CACHING", [_]) => Reply::err(
                "ERR CLIENT CACHING can be called only when the client is in tracking mode with \
                 OPTIN or OPTOUT mode enabled",
            ),
            ("GETREDIR", []) => Reply::Int(-1),
            ("TRACKINGINFO", []) => Reply::Map(vec![
                (Reply::bulk("flags"), Reply::Array(vec![Reply::bulk("off")])),
                (Reply::bulk("redirect"), Reply::Int(-1)),
                (Reply::bulk("prefixes"), Reply::Array(vec![])),
            ]),
            ("PAUSE", [_, ..]) => Reply::err(
                "ERR fenced does not support CLIENT PAUSE: it would pause only this node's \
                 clients while the other members go on taking writes; to move leadership use \
                 `fenced leader step-down`",
            ),
            // No client is ever paused.
            ("UNPAUSE", []) => Reply::ok(),
            ("HELP", []) => Reply::Array(CLIENT_HELP.iter().map(|l| Reply::bulk(*l)).collect()),
            (
                "ID" | "SETNAME" | "GETNAME" | "SETINFO" | "NO-EVICT" | "NO-TOUCH" | "REPLY"
                | "INFO" | "KILL" | "UNBLOCK" | "TRACKING" | "CACHING" | "GETREDIR"
                | "TRACKINGINFO" | "PAUSE" | "UNPAUSE" | "HELP",
                _,
            ) => wrong_arity(),
            _ => Reply::err(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(&a[0])
            )),
        }
    }

    /// Bring this connection's own registry entry up to date before showing it (the command
    /// being served is `client|list` / `client|info`, as Redis shows it).
    fn note_self(&self, sub: &str) {
        let mut m = self.client.meta();
        m.cmd = "CLIENT";
        m.cmd_sub = Some(sub.to_string());
        m.name = self.st.name.clone().unwrap_or_default();
        m.user = self
            .st
            .user
            .as_ref()
            .map_or(String::new(), |u| u.name().to_string());
        m.resp = if self.st.proto == Proto::Resp3 { 3 } else { 2 };
        m.last = Instant::now();
    }

    /// `CLIENT LIST [TYPE normal|master|replica|pubsub] [ID id …]`.
    fn client_list(&self, args: &[Vec<u8>]) -> Reply {
        let mut kind: Option<String> = None;
        let mut ids: Option<Vec<u64>> = None;
        let mut i = 0;
        while i < args.len() {
            let opt = upper(&args[i]);
            match opt.as_str() {
                "TYPE" if i + 1 < args.len() => {
                    let t = String::from_utf8_lossy(&args[i + 1]).to_ascii_lowercase();
                    if !matches!(
                        t.as_str(),
                        "normal" | "master" | "replica" | "slave" | "pubsub"
                    ) {
                        return Reply::err(format!("ERR Unknown client type '{t}'"));
                    }
                    kind = Some(t);
                    i += 2;
                }
                "ID" if i + 1 < args.len() => {
                    let mut list = Vec::new();
                    for a in &args[i + 1..] {
                        match parse_u64(a) {
                            Ok(id) if id > 0 => list.push(id),
                            _ => return Reply::err("ERR Invalid client ID"),
                        }
                    }
                    ids = Some(list);
                    i = args.len();
                }
                _ => return Reply::err("ERR syntax error"),
            }
        }
        let now = Instant::now();
        let mut out = String::new();
        for c in self.shared.clients.all() {
            if kind.as_deref().is_some_and(|k| !c.is_type(k)) {
                continue;
            }
            if ids.as_ref().is_some_and(|ids| !ids.contains(&c.id)) {
                continue;
            }
            out.push_str(&c.line(now));
            out.push('\n');
        }
        Reply::Bulk(out.into_bytes())
    }

    /// `CLIENT KILL addr:port` (old form: `OK` or an error) or `CLIENT KILL <filter value>
    /// …` (the number of connections closed) with Redis 7.2's filters `ID`, `TYPE`, `USER`,
    /// `ADDR`, `LADDR`, `SKIPME`, `MAXAGE`. A closed connection gets no reply to a command
    /// it is running and its socket is closed.
    fn client_kill(&self, args: &[Vec<u8>]) -> Reply {
        let me = self.st.id;
        if let [addr] = args {
            let addr = String::from_utf8_lossy(addr);
            return match self
                .shared
                .clients
                .all()
                .into_iter()
                .find(|c| c.addr.to_string() == addr)
            {
                Some(c) => {
                    c.kill();
                    Reply::ok()
                }
                None => Reply::err("ERR No such client"),
            };
        }
        if !args.len().is_multiple_of(2) {
            return Reply::err("ERR syntax error");
        }
        let mut id = None;
        let mut kind = None;
        let mut user = None;
        let mut addr = None;
        let mut laddr = None;
        let mut skipme = true;
        let mut maxage = None;
        for pair in args.chunks(2) {
            let v = &pair[1];
            let text = String::from_utf8_lossy(v).into_owned();
            match upper(&pair[0]).as_str() {
                "ID" => match parse_u64(v) {
                    Ok(n) if n > 0 => id = Some(n),
                    _ => return Reply::err("ERR client-id should be greater than 0"),
                },
                "TYPE" => {
                    let t = text.to_ascii_lowercase();
                    if !matches!(
                        t.as_str(),
                        "normal" | "master" | "replica" | "slave" | "pubsub"
                    ) {
                        return Reply::err(format!("ERR Unknown client type '{t}'"));
                    }
                    kind = Some(t);
                }
                "USER" => {
                    if self.shared.config.acl.user(&text).is_none() {
                        return Reply::err(format!("ERR No such user '{text}'"));
                    }
                    user = Some(text);
                }
                "ADDR" => addr = Some(text),
                "LADDR" => laddr = Some(text),
                "SKIPME" => match text.to_ascii_lowercase().as_str() {
                    "yes" => skipme = true,
                    "no" => skipme = false,
                    _ => return Reply::err("ERR syntax error"),
                },
                "MAXAGE" => match parse_u64(v) {
                    Ok(n) => maxage = Some(n),
                    Err(e) => return e,
                },
                _ => return Reply::err("ERR syntax error"),
            }
        }
        let now = Instant::now();
        let mut killed = 0;
        for c in self.shared.clients.all() {
            let matches = id.is_none_or(|id| c.id == id)
                && kind.as_deref().is_none_or(|k| c.is_type(k))
                && user.as_deref().is_none_or(|u| c.meta().user == u)
                && addr.as_deref().is_none_or(|a| c.addr.to_string() == a)
                && laddr
                    .as_deref()
                    .is_none_or(|a| c.laddr.is_some_and(|l| l.to_string() == a))
                && maxage.is_none_or(|m| now.saturating_duration_since(c.created).as_secs() >= m)
                && !(skipme && c.id == me);
            if matches {
                c.kill();
                killed += 1;
            }
        }
        Reply::Int(killed)
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

const CLIENT_HELP: &[&str] = &[
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CACHING (YES|NO)",
    "    Refused: fenced has no client-side caching.",
    "GETNAME",
    "    Return the name of the current connection.",
    "GETREDIR",
    "    Return -1: fenced has no client-side caching.",
    "ID",
    "    Return the ID of the current connection.",
    "INFO",
    "    Return information about the current client connection.",
    "KILL <ip:port>",
    "    Kill connection made from <ip:port>.",
    "KILL <option> <value> [<option> <value> [...]]",
    "    Kill connections. Options are: ID <client-id>, TYPE (NORMAL|PUBSUB), USER <username>,",
    "    ADDR <ip:port>, LADDR <ip:port>, SKIPME (YES|NO), MAXAGE <maxage>.",
    "LIST [options ...]",
    "    Return information about this node's client connections. Options:",
    "    TYPE (NORMAL|MASTER|REPLICA|PUBSUB), ID <client-id> [...].",
    "UNPAUSE",
    "    OK: fenced never pauses clients (CLIENT PAUSE is refused).",
    "REPLY (ON|OFF|SKIP)",
    "    Control the replies sent to the current connection.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "SETINFO <option> <value>",
    "    Set client meta attr. Options are: LIB-NAME, LIB-VER.",
    "UNBLOCK <clientid> [TIMEOUT|ERROR]",
    "    Unblock the specified blocked client (BLPOP/BRPOP).",
    "TRACKING (ON|OFF)",
    "    ON is refused: fenced has no client-side caching.",
    "TRACKINGINFO",
    "    Report tracking status: always off.",
    "NO-EVICT (ON|OFF)",
    "    Accepted: fenced never evicts keys.",
    "NO-TOUCH (ON|OFF)",
    "    Accepted: fenced keeps no LRU/LFU data.",
    "HELP",
    "    Print this help.",
];
