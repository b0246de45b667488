//! Redis-style ACL users of the RESP front end (`fenced serve --acl-file`).
//!
//! * [`Acl::load`] reads Redis's aclfile format: one `user <name> <rule> …` per line, blank
//!   lines and `#` comments, arguments split like Redis does (`"…"`/`'…'` quoting). Rules are
//!   applied left to right with Redis's semantics; unsupported ones (`%R~`, `+cmd|sub`,
//!   selectors, …) are startup errors naming the file, the line and the rule.
//! * The `default` user is the file's, or `on nopass ~* &* +@all` (with `--requirepass P`:
//!   `on >P ~* &* +@all`, the behaviour without an ACL file). A file that defines `default`
//!   together with `--requirepass` is refused as ambiguous.
//! * Passwords are kept as SHA-256 digests and compared in constant time.
//! * Command categories are the core command table's: each row lists its own
//!   ([`fenced_core::kv::CommandSpec::acl`]); [`category_commands`] reads them.
//! * [`User::permit`] is **the** permission check of every port: may this user run this
//!   command (a row of the core command table) on these keys? The RESP front end calls it
//!   through [`User::check`] (a command's keys are [`fenced_core::kv::command_keys`], so
//!   `LOCK.*`'s key is the lock name); the gRPC API calls it with the command its call
//!   stands for (`Lock.Acquire` is `LOCK.ACQUIRE` on the lock names, `Kv.FencedPut` is
//!   `FENCE.SET` on the key; `crates/server/src/users.rs`). So a user's `~pattern`s limit lock
//!   names and keys alike, over both protocols. Refusals are [`Denied`]: Redis's exact `NOPERM`
//!   text for RESP ([`Denied::resp_text`]), the user, command and key for gRPC (`Display`).
//! * [`User::is_admin`]: a user whose rules allow `CONFIG` and `ACL` (`+@all` or `+@admin`
//!   do) is an administrator — what membership changes and force-unlock need over gRPC
//!   ([`User::require_admin`]).
//! * Writes of restricted users are also sent as
//!   [`KvCommand::Restricted`](fenced_core::kv::KvCommand::Restricted) so that the state
//!   machine enforces the same limits on every command a script runs ([`User::limits_for`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_core::kv::{
    command_keys, command_table, glob_match, lookup, noperm_command, Argv, Keys, Reply,
    Restriction, CATEGORIES, NOPERM_CHANNEL, NOPERM_KEY,
};
use fenced_core::RequestId;
use sha2::{Digest, Sha256};

/// Reply to `ACL SETUSER/DELUSER/LOAD/SAVE`.
pub const NOT_AT_RUNTIME: &str =
    "ERR ACL rules are read from --acl-file at startup; fenced does not change them at run time";

/// Commands every connection may run, authenticated and permitted or not (as in Redis).
const ALWAYS_ALLOWED: &[&str] = &["AUTH", "HELLO", "QUIT", "RESET"];

/// Why an ACL file was refused.
#[derive(thiserror::Error, Debug)]
pub enum AclError {
    #[error("cannot read ACL file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ACL file {file}, line {line}: {reason}")]
    Line {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("ACL file {file}, line {line}: rule '{rule}': {reason}")]
    Rule {
        file: String,
        line: usize,
        rule: String,
        reason: String,
    },
    #[error(
        "ACL file {file} defines the 'default' user and --requirepass is given too; \
         set the default user's password in the file instead"
    )]
    RequirepassAndDefault { file: String },
}

