"""RWLock, Semaphore and MultiLock."""

import threading
import time

import pytest

import fenced
from conftest import wait_until


def test_readers_share_writer_excludes(fc, fc2, name):
    rw = fenced.RWLock(fc, name, ttl_ms=10_000)
    r1, r2 = rw.read(), rw.read()
    t1, t2 = r1.acquire(), r2.acquire()
    assert t1 and t2 and t1 != t2, "each reader has a grant (and token) of its own"
    assert r1.owner != r2.owner
    info = rw.info()
    assert info["kind"] == "read-write"
    assert sorted(int(h["token"]) for h in info["holders"]) == sorted([t1, t2])
    assert {h["mode"] for h in info["holders"]} == {"read"}

    w = fenced.RWLock(fc2, name, ttl_ms=10_000).write()
    assert w.acquire() is None, "no writer while readers hold"
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("t", w.acquire(wait_ms=10_000)), daemon=True)
    th.start()
    wait_until("the writer queued", lambda: int(rw.info()["waiters"]) >= 1)
    # A queued writer blocks new readers.
    assert rw.read().acquire() is None
    r1.release()
    time.sleep(0.2)
    assert "t" not in got, "one reader still holds"
    r2.release()
    th.join(timeout=10)
    assert got["t"] and got["t"] > max(t1, t2)
    assert rw.read().acquire() is None, "no reader while the writer holds"
    info = rw.info()
    assert [h["mode"] for h in info["holders"]] == ["write"]
    w.release()
    with rw.read() as t3:
        assert t3 > got["t"]


def test_kind_is_fixed_while_held(fc, name):
    with fenced.Lock(fc, name, ttl_ms=10_000):
        with pytest.raises(fenced.CommandError, match="not a read-write"):
            fenced.RWLock(fc, name, ttl_ms=10_000).read().acquire()
        with pytest.raises(fenced.CommandError):
            fenced.Semaphore(fc, name, permits=2, ttl_ms=10_000).acquire()
    # Idle again: any kind.
    with fenced.RWLock(fc, name, ttl_ms=10_000).write():
        pass


def test_semaphore_counts_permits(fc, fc2, name):
    sem = fenced.Semaphore(fc, name, permits=2, ttl_ms=10_000)
    p1, p2 = sem.acquire(), sem.acquire()
    assert p1 is not None and p2 is not None
    assert p1.token != p2.token and p1.owner != p2.owner, "each permit: its own token"
    assert sem.acquire() is None, "only 2 permits"
    info = sem.info()
    assert info["kind"] == "semaphore" and int(info["permits"]) == 2
    assert len(info["holders"]) == 2 and {h["mode"] for h in info["holders"]} == {"permit"}

    other = fenced.Semaphore(fc2, name, permits=2, ttl_ms=10_000)
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("p", other.acquire(wait_ms=10_000)), daemon=True)
    th.start()
    wait_until("the third permit queued", lambda: int(sem.info()["waiters"]) >= 1)
    p1.release()
    th.join(timeout=10)
    p3 = got["p"]
    assert p3 is not None and p3.token > p2.token
    p2.release()
    with sem.permit() as t4:
        assert t4 > p3.token
        assert len(sem.info()["holders"]) == 2
    p3.release()
    assert fc.lock_info(name) is None


def test_multilock_all_or_none(fc, fc2, name):
    a, b, c = f"{name}-a", f"{name}-b", f"{name}-c"
    blocker = fenced.Lock(fc2, b, ttl_ms=10_000)
    blocker.acquire()
    m = fenced.MultiLock(fc, [a, b, c], ttl_ms=10_000)
    assert m.acquire() is None, "b is held: nothing granted"
    assert fc.lock_info(a) is None and fc.lock_info(c) is None, "none of the others taken"

    got = {}
    th = threading.Thread(target=lambda: got.setdefault("t", m.acquire(wait_ms=10_000)), daemon=True)
    th.start()
    wait_until("the multi-lock queued on b", lambda: int(fc.lock_info(b)["waiters"]) >= 1)
    # Waiting in every queue at once takes nothing meanwhile: all or none.
    assert fc.lock_info(a) is None and fc.lock_info(c) is None
    blocker.release()
    th.join(timeout=10)
    t = got["t"]
    assert t is not None
    for n in (a, b, c):
        info = fc.lock_info(n)
        assert int(info["token"]) == t and info["owner"] == m.owner, "one token on every name"
    assert fenced.Lock(fc2, c, ttl_ms=1000).acquire() is None
    m.renew()
    m.release()
    for n in (a, b, c):
        assert fc.lock_info(n) is None
    with fenced.MultiLock(fc, [c, a], ttl_ms=5_000) as t2:
        assert t2 > t
