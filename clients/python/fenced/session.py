"""Sessions: locks that live as long as a client keeps a session alive (ZooKeeper's and
etcd's model): ``SESSION.OPEN``, ``SESSION.KEEPALIVE`` every ttl/3 on a daemon thread,
``SESSION.CLOSE``."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Type

from .client import FencedClient, as_client
from .errors import FencedError, LockLost, SessionLost
from .events import SESSION_CHANNEL, LossEvent

if TYPE_CHECKING:  # pragma: no cover
    from types import TracebackType

    from .locks import ClientLike, Lock, MultiLock, RWLock, Semaphore, _Grant

log = logging.getLogger("fenced")


class Session:
    """A fenced session. Locks taken in it (:meth:`lock`, :meth:`rwlock`,
    :meth:`semaphore`, :meth:`multilock`, or ``session=`` on any lock class) need no
    renewal and end with it.

    >>> with Session(r, ttl_ms=6_000) as s:
    ...     with s.lock("job", wait_ms=5_000) as token:
    ...         ...

    A daemon thread sends ``SESSION.KEEPALIVE`` every ``ttl_ms/3`` (``keepalive=False``:
    call :meth:`keepalive` yourself). When the session is gone — the keep-alive answers
    nil, a ``session_gone`` event arrives, or no keep-alive succeeded for a whole TTL — the
    session and every lock in it are marked lost (:class:`SessionLost`, a
    :class:`LockLost`) and ``on_lost(session, error)`` is called.
    """

    def __init__(
        self,
        client: "ClientLike",
        ttl_ms: int = 10_000,
        *,
        keepalive: bool = True,
        on_lost: Optional[Callable[["Session", LockLost], None]] = None,
        events: Optional[bool] = None,
    ) -> None:
        self.client: FencedClient = as_client(client)
        self.ttl_ms = int(ttl_ms)
        self.auto_keepalive = keepalive
        self.on_lost = on_lost
        self.events = self.client.events_enabled if events is None else events
        self._id: Optional[int] = None
        self._closed = False
        self._lost: Optional[SessionLost] = None
        self._mutex = threading.RLock()
        self._grants: "weakref.WeakSet[_Grant]" = weakref.WeakSet()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_ok = 0.0

    # -- state ------------------------------------------------------------------------

    @property
    def id(self) -> Optional[int]:
        """The session id (``None`` before :meth:`open`; kept after :meth:`close`)."""
        return self._id

    @property
    def lost(self) -> Optional[SessionLost]:
        return self._lost

    def check(self) -> int:
        """The id if the session is open and not known lost; else raises."""
        if self._lost is not None:
            raise self._lost
        if self._id is None or self._closed:
            raise FencedError("session is not open")
        return self._id

    # -- commands ---------------------------------------------------------------------

    def open(self) -> int:
        """``SESSION.OPEN``; starts the keep-alive thread. Returns the id."""
        with self._mutex:
            if self._id is not None and self._lost is None and not self._closed:
                return self._id
            sid = int(self.client.call("SESSION.OPEN", self.ttl_ms))
            self._id, self._lost, self._closed = sid, None, False
            self._last_ok = time.monotonic()
            if self.events:
                ev = self.client.events
                ev.register_session(self, sid)
                ev.subscribe(SESSION_CHANNEL.format(sid))
            if self.auto_keepalive:
                self._stop = stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(stop,),
                                                name=f"fenced-session-{sid}", daemon=True)
                self._thread.start()
            return sid

    def keepalive(self) -> int:
        """``SESSION.KEEPALIVE``: the lease left in ms.

        :raises SessionLost: the session no longer exists (its locks are gone).
        """
        sid = self.check()
        left = self.client.call("SESSION.KEEPALIVE", sid)
        if left is None:
            raise self._mark_lost("keep-alive: the session no longer exists", "session_gone")
        self._last_ok = time.monotonic()
        return int(left)

    def close(self) -> bool:
        """``SESSION.CLOSE``: releases every lock of the session. Returns whether the
        session still existed."""
        with self._mutex:
            self._stop.set()
            sid = self._id
            if sid is None or self._closed:
                return False
            self._closed = True
            if self.events:
                self.client.events.unregister_session(sid)
                self.client.events.unsubscribe(SESSION_CHANNEL.format(sid))
            for g in list(self._grants):
                g._forget()
            self._grants = weakref.WeakSet()
            return bool(self.client.call("SESSION.CLOSE", sid))

    def info(self) -> Optional[dict]:
        """``SESSION.INFO``: ``session``, ``ttl_ms``, ``locks`` (``None`` if gone)."""
        return None if self._id is None else self.client.session_info(self._id)

    # -- lock factories ---------------------------------------------------------------

    def lock(self, name: str, **kwargs: Any) -> "Lock":
        """A :class:`~fenced.Lock` taken in this session."""
        from .locks import Lock

        return Lock(self.client, name, session=self, **kwargs)

    def rwlock(self, name: str, **kwargs: Any) -> "RWLock":
        from .locks import RWLock

        return RWLock(self.client, name, session=self, **kwargs)

    def semaphore(self, name: str, permits: int, **kwargs: Any) -> "Semaphore":
        from .locks import Semaphore

        return Semaphore(self.client, name, permits, session=self, **kwargs)

    def multilock(self, names: Sequence[str], **kwargs: Any) -> "MultiLock":
        from .locks import MultiLock

        return MultiLock(self.client, names, session=self, **kwargs)

    # -- loss -------------------------------------------------------------------------

    def _add(self, grant: "_Grant") -> None:
        self._grants.add(grant)

    def _remove(self, grant: "_Grant") -> None:
        self._grants.discard(grant)

    def _mark_lost(self, why: str, reason: str) -> SessionLost:
        with self._mutex:
            if self._lost is not None:
                return self._lost
            err = SessionLost(f"session {self._id} lost: {why}", reason=reason)
            self._lost = err
            self._stop.set()
            grants: List["_Grant"] = list(self._grants)
        for g in grants:
            g._mark_lost(f"its session {self._id} is gone ({why})", reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self, err)
            except Exception:
                log.exception("session on_lost callback failed")
        return err

    def _on_loss_event(self, ev: LossEvent) -> None:
        if ev.reason == "session_gone" and ev.session == self._id:
            self._mark_lost(f"event session_gone on {ev.channel}", "session_gone")

    def _run(self, stop: threading.Event) -> None:
        period = max(self.ttl_ms / 3000.0, 0.01)
        while not stop.wait(period):
            try:
                self.keepalive()
            except LockLost:
                return
            except FencedError as e:
                if time.monotonic() - self._last_ok > self.ttl_ms / 1000.0:
                    self._mark_lost(f"no keep-alive succeeded for a whole ttl: {e}",
                                    "keepalive_failed")
                    return
            except Exception as e:  # never let the thread die silently
                log.warning("session %s keep-alive: %s", self._id, e)

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> "Session":
        self.open()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional["TracebackType"]) -> None:
        try:
            self.close()
        except FencedError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"<Session {self._id} ttl_ms={self.ttl_ms}{' lost' if self._lost else ''}>"