/// Why [`User::permit`] (or [`User::require_admin`]) refused. `Display` names the user, the
/// command and the key or lock (what a gRPC client reads in `PERMISSION_DENIED`);
/// [`Denied::resp_text`] is Redis 7.2's exact `NOPERM` text (what a RESP client reads).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    #[error("NOPERM user '{user}' has no permissions to run the '{command}' command")]
    Command { user: String, command: String },
    #[error(
        "NOPERM user '{user}' has no permissions to access the key or lock '{key}' \
         (command '{command}'; the user's key patterns do not match it)"
    )]
    Key {
        user: String,
        command: String,
        key: String,
    },
    #[error(
        "NOPERM user '{user}' has no permissions to run '{command}' on the whole keyspace \
         (it needs allkeys / ~*)"
    )]
    Keyspace { user: String, command: String },
    #[error("NOPERM user '{user}' has no permissions to access a channel of '{command}'")]
    Channel { user: String, command: String },
    #[error(
        "NOPERM user '{user}' has no permissions to run {what}: it needs an administrator \
         (a user allowed every command of @admin: +@admin or +@all)"
    )]
    NotAdmin { user: String, what: String },
}

impl Denied {
    /// The reply a RESP client gets: Redis 7.2's text, which names neither the key nor
    /// the channel.
    pub fn resp_text(&self) -> String {
        match self {
            Denied::Command { user, command } => noperm_command(user, command.as_bytes()),
            Denied::Key { .. } | Denied::Keyspace { .. } => NOPERM_KEY.into(),
            Denied::Channel { .. } => NOPERM_CHANNEL.into(),
            Denied::NotAdmin { .. } => self.to_string(),
        }
    }
}

/// The commands (upper case, table order) of category `cat` (any case; `all` included).
/// `None` if there is no such category.
pub fn category_commands(cat: &str) -> Option<Vec<&'static str>> {
    let all = cat.eq_ignore_ascii_case("all");
    let bit = match CATEGORIES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(cat))
    {
        Some((_, bit)) => *bit,
        None if all => 0,
        None => return None,
    };
    Some(
        command_table()
            .iter()
            .filter(|c| all || c.in_category(bit))
            .map(|c| c.name)
            .collect(),
    )
}

/// The categories `ACL CAT` lists, in its order.
pub fn categories() -> impl Iterator<Item = &'static str> {
    CATEGORIES.iter().map(|(name, _)| *name)
}

type Digest32 = [u8; 32];

fn sha256(b: &[u8]) -> Digest32 {
    Sha256::digest(b).into()
}

fn ct_eq(a: &Digest32, b: &Digest32) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn hex(d: &Digest32) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hash(h: &[u8]) -> Result<Digest32, String> {
    let bad = || {
        "the password hash must be exactly 64 characters and contain only lowercase \
         hexadecimal characters"
            .to_string()
    };
    if h.len() != 64 || !h.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, pair) in h.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// One ACL user, as its rules left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    name: String,
    enabled: bool,
    nopass: bool,
    passwords: Vec<Digest32>,
    allkeys: bool,
    keys: Vec<Vec<u8>>,
    allchannels: bool,
    channels: Vec<Vec<u8>>,
    /// Allowed commands (upper-case table names).
    commands: BTreeSet<&'static str>,
    /// The command rules as given since the last `+@all`/`-@all` (for `ACL LIST`).
    command_rules: Vec<String>,
    /// Channel limits for [`Restriction::check`]; `None` with `allchannels`.
    channel_limits: Option<Restriction>,
    /// `+@all ~* &*`: nothing to check (the fast path of [`User::permit`]).
    unrestricted: bool,
    /// `CONFIG` and `ACL` are allowed ([`User::is_admin`]).
    admin: bool,
}

impl User {
    /// A new user with Redis's defaults: off, no passwords, no keys, no channels, no commands.
    fn new(name: &str) -> User {
        User {
            name: name.to_owned(),
            enabled: false,
            nopass: false,
            passwords: Vec::new(),
            allkeys: false,
            keys: Vec::new(),
            allchannels: false,
            channels: Vec::new(),
            commands: BTreeSet::new(),
            command_rules: vec!["-@all".into()],
            channel_limits: None,
            unrestricted: false,
            admin: false,
        }
    }

