//! Commands the RESP front end serves itself — connection, server, transaction and ACL
//! commands. Their rows give arity, keys and ACL categories; inside `MULTI` or a script they
//! are refused.

use super::prelude::*;

const fn front(name: &'static str, arity: i32, acl: u32) -> CommandSpec {
    CommandSpec::other(name, arity, acl, Run::FrontEnd)
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    front("PING", -1, CONNECTION),
    front("ECHO", 2, CONNECTION),
    front("HELLO", -1, CONNECTION),
    front("AUTH", -2, CONNECTION),
    front("SELECT", 2, CONNECTION),
    front("QUIT", -1, CONNECTION),
    front("RESET", 1, CONNECTION),
    front("CLIENT", -2, CONNECTION),
    front("INFO", -1, DANGEROUS),
    front("COMMAND", -1, CONNECTION),
    front("CONFIG", -2, ADMIN | DANGEROUS),
    front("MULTI", 1, TRANSACTION),
    front("EXEC", 1, TRANSACTION),
    front("DISCARD", 1, TRANSACTION),
    front("WATCH", -2, TRANSACTION).keys(KeySpec::All),
    front("UNWATCH", 1, TRANSACTION),
    front("ACL", -2, ADMIN | DANGEROUS),
];
