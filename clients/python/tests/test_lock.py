"""Lock: acquire/release, token order, waiting and FIFO, reentrancy, leases, context manager,
auto-renew."""

import threading
import time

import pytest

import fenced
from conftest import wait_until


def test_acquire_release_and_token_order(fc, fc2, name):
    a = fenced.Lock(fc, name, ttl_ms=10_000)
    t1 = a.acquire()
    assert isinstance(t1, int) and t1 > 0
    assert a.held and a.token == t1
    info = a.info()
    assert info["owner"] == a.owner and int(info["token"]) == t1

    b = fenced.Lock(fc2, name, ttl_ms=10_000)
    assert b.acquire() is None, "a second owner must not get a held lock"
    assert not b.held and b.token is None

    a.release()
    assert not a.held and a.token is None
    assert fc.lock_info(name) is None

    t2 = b.acquire()
    assert t2 is not None and t2 > t1, "tokens only grow"
    b.release()
    t3 = a.acquire()
    assert t3 > t2
    a.release()
    with pytest.raises(fenced.FencedError):
        a.release()  # not held


def test_plain_redis_client_is_accepted(r, name):
    with fenced.Lock(r, name, ttl_ms=5_000) as token:
        assert int(fenced.as_client(r).lock_info(name)["token"]) == token
    assert fenced.as_client(r) is fenced.as_client(r), "one FencedClient per redis.Redis"


def test_context_manager(fc, fc2, name):
    with fenced.Lock(fc, name, ttl_ms=10_000) as token:
        assert int(fc.lock_info(name)["token"]) == token
        with pytest.raises(fenced.NotAcquired):
            with fenced.Lock(fc2, name, ttl_ms=10_000, wait_ms=0):
                pass
    assert fc.lock_info(name) is None, "released on exit"
    # An exception in the body releases too, and propagates.
    with pytest.raises(ZeroDivisionError):
        with fenced.Lock(fc, name, ttl_ms=10_000):
            1 / 0
    assert fc.lock_info(name) is None


def test_reentrancy(fc, name):
    a = fenced.Lock(fc, name, ttl_ms=10_000)
    t = a.acquire()
    assert a.acquire() == t, "the same owner again: the same token"
    assert a.holds == 2 and int(a.info()["holds"]) == 2
    # Another object with the same owner reenters the same grant.
    b = fenced.Lock(fc, name, ttl_ms=10_000, owner=a.owner)
    assert b.acquire() == t
    assert int(a.info()["holds"]) == 3
    b.release()
    a.release()
    assert a.held and int(a.info()["holds"]) == 1
    a.release()
    assert fc.lock_info(name) is None


def test_waiting_is_fifo(fc, fc2, name):
    holder = fenced.Lock(fc, name, ttl_ms=20_000)
    holder.acquire()
    order, tokens, errors = [], {}, []

    def waiter(i):
        try:
            lk = fenced.Lock(fc2, name, ttl_ms=20_000)
            t = lk.acquire(wait_ms=20_000)
            order.append(i)
            tokens[i] = t
            time.sleep(0.05)
            lk.release()
        except Exception as e:  # reported below
            errors.append(e)

    threads = []
    for i in range(3):
        t = threading.Thread(target=waiter, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        # Each waiter queued before the next starts.
        wait_until(f"waiter {i} queued", lambda: int(fc.lock_info(name)["waiters"]) >= i + 1)
    time.sleep(0.2)
    assert order == [], "nobody gets a held lock"
    holder.release()
    for t in threads:
        t.join(timeout=20)
    assert not errors, errors
    assert order == [0, 1, 2], "waiters are served in arrival order"
    assert tokens[0] < tokens[1] < tokens[2]


def test_wait_times_out(fc, fc2, name):
    with fenced.Lock(fc, name, ttl_ms=10_000):
        t0 = time.monotonic()
        assert fenced.Lock(fc2, name, ttl_ms=1000).acquire(wait_ms=400) is None
        assert time.monotonic() - t0 >= 0.35


def test_expired_lease_is_lost(fc, fc2, name):
    lost = []
    a = fenced.Lock(fc, name, ttl_ms=300, on_lost=lambda lk, e: lost.append(e))
    t = a.acquire()
    b = fenced.Lock(fc2, name, ttl_ms=10_000)
    t2 = b.acquire(wait_ms=5_000)
    assert t2 is not None and t2 > t, "granted after the lease ran out"
    with pytest.raises(fenced.LockLost):
        a.renew()
    with pytest.raises(fenced.LockLost) as err:
        a.release()
    assert err.value.token == t
    assert lost, "on_lost was called"
    b.release()


def test_expiry_event_marks_lock_lost(fc, name):
    lost = []
    a = fenced.Lock(fc, name, ttl_ms=500, on_lost=lambda lk, e: lost.append(e.reason))
    a.acquire()
    # Nobody renews: the lease ends and the owner channel says so.
    wait_until("the lock-loss event", lambda: a.lost is not None, timeout=10)
    assert lost and lost[0] == "expired", lost
    with pytest.raises(fenced.LockLost):
        a.check()


def test_auto_renew_keeps_the_lock(fc, fc2, name):
    a = fenced.Lock(fc, name, ttl_ms=600, auto_renew=True)
    t = a.acquire()
    time.sleep(2.0)  # more than three leases
    assert a.held and a.lost is None
    assert fenced.Lock(fc2, name, ttl_ms=1000).acquire() is None
    assert int(fc.lock_info(name)["token"]) == t
    a.release()
    assert fc.lock_info(name) is None


def test_renew_extends_the_lease(fc, name):
    a = fenced.Lock(fc, name, ttl_ms=2_000)
    a.acquire()
    a.renew(ttl_ms=30_000)
    assert int(a.info()["ttl_ms"]) > 20_000
    a.release()


def test_force_unlock_is_a_loss(fc, fc2, name):
    lost = []
    a = fenced.Lock(fc, name, ttl_ms=30_000, on_lost=lambda lk, e: lost.append(e.reason))
    t = a.acquire()
    assert fc2.force_unlock(name) is True
    wait_until("the force_unlocked event", lambda: a.lost is not None, timeout=10)
    assert lost == ["force_unlocked"]
    assert fc2.force_unlock(name) is False, "nobody holds it now"
    with pytest.raises(fenced.LockLost):
        a.release()
    assert fenced.Lock(fc2, name, ttl_ms=1000).acquire() > t


def test_lock_delay_after_expiry(fc, fc2, name):
    a = fenced.Lock(fc, name, ttl_ms=200, delay_ms=1500)
    a.acquire()
    wait_until("the lease to run out", lambda: fc.lock_info(name) is None, timeout=10)
    t0 = time.monotonic()
    # Not granted again during the lock-delay; a waiter gets it once the delay is over.
    assert fenced.Lock(fc2, name, ttl_ms=1000).acquire() is None
    assert fenced.Lock(fc2, name, ttl_ms=1000).acquire(wait_ms=10_000) is not None
    assert time.monotonic() - t0 >= 0.8