    /// The `default` user without an ACL file: `on nopass ~* &* +@all`, or with
    /// `--requirepass P`, `on >P ~* &* +@all`.
    fn default_user(requirepass: Option<&str>) -> User {
        let mut u = User::new("default");
        u.enabled = true;
        u.allkeys = true;
        u.allchannels = true;
        u.set_all_commands(true);
        match requirepass {
            None => u.nopass = true,
            Some(p) => u.passwords.push(sha256(p.as_bytes())),
        }
        u.finish();
        u
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The request id a client's `(client_id, seq)` is recorded under: the client id
    /// **namespaced by this user** (a SHA-256 of the user's name and the client's id), so a
    /// client of another user sending the same `client_id` neither reads nor replays this
    /// user's stored answers. Stable across nodes and restarts (a retry on another node finds
    /// the first answer); never 0. RESP's `REQID` and gRPC's `RequestId` both go through it.
    pub fn request_id(&self, client_id: u64, seq: u64) -> RequestId {
        let mut h = Sha256::new();
        h.update(b"fenced request id\0");
        h.update((self.name.len() as u64).to_le_bytes());
        h.update(self.name.as_bytes());
        h.update(client_id.to_le_bytes());
        let d = h.finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&d[..8]);
        RequestId {
            client_id: u64::from_le_bytes(b).max(1),
            seq,
        }
    }

    /// Apply one rule (Redis semantics). `Err` is why it was refused.
    fn apply_rule(&mut self, rule: &[u8]) -> Result<(), String> {
        match rule.to_ascii_lowercase().as_slice() {
            b"on" => self.enabled = true,
            b"off" => self.enabled = false,
            b"nopass" => {
                self.passwords.clear();
                self.nopass = true;
            }
            b"resetpass" => {
                self.passwords.clear();
                self.nopass = false;
            }
            b"allkeys" => self.key_pattern(b"*")?,
            b"resetkeys" => {
                self.allkeys = false;
                self.keys.clear();
            }
            b"allchannels" => self.channel_pattern(b"*")?,
            b"resetchannels" => {
                self.allchannels = false;
                self.channels.clear();
            }
            b"allcommands" => self.set_all_commands(true),
            b"nocommands" => self.set_all_commands(false),
            b"reset" => *self = User::new(&self.name),
            b"clearselectors" => return Err("selectors are not supported by fenced".into()),
            _ => {
                let Some((&first, body)) = rule.split_first() else {
                    return Err("empty rule".into());
                };
                match first {
                    b'>' => self.add_password(sha256(body)),
                    b'#' => self.add_password(parse_hash(body)?),
                    b'<' => self.remove_password(&sha256(body))?,
                    b'!' => self.remove_password(&parse_hash(body)?)?,
                    b'~' => self.key_pattern(body)?,
                    b'&' => self.channel_pattern(body)?,
                    b'%' => {
                        return Err("key permissions by access type (%R~, %W~, %RW~) are not \
                                    supported by fenced"
                            .into())
                    }
                    b'(' => return Err("selectors are not supported by fenced".into()),
                    b'+' | b'-' => self.command_rule(first == b'+', body)?,
                    _ => return Err("unknown or unsupported ACL rule".into()),
                }
            }
        }
        Ok(())
    }

    fn add_password(&mut self, d: Digest32) {
        self.nopass = false;
        if !self.passwords.contains(&d) {
            self.passwords.push(d);
        }
    }

    fn remove_password(&mut self, d: &Digest32) -> Result<(), String> {
        let before = self.passwords.len();
        self.passwords.retain(|p| p != d);
        if self.passwords.len() == before {
            return Err("the password to remove does not exist for this user".into());
        }
        Ok(())
    }

    fn key_pattern(&mut self, p: &[u8]) -> Result<(), String> {
        if self.allkeys {
            return Err(
                "adding a pattern after the * pattern (or the 'allkeys' flag) is not \
                        valid and does not have any effect; use 'resetkeys' first"
                    .into(),
            );
        }
        if p == b"*" {
            self.allkeys = true;
            self.keys.clear();
        } else if !self.keys.iter().any(|k| k == p) {
            self.keys.push(p.to_vec());
        }
        Ok(())
    }

