"""fenced: a Python client for fenced's RESP lock family, on top of redis-py.

Locks with **fencing tokens** that survive failover: :class:`Lock` (exclusive, FIFO),
:class:`RWLock` (read-write), :class:`Semaphore` (permits, each with its own lease),
:class:`MultiLock` (all or none, one token), :class:`Session` (keep-alive on a thread);
retries that act once (``REQID``); lock-loss events (:class:`LossListener`); the token check
at an SQLite storage (:mod:`fenced.storage`).

>>> import redis, fenced
>>> r = redis.Redis(port=7379)
>>> with fenced.Lock(r, "job", ttl_ms=10_000, wait_ms=5_000) as token:
...     fenced.storage.fenced_write(db, "results", "job", "done", token)
"""

from . import storage
from .client import FencedClient, as_client
from .errors import (CommandError, FencedError, LockLost, NotAcquired, OutcomeUnknown,
                     SessionLost, StaleToken, Unavailable)
from .events import LossEvent, LossListener
from .locks import Lock, MultiLock, Permit, ReadLock, RWLock, Semaphore, WriteLock
from .session import Session
from .storage import FencedSQLite, fenced_write

__version__ = "0.1.0"

__all__ = [
    "FencedClient", "as_client",
    "Lock", "RWLock", "ReadLock", "WriteLock", "Semaphore", "Permit", "MultiLock", "Session",
    "LossEvent", "LossListener",
    "FencedError", "CommandError", "Unavailable", "OutcomeUnknown", "NotAcquired", "LockLost",
    "SessionLost", "StaleToken",
    "storage", "FencedSQLite", "fenced_write",
]
