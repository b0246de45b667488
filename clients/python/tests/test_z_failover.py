"""A leader SIGKILL while a lock is held: the lock stays held with the same token, a new
acquire waits, and the holder still releases it. Last (file order): it leaves two nodes."""

import os
import signal
import threading
import time

import fenced
from conftest import ADDRS, KILLED, PIDS, live_ids, node_redis, wait_until


def leader_id() -> int:
    for i in live_ids():
        try:
            info = node_redis(i, socket_timeout=2).info()
        except Exception:
            continue
        leader = info.get("fenced_leader")
        if isinstance(leader, int) and leader in ADDRS and leader not in KILLED:
            return leader
    return 0


def test_leader_sigkill_during_a_held_lock(fc, fc2, name):
    assert PIDS, "FENCED_NODE_PIDS is not set"
    holder = fenced.Lock(fc, name, ttl_ms=30_000)
    token = holder.acquire()
    assert token
    leader = wait_until("a leader", leader_id, timeout=20)
    os.kill(PIDS[leader], signal.SIGKILL)
    KILLED.add(leader)

    # The two survivors elect a leader; the grant is there with its token.
    info = wait_until("LOCK.INFO after the failover", lambda: fc.lock_info(name), timeout=30)
    assert int(info["token"]) == token and info["owner"] == holder.owner
    new_leader = wait_until("a new leader", leader_id, timeout=30)
    assert new_leader != leader

    # A new acquire waits (server-side) while the old grant holds.
    got = {}
    waiter = fenced.Lock(fc2, name, ttl_ms=10_000)
    th = threading.Thread(target=lambda: got.setdefault("t", waiter.acquire(wait_ms=20_000)),
                          daemon=True)
    th.start()
    time.sleep(1.0)
    assert "t" not in got, "the lock is still held after the failover"
    holder.renew()  # the holder still has it, under the same token
    holder.release()
    th.join(timeout=20)
    assert got.get("t") and got["t"] > token, got
    waiter.release()