    fn channel_pattern(&mut self, p: &[u8]) -> Result<(), String> {
        if self.allchannels {
            return Err(
                "adding a pattern after the * pattern (or the 'allchannels' flag) \
                        is not valid and does not have any effect; use 'resetchannels' first"
                    .into(),
            );
        }
        if p == b"*" {
            self.allchannels = true;
            self.channels.clear();
        } else if !self.channels.iter().any(|c| c == p) {
            self.channels.push(p.to_vec());
        }
        Ok(())
    }

    fn set_all_commands(&mut self, allow: bool) {
        self.commands = if allow {
            command_table().iter().map(|c| c.name).collect()
        } else {
            BTreeSet::new()
        };
        self.command_rules = vec![if allow { "+@all" } else { "-@all" }.into()];
    }

    fn command_rule(&mut self, allow: bool, body: &[u8]) -> Result<(), String> {
        if body.contains(&b'|') {
            return Err(
                "subcommand rules (+command|subcommand) are not supported by fenced".into(),
            );
        }
        let text = std::str::from_utf8(body)
            .map_err(|_| "command and category names are ASCII".to_string())?
            .to_ascii_lowercase();
        let sign = if allow { '+' } else { '-' };
        if let Some(cat) = text.strip_prefix('@') {
            if cat == "all" {
                self.set_all_commands(allow);
                return Ok(());
            }
            let cmds = category_commands(cat)
                .ok_or_else(|| format!("unknown command category '{cat}'"))?;
            for c in cmds {
                if allow {
                    self.commands.insert(c);
                } else {
                    self.commands.remove(c);
                }
            }
        } else {
            let upper = text.to_ascii_uppercase();
            let name = lookup(upper.as_bytes())
                .map(|c| c.name)
                .ok_or_else(|| format!("unknown command '{text}'"))?;
            if allow {
                self.commands.insert(name);
            } else {
                self.commands.remove(name);
            }
        }
        self.command_rules.push(format!("{sign}{text}"));
        Ok(())
    }

    /// Precompute what the checks need once the rules are applied.
    fn finish(&mut self) {
        self.channel_limits = (!self.allchannels).then(|| Restriction {
            user: self.name.clone(),
            keys: None,
            channels: Some(self.channels.clone()),
            commands: None,
        });
        self.unrestricted = self.allkeys && self.allchannels && self.all_commands();
        // `CONFIG` and `ACL` decide, not every `@admin` row: the refused server commands
        // (`SAVE`, `DEBUG`, …) are `@admin` rows too, and a user file written before they
        // existed (`+config +acl`) must not stop being an administrator.
        self.admin = ["CONFIG", "ACL"].iter().all(|c| self.commands.contains(c));
    }

    fn password_ok(&self, pass: &[u8]) -> bool {
        let d = sha256(pass);
        if self.nopass {
            return true;
        }
        // No early exit: every stored digest is compared.
        self.passwords
            .iter()
            .fold(false, |found, p| ct_eq(p, &d) | found)
    }

    fn all_commands(&self) -> bool {
        self.commands.len() == command_table().len()
    }

    /// **The** permission check of both front ends: may this user run `command` (a name of
    /// the core command table, any case) on `keys` (keys or lock names)? The command first,
    /// then every key against the user's `~pattern`s (Redis's order). `AUTH`, `HELLO`,
    /// `QUIT` and `RESET` are always allowed. RESP reaches it through [`User::check`]; the
    /// gRPC API with the command its call stands for (`Lock.Acquire` → `LOCK.ACQUIRE` on
    /// its lock names).
    pub fn permit(&self, command: &str, keys: &[&[u8]]) -> Result<(), Denied> {
        if self.unrestricted {
            return Ok(());
        }
        let upper = command.to_ascii_uppercase();
        if ALWAYS_ALLOWED.contains(&upper.as_str()) {
            return Ok(());
        }
        if !self.commands.contains(upper.as_str()) {
            return Err(Denied::Command {
                user: self.name.clone(),
                command: command.to_ascii_lowercase(),
            });
        }
        if !self.allkeys {
            if let Some(k) = keys
                .iter()
                .find(|k| !self.keys.iter().any(|p| glob_match(p, k)))
            {
                return Err(Denied::Key {
                    user: self.name.clone(),
                    command: command.to_ascii_lowercase(),
                    key: String::from_utf8_lossy(k).into_owned(),
                });
            }
        }
        Ok(())
    }

