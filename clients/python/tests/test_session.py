"""Sessions: locks bound to a session, keep-alive, close, and a lapse noticed through the
lock-loss event."""

import time

import pytest

import fenced
from conftest import wait_until


def test_session_keeps_its_locks_alive(fc, fc2, name):
    with fenced.Session(fc, ttl_ms=900) as s:
        assert s.id and s.id > 0
        lk = s.lock(name)
        t = lk.acquire()
        assert int(lk.info()["session"]) == s.id
        time.sleep(2.5)  # almost three TTLs: only the keep-alive thread keeps it
        assert lk.held and s.lost is None
        assert fenced.Lock(fc2, name, ttl_ms=1000).acquire() is None
        assert name in s.info()["locks"]
        with pytest.raises(fenced.FencedError):
            lk.renew()  # a session's grant is renewed by the session
        lk.release()
        assert fc.lock_info(name) is None
        assert lk.acquire() > t
    # Closing the session released the lock taken in it.
    assert fc.lock_info(name) is None
    assert fc.session_info(s.id) is None


def test_session_close_releases_every_lock(fc, name):
    s = fenced.Session(fc, ttl_ms=10_000)
    s.open()
    locks = [s.lock(f"{name}-{i}") for i in range(3)]
    for lk in locks:
        assert lk.acquire() is not None
    sem = s.semaphore(f"{name}-sem", permits=2)
    assert sem.acquire() is not None
    assert s.close() is True
    for i in range(3):
        assert fc.lock_info(f"{name}-{i}") is None
    assert fc.lock_info(f"{name}-sem") is None


def test_session_lapse_raises_lock_lost_via_event(fc, fc2, name):
    lost_locks, lost_sessions, events = [], [], []
    fc.events.add_callback(events.append)
    # keepalive=False: this process "pauses" and sends no keep-alive.
    s = fenced.Session(fc, ttl_ms=800, keepalive=False,
                       on_lost=lambda sess, e: lost_sessions.append(e))
    s.open()
    lk = s.lock(name, on_lost=lambda l, e: lost_locks.append(e))
    t = lk.acquire()
    assert t
    wait_until("the lock-loss event for the session's lock", lambda: lk.lost is not None, timeout=10)
    assert lost_locks and lost_locks[0].reason == "session_expired", lost_locks
    wait_until("session_gone", lambda: s.lost is not None, timeout=10)
    assert isinstance(s.lost, fenced.SessionLost)
    assert lost_sessions
    reasons = {(e.reason, e.session) for e in events}
    assert ("session_expired", s.id) in reasons and ("session_gone", s.id) in reasons, events
    ev = next(e for e in events if e.reason == "session_expired")
    assert ev.name == name and ev.token == t and ev.owner == lk.owner
    with pytest.raises(fenced.LockLost):
        lk.check()
    with pytest.raises(fenced.LockLost):
        lk.release()
    with pytest.raises(fenced.SessionLost):
        s.keepalive()
    # The lock is free for the next holder, with a newer token.
    assert fenced.Lock(fc2, name, ttl_ms=1000).acquire() > t


def test_keepalive_of_a_gone_session_raises(fc, name):
    s = fenced.Session(fc, ttl_ms=5_000, keepalive=False, events=False)
    s.open()
    lk = s.lock(name)
    lk.acquire()
    # Another client closes it (as an operator might): the keep-alive learns it.
    assert fc.call("SESSION.CLOSE", s.id) == 1
    with pytest.raises(fenced.SessionLost):
        s.keepalive()
    assert lk.lost is not None
