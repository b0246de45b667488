"""INFO, CLIENT, WAIT and the refusals through redis-py, against a fenced follower.

python3 redis_py_info.py HOST PORT PROTOCOL KEYS: KEYS is how many keys the test wrote
(at least that many must show in db0)."""
import sys
import time

import redis

host, port, proto, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = redis.Redis(host=host, port=port, protocol=proto, socket_timeout=10)
# redis-py >= 5 sends CLIENT SETINFO LIB-NAME/LIB-VER on connect.
assert r.ping()

info = r.info()
for field in [
    "redis_version", "redis_mode", "os", "arch_bits", "process_id", "run_id", "tcp_port",
    "uptime_in_seconds", "uptime_in_days", "executable", "config_file",
    "connected_clients", "blocked_clients", "pubsub_clients", "maxclients",
    "used_memory", "used_memory_human", "used_memory_rss", "maxmemory", "maxmemory_policy",
    "mem_allocator", "loading", "aof_enabled", "rdb_changes_since_last_save",
    "fenced_wal_enabled", "total_connections_received", "total_commands_processed",
    "instantaneous_ops_per_sec", "rejected_connections", "role", "connected_slaves",
    "master_replid", "used_cpu_sys", "used_cpu_user", "cluster_enabled",
    "fenced_role", "fenced_node_id", "fenced_leader_id", "fenced_term",
    "fenced_applied_index", "fenced_members", "fenced_cluster_id",
]:
    assert field in info, f"INFO lacks {field}: {sorted(info)}"
assert info["role"] == "master", info["role"]
assert info["fenced_role"] == "follower", info["fenced_role"]
assert info["arch_bits"] == 64 and info["process_id"] > 0 and info["used_memory"] > 0
assert info["aof_enabled"] == 1 and info["loading"] == 0 and info["cluster_enabled"] == 0
assert info["connected_slaves"] == 0 and len(info["master_replid"]) == 40
assert info["fenced_members"] == 3 and info["fenced_leader_id"] != info["fenced_node_id"]
assert info["total_commands_processed"] >= 1
# The keyspace line parses into a dict.
assert info["db0"]["keys"] >= keys, info["db0"]
assert info["db0"]["expires"] >= 1 and info["db0"]["avg_ttl"] == 0, info["db0"]

server = r.info("server")
assert "redis_version" in server and "connected_clients" not in server, sorted(server)
ks = r.info("keyspace")
assert list(ks) == ["db0"], ks
every = r.info("everything")
assert "used_cpu_user" in every and "fenced_term" in every and "db0" in every
assert r.info("nosuch") == {}

# CLIENT: names, SETINFO from the client library, LIST/INFO.
assert r.client_setname("py-info")
assert r.client_getname() in ("py-info", b"py-info")
me = r.client_info()
assert me["name"] == "py-info" and me["lib-name"].startswith("redis-py"), me
assert me["user"] == "default" and int(me["resp"]) == proto, me
ids = [c["id"] for c in r.client_list()]
assert str(r.client_id()) in [str(i) for i in ids], ids

# WAIT/WAITAOF: a write is on a majority (2 of 3) when acknowledged.
r.set("py-wait", "1")
assert r.wait(1, 0) == 1
assert r.waitaof(1, 1, 0) == [1, 1]
assert r.lastsave().timestamp() > time.time() - 60

# Refusals say why.
for cmd, why in [
    (("SAVE",), "fsynced to a majority"),
    (("BGSAVE",), "fenced snapshot save"),
    (("SHUTDOWN",), "SIGTERM"),
    (("REPLICAOF", "127.0.0.1", "6379"), "Raft"),
    (("DEBUG", "SLEEP", "0"), "fenced debug digest"),
    (("CLIENT", "TRACKING", "ON"), "client-side caching"),
]:
    try:
        r.execute_command(*cmd)
    except redis.ResponseError as e:
        assert why in str(e), (cmd, str(e))
    else:
        raise AssertionError(f"{cmd} was not refused")
print("redis-py info ok")