    /// May this user run `command` on **every** key starting with `prefix` (an etcd prefix
    /// range)? [`User::permit`]'s command check, then: `allkeys`, or a key pattern `P*` with
    /// `P` free of glob characters and a prefix of `prefix` — the only patterns that surely
    /// match every such key. Otherwise [`Denied::Key`] naming `prefix*`.
    pub fn permit_prefix(&self, command: &str, prefix: &[u8]) -> Result<(), Denied> {
        self.permit(command, &[])?;
        if self.allkeys {
            return Ok(());
        }
        let covers = |p: &Vec<u8>| match p.split_last() {
            Some((b'*', literal)) => {
                !literal
                    .iter()
                    .any(|c| matches!(c, b'*' | b'?' | b'[' | b'\\'))
                    && prefix.starts_with(literal)
            }
            _ => false,
        };
        if self.keys.iter().any(covers) {
            return Ok(());
        }
        let mut key = String::from_utf8_lossy(prefix).into_owned();
        key.push('*');
        Err(Denied::Key {
            user: self.name.clone(),
            command: command.to_ascii_lowercase(),
            key,
        })
    }

    /// May this user run `command` on keys no pattern but `~*` surely covers (an etcd range
    /// that is not one key or a prefix)? The command check, then `allkeys`, else
    /// [`Denied::Keyspace`].
    pub fn permit_keyspace(&self, command: &str) -> Result<(), Denied> {
        self.permit(command, &[])?;
        if self.allkeys {
            return Ok(());
        }
        Err(Denied::Keyspace {
            user: self.name.clone(),
            command: command.to_ascii_lowercase(),
        })
    }

    /// May this user run `argv` over RESP? [`User::permit`] with the command's declared keys,
    /// then its channels. A command on the whole keyspace (`KEYS`, `SCAN`, `FLUSHALL`, …)
    /// needs `allkeys`.
    pub fn permit_argv(&self, argv: &[Vec<u8>]) -> Result<(), Denied> {
        let Some(name) = argv.first() else {
            return Ok(());
        };
        if self.unrestricted {
            return Ok(());
        }
        let command = String::from_utf8_lossy(name);
        match command_keys(argv) {
            Keys::None => self.permit(&command, &[])?,
            Keys::Args(keys) => self.permit(&command, &keys)?,
            Keys::Whole => {
                self.permit(&command, &[])?;
                if !self.allkeys {
                    return Err(Denied::Keyspace {
                        user: self.name.clone(),
                        command: command.to_ascii_lowercase(),
                    });
                }
            }
        }
        if let Some(l) = &self.channel_limits {
            if ALWAYS_ALLOWED.contains(&command.to_ascii_uppercase().as_str()) {
                return Ok(());
            }
            l.check(argv).map_err(|_| Denied::Channel {
                user: self.name.clone(),
                command: command.to_ascii_lowercase(),
            })?;
        }
        Ok(())
    }

    /// [`User::permit_argv`] with Redis's reply text: `Err` is the full `NOPERM …` error.
    pub fn check(&self, argv: &[Vec<u8>]) -> Result<(), String> {
        self.permit_argv(argv).map_err(|d| d.resp_text())
    }

    /// Whether every key (and lock name) is this user's (`~*` / `allkeys`).
    pub fn all_keys(&self) -> bool {
        self.allkeys
    }

