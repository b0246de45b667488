"""redis-py's Lock, unchanged, against fenced.

python3 redis_py_lock.py HOST PORT PROTOCOL [CA_PEM [CERT_PEM KEY_PEM]]: with CA_PEM, over TLS
(verifying the server against that CA, presenting CERT/KEY if given)."""
import sys
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.exceptions import LockError, LockNotOwnedError
from redis.retry import Retry

host, port, proto = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tls = {}
if len(sys.argv) > 4:
    tls = {"ssl": True, "ssl_ca_certs": sys.argv[4], "ssl_cert_reqs": "required"}
if len(sys.argv) > 6:
    tls.update(ssl_certfile=sys.argv[5], ssl_keyfile=sys.argv[6])


def client():
    # No retries: a timed-out acquire that succeeded must not be retried blindly.
    return redis.Redis(host=host, port=port, protocol=proto, socket_timeout=10, retry=Retry(NoBackoff(), 0), **tls)


r, r2 = client(), client()
assert r.ping()
name = f"pylock-{proto}"

l1 = r.lock(name, timeout=5)
assert l1.acquire(blocking=False), "first acquire"
assert l1.owned() and l1.locked()
token = r.execute_command("FENCE.TOKEN", name, l1.local.token)
assert isinstance(token, int) and token > 0, token
assert r.execute_command("FENCE.TOKEN", name, "not-the-holder") is None, "token only for its holder"

l2 = r2.lock(name, timeout=5)
assert not l2.acquire(blocking=False), "second owner must not get it"
t0 = time.monotonic()
assert not l2.acquire(blocking=True, blocking_timeout=0.5), "blocking acquire must time out"
assert time.monotonic() - t0 >= 0.4

assert l1.extend(10)
assert r.pttl(name) > 9000, r.pttl(name)
assert l1.reacquire()
assert r.pttl(name) > 4000

# A blocking acquire succeeds when the holder releases (from another thread).
l1.release()
l1 = r.lock(name, timeout=5, thread_local=False)
assert l1.acquire(blocking=False)
def release_soon():
    time.sleep(0.3)
    l1.release()

t = threading.Thread(target=release_soon)
t.start()
assert l2.acquire(blocking=True, blocking_timeout=5), "acquire after release"
t.join()
assert r.execute_command("FENCE.TOKEN", name, l2.local.token) > token, "a new grant has a larger token"
l2.release()

# Token mismatch: l1's lease runs out, l2 takes the lock; l1 still has its old token.
l1 = r.lock(name, timeout=0.3, thread_local=False)
assert l1.acquire(blocking=False)
time.sleep(0.6)
assert l2.acquire(blocking=False), "expired lock is free"
for op in (lambda: l1.extend(1), lambda: l1.reacquire(), lambda: l1.release()):
    try:
        op()
        raise AssertionError("expected LockNotOwnedError")
    except LockNotOwnedError:
        pass
assert l2.owned()
l2.release()
try:
    l2.release()
    raise AssertionError("expected LockError")
except LockError:
    pass

# Expiry in log time: a short lock frees itself with no traffic.
l3 = r.lock(name + "-short", timeout=0.3)
assert l3.acquire(blocking=False)
time.sleep(0.6)
assert r2.lock(name + "-short", timeout=1).acquire(blocking=False), "expired lock is free"

# Context manager, sleep and thread-local tokens.
with r.lock(name + "-ctx", timeout=2, blocking_timeout=1, sleep=0.05):
    assert r.exists(name + "-ctx") == 1
assert r.exists(name + "-ctx") == 0

# Native commands through the same client.
t = r.execute_command("LOCK.ACQUIRE", name + "-native", "me", 5000)
assert r.execute_command("LOCK.ACQUIRE", name + "-native", "me", 5000) == t
info = r.execute_command("LOCK.INFO", name + "-native")
if isinstance(info, dict):  # RESP3: a map
    info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
else:  # RESP2: the same map, flat
    assert info[0] in (b"owner", "owner"), info
    info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in zip(info[::2], info[1::2])}
assert info["token"] == t and info["holds"] == 2, info
assert r.execute_command("LOCK.RELEASE", name + "-native", "me", t) == 1
assert r.execute_command("LOCK.RELEASE", name + "-native", "me", t) == 1
assert r.execute_command("LOCK.INFO", name + "-native") is None
print("redis-py lock ok, protocol", proto)
