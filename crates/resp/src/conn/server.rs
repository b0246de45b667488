//! Connection, server and transaction commands the front end answers itself: `PING`,
//! `HELLO`, `AUTH`, `ACL`, `CLIENT`, `INFO`, `COMMAND`, `CONFIG`, `MULTI`/`EXEC`/`WATCH`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fenced_core::kv::{
    command_table, lookup, CommandClass, CommandSpec, KeySpec, KvCommand, Reply,
};

use super::{backend_error, restricted, upper, Connection, Multi, NOAUTH, WRONGPASS};
use crate::acl::User;
use crate::frame::Proto;

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
            "INFO" => Reply::Bulk(self.info().into_bytes()),
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
            other => Reply::err(format!(
                "ERR unknown command '{}'",
                other.to_ascii_lowercase()
            )),
        })
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
            (s("version"), s("7.2.0")),
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

    fn client_line(&self) -> String {
        format!(
            "id={} addr={} laddr={} fd=0 name={} db=0 user={} resp={} lib-name= lib-ver=\n",
            self.st.id,
            self.peer,
            self.local.map(|a| a.to_string()).unwrap_or_default(),
            String::from_utf8_lossy(self.st.name.as_deref().unwrap_or_default()),
            self.st.user.as_ref().map_or("default", |u| u.name()),
            if self.st.proto == Proto::Resp3 { 3 } else { 2 },
        )
    }

    fn client_cmd(&mut self, a: &[Vec<u8>]) -> Reply {
        match upper(&a[0]).as_str() {
            "ID" => Reply::Int(self.st.id as i64),
            "SETNAME" if a.len() == 2 => {
                if a[1].iter().any(|c| *c <= b' ') {
                    return Reply::err(
                        "ERR Client names cannot contain spaces, newlines or special characters.",
                    );
                }
                self.st.name = (!a[1].is_empty()).then(|| a[1].clone());
                Reply::ok()
            }
            "GETNAME" => self.st.name.clone().map_or(Reply::Nil, Reply::Bulk),
            "SETINFO" | "NO-EVICT" | "NO-TOUCH" | "REPLY" => Reply::ok(),
            "INFO" => Reply::Bulk(self.client_line().into_bytes()),
            "LIST" => Reply::Bulk(self.client_line().into_bytes()),
            _ => Reply::err(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(&a[0])
            )),
        }
    }

    fn info(&self) -> String {
        let mut s = String::from(
            "# Server\r\nredis_version:7.2.0\r\nredis_mode:standalone\r\nfenced:1\r\n",
        );
        for (k, v) in self.shared.backend.info() {
            s.push_str(&format!("{k}:{v}\r\n"));
        }
        s.push_str("\r\n# Clients\r\n");
        s.push_str(&format!(
            "connected_clients:{}\r\n",
            self.shared.live.load(Ordering::Relaxed)
        ));
        s.push_str("\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
        s.push_str("\r\n# Keyspace\r\n");
        s
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
        ("appendonly", "no"),
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