    /// Whether this user is an administrator: its rules allow `CONFIG` and `ACL` (`+@all`
    /// or `+@admin` do; `-@admin`, `-acl` or `-config` take it away).
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// `Ok` if this user is an administrator ([`User::is_admin`]); `what` names the
    /// operation in the refusal.
    pub fn require_admin(&self, what: &str) -> Result<(), Denied> {
        if self.admin {
            return Ok(());
        }
        Err(Denied::NotAdmin {
            user: self.name.clone(),
            what: what.to_owned(),
        })
    }

    /// The restriction to send with an entry of `cmds` (a batch, or a transaction's
    /// commands) so that the state machine enforces it, or `None` if nothing needs enforcing
    /// there. Key patterns always go along (the state machine refuses keys outside them for
    /// every command); channel and command limits only with a script (`EVAL`/`EVALSHA`),
    /// since every other command was checked here already.
    pub fn limits_for<'a>(&self, cmds: impl IntoIterator<Item = &'a Argv>) -> Option<Restriction> {
        if self.unrestricted {
            return None;
        }
        let scripted = cmds.into_iter().any(|a| {
            a.first().is_some_and(|n| {
                n.eq_ignore_ascii_case(b"EVAL") || n.eq_ignore_ascii_case(b"EVALSHA")
            })
        });
        let r = Restriction {
            user: self.name.clone(),
            keys: (!self.allkeys).then(|| self.keys.clone()),
            channels: (scripted && !self.allchannels).then(|| self.channels.clone()),
            commands: (scripted && !self.all_commands())
                .then(|| self.commands.iter().map(|c| c.to_string()).collect()),
        };
        (r.keys.is_some() || r.channels.is_some() || r.commands.is_some()).then_some(r)
    }

    fn keys_text(&self) -> String {
        if self.allkeys {
            return "~*".into();
        }
        let pats: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("~{}", String::from_utf8_lossy(k)))
            .collect();
        pats.join(" ")
    }

    fn channels_text(&self) -> String {
        if self.allchannels {
            return "&*".into();
        }
        let pats: Vec<String> = self
            .channels
            .iter()
            .map(|c| format!("&{}", String::from_utf8_lossy(c)))
            .collect();
        pats.join(" ")
    }

    /// The user as `ACL LIST` shows it (Redis's rendering; passwords as `#<sha256>`).
    pub fn describe(&self) -> String {
        let mut parts = vec![
            format!("user {}", self.name),
            if self.enabled { "on" } else { "off" }.to_string(),
        ];
        if self.nopass {
            parts.push("nopass".into());
        }
        parts.extend(self.passwords.iter().map(|d| format!("#{}", hex(d))));
        let keys = self.keys_text();
        if !keys.is_empty() {
            parts.push(keys);
        }
        if !self.allchannels {
            parts.push("resetchannels".into());
        }
        let channels = self.channels_text();
        if !channels.is_empty() {
            parts.push(channels);
        }
        parts.extend(self.command_rules.iter().cloned());
        parts.join(" ")
    }

    /// `ACL GETUSER`'s reply.
    fn getuser(&self) -> Reply {
        let mut flags = vec![Reply::bulk(if self.enabled { "on" } else { "off" })];
        if self.nopass {
            flags.push(Reply::bulk("nopass"));
        }
        Reply::Map(vec![
            (Reply::bulk("flags"), Reply::Array(flags)),
            (
                Reply::bulk("passwords"),
                Reply::Array(self.passwords.iter().map(|d| Reply::bulk(hex(d))).collect()),
            ),
            (
                Reply::bulk("commands"),
                Reply::bulk(self.command_rules.join(" ")),
            ),
            (Reply::bulk("keys"), Reply::bulk(self.keys_text())),
            (Reply::bulk("channels"), Reply::bulk(self.channels_text())),
            (Reply::bulk("selectors"), Reply::Array(vec![])),
        ])
    }
}

