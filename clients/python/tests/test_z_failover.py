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
        leader = info.get("fenced_leader_id")  # INFO's # Fenced section
        if isinstance(leader, int) and leader in ADDRS and leader not in KILLED:
            return leader
    return 0


def test_leader_sigkill_during_a_held_lock(fc2, name):
    assert PIDS, "FENCED_NODE_PIDS is not set"
    leader = wait_until("a leader", leader_id, timeout=20)
    # The leader first: this client's commands and its lock-loss listener start on the node
    # that gets killed, so both must move on.
    order = [leader] + [i for i in live_ids() if i != leader]
    fc = fenced.FencedClient.from_addresses([ADDRS[i] for i in order],
                                            client_kwargs={"socket_timeout": 20})
    holder = fenced.Lock(fc, name, ttl_ms=30_000)
    token = holder.acquire()
    assert token
    # A session lock too: its keep-alive thread must carry it across the failover.
    session = fenced.Session(fc, ttl_ms=3_000)
    session.open()
    in_session = session.lock(f"{name}-s")
    s_token = in_session.acquire()
    assert s_token
    leader = wait_until("the leader", leader_id, timeout=20)  # (unchanged, normally)
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

    # The session outlived the failover (its TTL is shorter than the time since the kill).
    assert in_session.held and session.lost is None
    assert int(fc.lock_info(f"{name}-s")["token"]) == s_token
    session.close()
    assert fc.lock_info(f"{name}-s") is None

    # The lock-loss listener (reconnected if it was on the killed node) still hears events.
    short = fenced.Lock(fc, f"{name}-e", ttl_ms=300)
    short.acquire()
    wait_until("an expiry event after the failover", lambda: short.lost is not None, timeout=15)
    fc.close()
