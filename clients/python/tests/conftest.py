"""The cluster the suite runs against, from the environment tests/python_client.rs sets:

* ``FENCED_RESP_ADDRS`` — ``1=127.0.0.1:7379,2=…`` (node id = RESP address);
* ``FENCED_NODE_PIDS`` — ``1=4242,2=…`` (for the failover test's SIGKILL).

Run it with ``cargo test -p fenced-server --test python_client``; by hand, start a cluster
and set both variables.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable, Dict, Iterator

import pytest
import redis

import fenced


def _pairs(var: str) -> Dict[int, str]:
    raw = os.environ.get(var, "")
    out: Dict[int, str] = {}
    for part in filter(None, raw.split(",")):
        k, _, v = part.partition("=")
        out[int(k)] = v
    return out


ADDRS = _pairs("FENCED_RESP_ADDRS")
PIDS = {k: int(v) for k, v in _pairs("FENCED_NODE_PIDS").items()}


def pytest_configure(config: pytest.Config) -> None:
    if not ADDRS:
        raise pytest.UsageError(
            "FENCED_RESP_ADDRS is not set: run the suite with "
            "`cargo test -p fenced-server --test python_client` (it starts a cluster)")


def node_redis(node_id: int, **kw) -> redis.Redis:
    host, _, port = ADDRS[node_id].rpartition(":")
    kw.setdefault("socket_timeout", 20)
    kw.setdefault("socket_connect_timeout", 2)
    return redis.Redis(host=host, port=int(port), **kw)


def live_ids() -> list:
    return [i for i in sorted(ADDRS) if i not in KILLED]


KILLED: set = set()


@pytest.fixture
def addrs() -> Dict[int, str]:
    return dict(ADDRS)


@pytest.fixture
def pids() -> Dict[int, int]:
    return dict(PIDS)


@pytest.fixture
def fc() -> Iterator[fenced.FencedClient]:
    """A client over every live node."""
    c = fenced.FencedClient.from_addresses([ADDRS[i] for i in live_ids()],
                                           client_kwargs={"socket_timeout": 20})
    yield c
    c.close()


@pytest.fixture
def fc2() -> Iterator[fenced.FencedClient]:
    """A second, independent client (another client id, other owners)."""
    c = fenced.FencedClient.from_addresses([ADDRS[i] for i in reversed(live_ids())],
                                           client_kwargs={"socket_timeout": 20})
    yield c
    c.close()


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    """A plain redis-py client on a live node."""
    c = node_redis(live_ids()[0])
    yield c
    c.close()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name of this test's own."""
    return f"py-{request.node.name}-{uuid.uuid4().hex[:8]}"


def wait_until(what: str, cond: Callable[[], object], timeout: float = 10.0,
               step: float = 0.05) -> object:
    """Poll ``cond`` until truthy, at most ``timeout`` s; fails the test saying what."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)