/// Split an aclfile line into arguments like Redis's `sdssplitargs`: whitespace separates,
/// `"…"` understands `\n \r \t \b \a \\ \" \xHH`, `'…'` understands `\'`; a closing quote
/// must be followed by whitespace or the end of the line.
fn split_args(line: &str) -> Result<Vec<Vec<u8>>, String> {
    let b = line.as_bytes();
    let hexval = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16)).map(|v| v as u8);
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            return Ok(out);
        }
        let mut cur = Vec::new();
        let (mut inq, mut insq) = (false, false);
        loop {
            let c = b.get(i).copied();
            if inq {
                match c {
                    None => return Err("unbalanced quotes".into()),
                    Some(b'\\') if b.get(i + 1) == Some(&b'x') => {
                        match (hexval(b.get(i + 2)), hexval(b.get(i + 3))) {
                            (Some(h), Some(l)) => {
                                cur.push(h * 16 + l);
                                i += 3;
                            }
                            _ => cur.push(b'\\'),
                        }
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        i += 1;
                        cur.push(match b[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 8,
                            b'a' => 7,
                            other => other,
                        });
                    }
                    Some(b'"') => {
                        if b.get(i + 1).is_some_and(|c| !c.is_ascii_whitespace()) {
                            return Err("a closing quote must be followed by a space".into());
                        }
                        i += 1;
                        break;
                    }
                    Some(c) => cur.push(c),
                }
            } else if insq {
                match c {
                    None => return Err("unbalanced quotes".into()),
                    Some(b'\\') if b.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        cur.push(b'\'');
                    }
                    Some(b'\'') => {
                        if b.get(i + 1).is_some_and(|c| !c.is_ascii_whitespace()) {
                            return Err("a closing quote must be followed by a space".into());
                        }
                        i += 1;
                        break;
                    }
                    Some(c) => cur.push(c),
                }
            } else {
                match c {
                    None => break,
                    Some(c) if c.is_ascii_whitespace() => break,
                    Some(b'"') => inq = true,
                    Some(b'\'') => insq = true,
                    Some(c) => cur.push(c),
                }
            }
            i += 1;
        }
        out.push(cur);
    }
}

/// Every user of the RESP front end.
#[derive(Clone, Debug)]
pub struct Acl {
    users: BTreeMap<String, Arc<User>>,
}

impl Default for Acl {
    fn default() -> Self {
        Acl::new(None)
    }
}

impl Acl {
    /// Only the `default` user (no ACL file): `nopass`, or `--requirepass`'s password.
    pub fn new(requirepass: Option<&str>) -> Acl {
        let default = User::default_user(requirepass);
        Acl {
            users: BTreeMap::from([(default.name.clone(), Arc::new(default))]),
        }
    }

    /// Read an ACL file (see the module docs).
    pub fn load(path: &Path, requirepass: Option<&str>) -> Result<Acl, AclError> {
        let text = std::fs::read_to_string(path).map_err(|source| AclError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string(), requirepass)
    }

