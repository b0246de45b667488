"""Lock-loss events: a listener on a connection of its own.

fenced publishes every grant that ends on ``fenced:lost:session:<id>`` and
``fenced:lost:owner:<owner>``, one JSON object per message::

    {"name":"job","owner":"alice","token":42,"session":7,"reason":"expired"}

A RESP2 connection in subscribe mode cannot send commands, so the listener has its own
(redis-py's ``PubSub``), read by a daemon thread. An event that names a lock this process
still holds marks it lost (:attr:`fenced.Lock.lost`) and calls the callbacks.

**Events are a hint, the token check is the safety.** They are lossy (a slow subscriber, a
node restart, a failover, a paused process): the write to the protected storage must carry
the token and be checked there (:mod:`fenced.storage`). After a reconnect or a ``lagged``
event the listener checks the locks it knows with ``LOCK.INFO``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

import redis.exceptions as rex

if TYPE_CHECKING:  # pragma: no cover
    from .client import FencedClient

log = logging.getLogger("fenced.events")

SESSION_CHANNEL = "fenced:lost:session:{}"
OWNER_CHANNEL = "fenced:lost:owner:{}"
#: Where fenced says "lagged" for pattern subscribers (docs/resp.md, "Lock-loss events").
LAGGED_CHANNEL = "fenced:lost:lagged"


@dataclass(frozen=True)
class LossEvent:
    """One lock-loss message. ``reason`` is one of ``released``, ``expired``,
    ``session_expired``, ``session_closed``, ``force_unlocked``, ``session_gone`` (only
    ``session`` set) or ``lagged`` (events were lost: look with ``LOCK.INFO``)."""

    channel: str
    reason: str
    name: Optional[str] = None
    owner: Optional[str] = None
    token: Optional[int] = None
    session: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, channel: str, data: Any) -> "LossEvent":
        """Parse a message's JSON payload (an unparsable one becomes ``reason="unparsed"``)."""
        if isinstance(data, (bytes, bytearray)):
            data = data.decode("utf-8", "replace")
        try:
            obj = json.loads(data)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            return cls(channel=channel, reason="unparsed", raw={"data": data})

        def opt_int(k: str) -> Optional[int]:
            v = obj.get(k)
            return int(v) if isinstance(v, (int, str)) and str(v).lstrip("-").isdigit() else None

        return cls(
            channel=channel,
            reason=str(obj.get("reason", "")),
            name=obj.get("name"),
            owner=obj.get("owner"),
            token=opt_int("token"),
            session=opt_int("session"),
            raw=obj,
        )


Callback = Callable[[LossEvent], None]


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


