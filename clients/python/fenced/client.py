"""The connection to a fenced cluster: retries that act once (``REQID``) across nodes.

Every write this package sends carries ``REQID client_id seq``: a random nonzero 63-bit
``client_id`` per :class:`FencedClient` (renewed in a forked child) and a ``seq`` counter.
A retry — after a lost connection, ``-TRYAGAIN`` or ``-TIMEOUT outcome unknown`` — reuses
the ``seq``, so the cluster answers it with the first attempt's outcome (the same token,
not a second hold) and never applies it twice (docs/resp.md, "Retries that act once").
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import redis
import redis.exceptions as rex

from .errors import CommandError, OutcomeUnknown, Unavailable

if TYPE_CHECKING:  # pragma: no cover
    from .events import LossListener

_TryAgain = getattr(rex, "TryAgainError", None)
_CONN_ERRORS: Tuple[type, ...] = (rex.ConnectionError, rex.TimeoutError, OSError)


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def flat_map(v: Any) -> Dict[str, Any]:
    """A reply map (RESP3 map, or RESP2 flat ``[k, v, k, v …]`` array) as a ``dict`` with
    ``str`` keys and ``str`` text values; nested ``holders`` become lists of dicts."""
    if isinstance(v, dict):
        items = list(v.items())
    else:
        seq = list(v)
        items = list(zip(seq[0::2], seq[1::2]))
    out: Dict[str, Any] = {}
    for k, val in items:
        k = _text(k)
        if k == "holders" and val is not None:
            out[k] = [flat_map(h) for h in val]
        elif k == "locks" and val is not None:
            out[k] = [_text(x) for x in val]
        else:
            out[k] = _text(val)
    return out


class FencedClient:
    """A handle on a fenced cluster through one or more redis-py clients (one per node).

    >>> fc = FencedClient.from_addresses(["10.0.0.1:7379", "10.0.0.2:7379"])
    >>> fc = FencedClient(redis.Redis(port=7379))     # one node is fine too

    Commands go to one node at a time; a connection error moves to the next node. The
    lock classes accept a ``FencedClient`` or a plain ``redis.Redis`` (wrapped in a
    ``FencedClient`` of its own, cached per ``redis.Redis`` object).

    :param nodes: a ``redis.Redis`` or a sequence of them (one per node).
    :param client_id: the ``REQID`` client id (default: random nonzero 63-bit).
    :param max_attempts: attempts per command, the first included.
    :param backoff_s: the first pause between attempts; doubles up to ``max_backoff_s``.
    :param deadline_s: no new attempt starts after this long.
    :param events: whether locks subscribe to the lock-loss channels (a second connection).
    """

    def __init__(
        self,
        nodes: Union["redis.Redis", Sequence["redis.Redis"]],
        *,
        client_id: Optional[int] = None,
        max_attempts: int = 8,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        deadline_s: float = 30.0,
        events: bool = True,
    ) -> None:
        self._nodes: List[redis.Redis] = [nodes] if isinstance(nodes, redis.Redis) else list(nodes)
        if not self._nodes:
            raise ValueError("FencedClient needs at least one node")
        if client_id is not None and not 0 < client_id < 2**64:
            raise ValueError("client_id must be nonzero and fit 64 bits")
        self._fixed_id = client_id is not None
        self._client_id = client_id if client_id is not None else self._random_id()
        self._pid = os.getpid()
        self._seq = itertools.count(1)
        self._owner_seq = itertools.count(1)
        self._mutex = threading.Lock()
        self._current = 0
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.deadline_s = deadline_s
        self.events_enabled = events
        self._listener: Optional["LossListener"] = None
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"
        self._owner_base = f"{host}/{os.getpid()}"

    @classmethod
    def from_addresses(cls, addresses: Iterable[Union[str, Tuple[str, int]]],
                       *, client_kwargs: Optional[Dict[str, Any]] = None,
                       **kwargs: Any) -> "FencedClient":
        """One ``redis.Redis`` per ``"host:port"`` (or ``(host, port)``). redis-py's own
        retries are turned off (this client retries, under the same ``REQID``, on the next
        node); ``client_kwargs`` go to every ``redis.Redis`` (``password``, ``ssl`` …)."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        ckw: Dict[str, Any] = {"socket_connect_timeout": 2.0, "socket_keepalive": True}
        ckw.update(client_kwargs or {})
        ckw.setdefault("retry", Retry(NoBackoff(), 0))
        nodes = []
        for a in addresses:
            if isinstance(a, str):
                host, _, port = a.rpartition(":")
                a = (host or "127.0.0.1", int(port))
            nodes.append(redis.Redis(host=a[0], port=int(a[1]), **ckw))
        return cls(nodes, **kwargs)

    # -- identity ---------------------------------------------------------------------

    @staticmethod
    def _random_id() -> int:
        return secrets.randbits(63) or 1

    def _check_fork(self) -> None:
        # A forked child must not reuse its parent's request ids.
        if os.getpid() != self._pid:
            with self._mutex:
                if os.getpid() != self._pid:
                    self._pid = os.getpid()
                    if not self._fixed_id:
                        self._client_id = self._random_id()
                    self._seq = itertools.count(1)
                    self._listener = None
                    self._owner_base = self._owner_base.rsplit("/", 1)[0] + f"/{self._pid}"

    @property
    def client_id(self) -> int:
        """The ``REQID`` client id of this process's requests."""
        self._check_fork()
        return self._client_id

    def next_seq(self) -> int:
        """A fresh ``REQID`` sequence number."""
        self._check_fork()
        with self._mutex:
            return next(self._seq)

    @property
    def owner_prefix(self) -> str:
        """The prefix of the owners this client makes up: ``host/pid/clientid-hex/``."""
        return f"{self._owner_base}/{self.client_id:x}/"

    def new_owner(self) -> str:
        """A fresh owner name, unique to this client object (``host/pid/clientid/n``)."""
        with self._mutex:
            n = next(self._owner_seq)
        return f"{self.owner_prefix}{n}"

    # -- nodes ------------------------------------------------------------------------

    @property
    def nodes(self) -> List["redis.Redis"]:
        """The redis-py clients, one per node."""
        return list(self._nodes)

    def node(self) -> "redis.Redis":
        """The node commands go to now."""
        return self._nodes[self._current % len(self._nodes)]

    def _rotate(self, failed: int) -> None:
        with self._mutex:
            if self._current == failed:
                self._current = (failed + 1) % len(self._nodes)

    def _pause(self, attempt: int, deadline: float) -> bool:
        pause = min(self.max_backoff_s, self.backoff_s * (2 ** attempt))
        pause *= 0.5 + secrets.randbelow(1000) / 2000.0  # jitter: 50–100 %
        if time.monotonic() + pause > deadline:
            return False
        time.sleep(pause)
        return True

    # -- commands ---------------------------------------------------------------------

    def call(self, *args: Any, reqid: bool = True) -> Any:
        """Run one command, with ``REQID client_id seq`` appended (``reqid=True``), retrying
        under the same ``seq`` on a lost connection, ``-TRYAGAIN`` and ``-TIMEOUT``.

        :raises CommandError: the server refused it (nothing applied).
        :raises Unavailable: every attempt was refused with nothing applied.
        :raises OutcomeUnknown: retries ran out and an attempt may have been applied.
        """
        full = list(args)
        if reqid:
            full += ["REQID", self.client_id, self.next_seq()]
        deadline = time.monotonic() + self.deadline_s
        maybe_applied = False
        last: Optional[BaseException] = None
        for attempt in range(self.max_attempts):
            idx = self._current % len(self._nodes)
            try:
                return self._nodes[idx].execute_command(*full)
            except rex.ResponseError as e:
                msg = str(e)
                if _TryAgain is not None and isinstance(e, _TryAgain):
                    msg = "TRYAGAIN " + msg if not msg.startswith("TRYAGAIN") else msg
                if msg.startswith("TRYAGAIN"):
                    last = e
                    self._rotate(idx)
                elif msg.startswith("TIMEOUT"):
                    # May have been applied: the same REQID is exactly the right retry.
                    last, maybe_applied = e, True
                else:
                    raise CommandError(f"{args[0]}: {msg}") from e
            except _CONN_ERRORS as e:
                # The command may have reached the node before the connection broke.
                last, maybe_applied = e, True
                self._rotate(idx)
            if attempt + 1 == self.max_attempts or not self._pause(attempt, deadline):
                break
        what = " ".join(str(a) for a in args[:3])
        if maybe_applied and reqid:
            raise OutcomeUnknown(f"{what}: outcome unknown after retries: {last}") from last
        raise Unavailable(f"{what}: cluster unavailable: {last}") from last

    def read(self, *args: Any) -> Any:
        """A read (``LOCK.INFO``, ``SESSION.INFO``): no ``REQID``, retried freely."""
        return self.call(*args, reqid=False)

    def lock_info(self, name: str) -> Optional[Dict[str, Any]]:
        """``LOCK.INFO name`` as a dict (``None`` if nobody holds it): ``owner``, ``token``,
        ``holds``, ``ttl_ms``, and where the server gives them ``session``, ``kind``,
        ``permits``, ``waiters``, ``holders`` (a list of dicts)."""
        v = self.read("LOCK.INFO", name)
        return None if v is None else flat_map(v)

    def session_info(self, session_id: int) -> Optional[Dict[str, Any]]:
        """``SESSION.INFO id`` as a dict (``None`` if the session is gone)."""
        v = self.read("SESSION.INFO", session_id)
        return None if v is None else flat_map(v)

    def force_unlock(self, name: str) -> bool:
        """``LOCK.FORCEUNLOCK name`` (administrative): ends every grant of ``name`` now."""
        return bool(self.call("LOCK.FORCEUNLOCK", name))

    # -- events -----------------------------------------------------------------------

    @property
    def events(self) -> "LossListener":
        """The lock-loss listener of this client (started on first use)."""
        self._check_fork()
        with self._mutex:
            if self._listener is None:
                from .events import LossListener

                self._listener = LossListener(self)
            return self._listener

    def close(self) -> None:
        """Stop the listener thread (the redis-py clients are the caller's to close)."""
        with self._mutex:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()


_wrapped: "weakref.WeakKeyDictionary[redis.Redis, FencedClient]" = weakref.WeakKeyDictionary()
_wrapped_lock = threading.Lock()


def as_client(c: Union[FencedClient, "redis.Redis"]) -> FencedClient:
    """``c`` itself if a :class:`FencedClient`, else the one cached for that ``redis.Redis``."""
    if isinstance(c, FencedClient):
        return c
    if not isinstance(c, redis.Redis):
        raise TypeError(f"expected a FencedClient or a redis.Redis, got {type(c).__name__}")
    with _wrapped_lock:
        fc = _wrapped.get(c)
        if fc is None:
            fc = _wrapped[c] = FencedClient(c)
        return fc