    /// Parse the text of an ACL file; `file` names it in errors.
    pub fn parse(text: &str, file: &str, requirepass: Option<&str>) -> Result<Acl, AclError> {
        let mut users: BTreeMap<String, User> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let line_err = |reason: String| AclError::Line {
                file: file.to_owned(),
                line,
                reason,
            };
            let words = split_args(trimmed).map_err(line_err)?;
            let (Some(keyword), Some(name)) = (words.first(), words.get(1)) else {
                return Err(line_err("expected 'user <name> <rules…>'".into()));
            };
            if !keyword.eq_ignore_ascii_case(b"user") {
                return Err(line_err(
                    "a line must start with 'user' followed by the user name".into(),
                ));
            }
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| {
                    !n.is_empty() && !n.chars().any(|c| c.is_whitespace() || c.is_control())
                })
                .ok_or_else(|| {
                    line_err(format!(
                        "invalid user name '{}'",
                        String::from_utf8_lossy(name)
                    ))
                })?;
            if users.contains_key(name) {
                return Err(line_err(format!("duplicate user '{name}'")));
            }
            let mut user = User::new(name);
            for rule in &words[2..] {
                user.apply_rule(rule).map_err(|reason| AclError::Rule {
                    file: file.to_owned(),
                    line,
                    rule: String::from_utf8_lossy(rule).into_owned(),
                    reason,
                })?;
            }
            users.insert(name.to_owned(), user);
        }
        if users.contains_key("default") {
            if requirepass.is_some() {
                return Err(AclError::RequirepassAndDefault {
                    file: file.to_owned(),
                });
            }
        } else {
            users.insert("default".into(), User::default_user(requirepass));
        }
        Ok(Acl {
            users: users
                .into_iter()
                .map(|(n, mut u)| {
                    u.finish();
                    (n, Arc::new(u))
                })
                .collect(),
        })
    }

    pub fn user(&self, name: &str) -> Option<&Arc<User>> {
        self.users.get(name)
    }

    /// The user a new connection (or `RESET`) starts as: `default` if it is `on` and
    /// `nopass`, else none (not authenticated).
    pub fn initial_user(&self) -> Option<Arc<User>> {
        self.users
            .get("default")
            .filter(|u| u.enabled && u.nopass)
            .cloned()
    }

    /// Whether the `default` user is `nopass` (one-argument `AUTH` is then an error, as in
    /// Redis).
    pub fn default_is_nopass(&self) -> bool {
        self.users.get("default").is_some_and(|u| u.nopass)
    }

    /// `AUTH user pass`: the user if it exists, is `on` and `pass` is one of its passwords
    /// (or it is `nopass`).
    pub fn authenticate(&self, user: &[u8], pass: &[u8]) -> Option<Arc<User>> {
        let u = std::str::from_utf8(user)
            .ok()
            .and_then(|n| self.users.get(n))?;
        (u.password_ok(pass) && u.enabled).then(|| u.clone())
    }

    /// `ACL <subcommand> …` for the connection's user `me`.
    pub fn command(&self, me: &User, a: &[Vec<u8>]) -> Reply {
        let Some(sub) = a.first() else {
            return Reply::err("ERR wrong number of arguments for 'acl' command");
        };
        let sub_lc = String::from_utf8_lossy(sub).to_ascii_lowercase();
        let arity_ok = match sub_lc.as_str() {
            "whoami" | "users" | "list" => a.len() == 1,
            "cat" => a.len() <= 2,
            "getuser" => a.len() == 2,
            _ => true,
        };
        if !arity_ok {
            return Reply::err(format!(
                "ERR wrong number of arguments for 'acl|{sub_lc}' command"
            ));
        }
        match sub_lc.as_str() {
            "whoami" => Reply::bulk(&me.name),
            "users" => Reply::Array(self.users.keys().map(Reply::bulk).collect()),
            "list" => Reply::Array(
                self.users
                    .values()
                    .map(|u| Reply::bulk(u.describe()))
                    .collect(),
            ),
            "cat" => match a.get(1) {
                None => Reply::Array(categories().map(Reply::bulk).collect()),
                Some(cat) => match category_commands(&String::from_utf8_lossy(cat)) {
                    Some(cmds) => Reply::Array(
                        cmds.iter()
                            .map(|c| Reply::bulk(c.to_ascii_lowercase()))
                            .collect(),
                    ),
                    None => Reply::err(format!(
                        "ERR Unknown category '{}'",
                        String::from_utf8_lossy(cat)
                    )),
                },
            },
            "getuser" => match self.users.get(String::from_utf8_lossy(&a[1]).as_ref()) {
                Some(u) => u.getuser(),
                None => Reply::Nil,
            },
            "setuser" | "deluser" | "load" | "save" => Reply::err(NOT_AT_RUNTIME),
            "log" => Reply::err("ERR ACL LOG is not supported by fenced"),
            _ => Reply::err(format!(
                "ERR unknown subcommand '{}'. Try ACL HELP.",
                String::from_utf8_lossy(sub)
            )),
        }
    }
}

#[cfg(test)]
mod tests;
