//! Commands the RESP front end serves itself — connection, server, transaction and ACL
//! commands, and the Redis server commands fenced answers or refuses with a reason
//! (`SAVE`, `REPLICAOF`, `DEBUG`, …; docs/resp.md, "Differences from Redis"). Their rows
//! give arity, keys and ACL categories (Redis's), so `ACL` rules and `COMMAND INFO` know
//! them; inside `MULTI` or a script they are refused.

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
    front("WAIT", 3, CONNECTION),
    front("WAITAOF", 4, CONNECTION),
    front("ROLE", 1, ADMIN | DANGEROUS),
    front("LASTSAVE", 1, ADMIN | DANGEROUS),
    front("SAVE", 1, ADMIN | DANGEROUS),
    front("BGSAVE", -1, ADMIN | DANGEROUS),
    front("BGREWRITEAOF", 1, ADMIN | DANGEROUS),
    front("SHUTDOWN", -1, ADMIN | DANGEROUS),
    front("REPLICAOF", 3, ADMIN | DANGEROUS),
    front("SLAVEOF", 3, ADMIN | DANGEROUS),
    front("SYNC", 1, ADMIN | DANGEROUS),
    front("PSYNC", -3, ADMIN | DANGEROUS),
    front("FAILOVER", -1, ADMIN | DANGEROUS),
    front("MONITOR", 1, ADMIN | DANGEROUS),
    front("DEBUG", -2, ADMIN | DANGEROUS),
    front("MODULE", -2, ADMIN | DANGEROUS),
    front("SWAPDB", 3, KEYSPACE | WRITE | DANGEROUS),
    front("MIGRATE", -6, KEYSPACE | WRITE | DANGEROUS),
    front("MOVE", 3, KEYSPACE | WRITE),
    front("OBJECT", -2, KEYSPACE | READ),
    front("MEMORY", -2, READ),
    front("LATENCY", -2, ADMIN | DANGEROUS),
    front("SLOWLOG", -2, ADMIN | DANGEROUS),
    front("CLUSTER", -2, CONNECTION),
    front("READONLY", 1, CONNECTION),
    front("READWRITE", 1, CONNECTION),
];
