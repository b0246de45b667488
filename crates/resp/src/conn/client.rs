//! `CLIENT` and its subcommands: this connection's name, reply mode and library, and this
//! node's registry of connections (`LIST`, `KILL`, `UNBLOCK`, administrators only).

use std::time::Instant;

use fenced_core::kv::Reply;

use super::{parse_u64, upper, Connection, NOAUTH};
use crate::acl::Denied;
use crate::frame::Proto;

impl Connection {
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

    pub(super) fn client_cmd(&mut self, a: &[Vec<u8>]) -> Reply {
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