class LossListener:
    """Subscribes to lock-loss channels on a connection of its own and tells the locks and
    sessions of this process that theirs ended. Made by :attr:`FencedClient.events`; the
    lock classes register with it themselves.

    :meth:`add_callback` adds a function called (on the listener thread) with every event
    received, whether or not it concerns a lock this process knows.
    """

    def __init__(self, client: "FencedClient", *, poll_s: float = 0.1) -> None:
        self._client = client
        self._poll_s = poll_s
        self._mutex = threading.Lock()
        self._channels: Set[str] = set()
        self._patterns: Set[str] = set()
        self._confirmed: Set[str] = set()
        self._pending: List[Tuple[str, str]] = []  # (op, channel)
        self._cond = threading.Condition(self._mutex)
        self._grants: Dict[Tuple[str, int], "weakref.WeakSet[Any]"] = {}
        self._sessions: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._callbacks: List[Callback] = []
        self._closed = threading.Event()
        self._node = client._current
        self._verify_needed = False
        self._thread = threading.Thread(target=self._run, name="fenced-events", daemon=True)
        self._thread.start()

    # -- what to listen for -----------------------------------------------------------

    def add_callback(self, fn: Callback) -> None:
        """Call ``fn(event)`` for every event received (on the listener thread)."""
        with self._mutex:
            self._callbacks.append(fn)

    def remove_callback(self, fn: Callback) -> None:
        with self._mutex:
            if fn in self._callbacks:
                self._callbacks.remove(fn)

    def subscribe(self, channel: str, *, pattern: bool = False, timeout: float = 2.0) -> bool:
        """Subscribe (idempotent) and wait up to ``timeout`` s for the server to confirm;
        returns whether it did (a late subscription still happens)."""
        with self._cond:
            subs = self._patterns if pattern else self._channels
            if channel in subs:
                # Asked before: confirmed, or on its way (do not wait again on every lock).
                return channel in self._confirmed
            subs.add(channel)
            self._pending.append(("psubscribe" if pattern else "subscribe", channel))
            end = time.monotonic() + timeout
            while channel not in self._confirmed and not self._closed.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return channel in self._confirmed

    def unsubscribe(self, channel: str, *, pattern: bool = False) -> None:
        """Stop listening on ``channel`` (no wait)."""
        with self._cond:
            subs = self._patterns if pattern else self._channels
            if channel in subs:
                subs.discard(channel)
                self._confirmed.discard(channel)
                self._pending.append(("punsubscribe" if pattern else "unsubscribe", channel))

    def register(self, grant: Any, name: str, token: int) -> None:
        """Route events about grant ``(name, token)`` to ``grant._on_loss_event``."""
        with self._mutex:
            self._grants.setdefault((name, token), weakref.WeakSet()).add(grant)

    def unregister(self, grant: Any, name: str, token: int) -> None:
        with self._mutex:
            s = self._grants.get((name, token))
            if s is not None:
                s.discard(grant)
                if not s:
                    del self._grants[(name, token)]

    def register_session(self, session: Any, session_id: int) -> None:
        with self._mutex:
            self._sessions[session_id] = session

    def unregister_session(self, session_id: int) -> None:
        with self._mutex:
            self._sessions.pop(session_id, None)

    def close(self) -> None:
        """Stop the thread and close the connection."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)

    # -- the thread -------------------------------------------------------------------

    def _dispatch(self, ev: LossEvent) -> None:
        with self._mutex:
            callbacks = list(self._callbacks)
            grants: List[Any] = []
            session = None
            if ev.name is not None and ev.token is not None:
                grants = list(self._grants.get((ev.name, ev.token), ()))
            if ev.session and ev.reason == "session_gone":
                session = self._sessions.get(ev.session)
        for g in grants:
            try:
                g._on_loss_event(ev)
            except Exception:  # a user callback inside must not stop the listener
                log.exception("lock-loss handler failed")
        if session is not None:
            try:
                session._on_loss_event(ev)
            except Exception:
                log.exception("session-loss handler failed")
        if ev.reason == "lagged":
            self._verify_needed = True
        for fn in callbacks:
            try:
                fn(ev)
            except Exception:
                log.exception("lock-loss callback failed")

    def _verify(self) -> None:
        """After lost events (reconnect, ``lagged``): ask ``LOCK.INFO`` about every grant
        known and mark those the server no longer lists lost."""
        with self._mutex:
            keys = list(self._grants.items())
        for (name, token), grants in keys:
            for g in list(grants):
                try:
                    g.verify()
                except Exception:
                    log.debug("verify of %s failed", name, exc_info=True)

    def _connect(self) -> Any:
        nodes = self._client.nodes
        node = nodes[self._node % len(nodes)]
        ps = node.pubsub()
        with self._cond:
            chans, pats = set(self._channels), set(self._patterns)
            self._pending.clear()
            self._confirmed.clear()
        if chans:
            ps.subscribe(*chans)
        if pats:
            ps.psubscribe(*pats)
        return ps

    def _run(self) -> None:
        ps = None
        failures = 0
        while not self._closed.is_set():
            try:
                if ps is None:
                    ps = self._connect()
                    if failures:
                        self._verify_needed = True
                    failures = 0
                with self._cond:
                    pending, self._pending = self._pending, []
                for op, ch in pending:
                    getattr(ps, op)(ch)
                if not (ps.subscribed or pending):
                    self._closed.wait(self._poll_s)
                    continue
                msg = ps.get_message(timeout=self._poll_s)
                if msg is not None:
                    self._handle(msg)
                if self._verify_needed:
                    self._verify_needed = False
                    self._verify()
            except (rex.ConnectionError, rex.TimeoutError, OSError) as e:
                log.debug("lock-loss listener: %s; reconnecting", e)
                try:
                    if ps is not None:
                        ps.close()
                except Exception:
                    pass
                ps = None
                failures += 1
                self._node += 1
                self._closed.wait(min(1.0, 0.05 * 2 ** min(failures, 5)))
            except Exception:
                log.exception("lock-loss listener")
                self._closed.wait(0.5)
        if ps is not None:
            try:
                ps.close()
            except Exception:
                pass

    def _handle(self, msg: Dict[str, Any]) -> None:
        kind = _text(msg.get("type"))
        if kind in ("subscribe", "psubscribe"):
            with self._cond:
                self._confirmed.add(_text(msg.get("channel")))
                self._cond.notify_all()
        elif kind in ("message", "pmessage"):
            ev = LossEvent.parse(_text(msg.get("channel")), msg.get("data"))
            self._dispatch(ev)
