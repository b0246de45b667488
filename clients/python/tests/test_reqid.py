"""Retries that act once: REQID."""

import redis

import fenced
from conftest import ADDRS, live_ids, node_redis


def test_same_reqid_on_two_connections_is_one_grant(fc, name):
    ids = live_ids()
    a, b = node_redis(ids[0]), node_redis(ids[-1])
    cid, seq = fc.client_id, fc.next_seq()
    t1 = a.execute_command("LOCK.ACQUIRE", name, "alice", 10_000, "REQID", cid, seq)
    # The reply was "lost"; the retry goes to another node on another connection.
    t2 = b.execute_command("LOCK.ACQUIRE", name, "alice", 10_000, "REQID", cid, seq)
    assert t1 == t2 and t1 > 0, "the retry is answered with the first outcome"
    assert int(fc.lock_info(name)["holds"]) == 1, "one hold, not two"
    # A new seq of the same owner is a second (reentrant) hold.
    t3 = a.execute_command("LOCK.ACQUIRE", name, "alice", 10_000, "REQID", cid, fc.next_seq())
    assert t3 == t1 and int(fc.lock_info(name)["holds"]) == 2
    rel = fc.next_seq()
    assert a.execute_command("LOCK.RELEASE", name, "alice", t1, "REQID", cid, rel) == 1
    assert b.execute_command("LOCK.RELEASE", name, "alice", t1, "REQID", cid, rel) == 1, \
        "a repeated release answers the first outcome"
    assert int(fc.lock_info(name)["holds"]) == 1, "and released one hold only"
    assert a.execute_command("LOCK.RELEASE", name, "alice", t1, "REQID", cid, fc.next_seq()) == 1
    assert fc.lock_info(name) is None
    a.close()
    b.close()


class LoseFirstReply:
    """A node whose first command is applied but whose reply is lost (a connection error)."""

    def __init__(self, inner: redis.Redis) -> None:
        self.inner = inner
        self.calls = []

    def execute_command(self, *args):
        self.calls.append(args)
        reply = self.inner.execute_command(*args)
        if len(self.calls) == 1:
            raise redis.exceptions.ConnectionError("reply lost (test)")
        return reply

    def pubsub(self):
        return self.inner.pubsub()


def test_client_retry_after_lost_reply_reuses_the_seq(name):
    ids = live_ids()
    flaky = LoseFirstReply(node_redis(ids[0]))
    fc = fenced.FencedClient([flaky, node_redis(ids[-1])], events=False, backoff_s=0.01)
    lk = fenced.Lock(fc, name, ttl_ms=10_000)
    t = lk.acquire()
    assert t and lk.holds == 1
    assert int(fc.lock_info(name)["holds"]) == 1, "the retry did not take a second hold"
    first = flaky.calls[0]
    assert first[-3] == "REQID" and first[-2] == fc.client_id
    lk.release()
    assert fc.lock_info(name) is None


def test_client_ids_are_random_nonzero_63_bit():
    ids = {fenced.FencedClient(redis.Redis(), events=False).client_id for _ in range(20)}
    assert len(ids) == 20 and all(0 < i < 2**63 for i in ids)
