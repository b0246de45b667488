"""The lock family: :class:`Lock`, :class:`RWLock` (:class:`ReadLock`, :class:`WriteLock`),
:class:`Semaphore` (:class:`Permit`) and :class:`MultiLock`.

Every grant has a **fencing token** (:attr:`token`): the store revision of the command
that granted it, larger than every token granted before it. Pass it with every write to the
storage the lock protects and have the storage refuse older ones (:mod:`fenced.storage`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Type,
                    Union)

import redis

from .client import FencedClient, as_client
from .errors import CommandError, FencedError, LockLost, NotAcquired
from .events import LAGGED_CHANNEL, OWNER_CHANNEL, LossEvent

if TYPE_CHECKING:  # pragma: no cover
    from types import TracebackType

    from .session import Session

log = logging.getLogger("fenced")

ClientLike = Union[FencedClient, "redis.Redis"]
LostCallback = Callable[["_Grant", LockLost], None]

#: Lock-loss reasons that mean a grant this process holds has ended.
ENDED = ("released", "expired", "session_expired", "session_closed", "force_unlocked")


class _Grant:
    """What every lock object shares: acquire, release, renew, loss, context manager.

    Not thread-safe for concurrent acquire/release on one object from several threads;
    use one object per thread (with the same ``owner`` for reentrancy across objects).
    """

    #: The names this grant covers (one, except for :class:`MultiLock`).
    names: List[str]

    def __init__(
        self,
        client: ClientLike,
        *,
        ttl_ms: int = 30_000,
        wait_ms: int = 0,
        owner: Optional[str] = None,
        session: Optional["Session"] = None,
        delay_ms: Optional[int] = None,
        auto_renew: bool = False,
        on_lost: Optional[LostCallback] = None,
        events: Optional[bool] = None,
    ) -> None:
        self.client = as_client(client if session is None else session.client)
        self.ttl_ms = int(ttl_ms)
        self.wait_ms = int(wait_ms)
        self.owner = owner if owner is not None else self.client.new_owner()
        self._owner_given = owner is not None
        self.session = session
        self.delay_ms = delay_ms
        self.auto_renew = auto_renew and session is None
        self.on_lost = on_lost
        self.events = self.client.events_enabled if events is None else events
        self._token: Optional[int] = None
        self._holds = 0
        self._lost: Optional[LockLost] = None
        self._mutex = threading.RLock()
        self._watchdog: Optional[threading.Thread] = None
        self._stop_watchdog = threading.Event()
        self._registered = False
        self._subscribed = False

    # -- state ------------------------------------------------------------------------

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the grant held (``None`` if not held)."""
        return self._token if self._holds else None

    @property
    def held(self) -> bool:
        """Whether this object believes it holds the grant (acquired, not released, not
        known lost). Only the storage's token check is proof."""
        return self._holds > 0 and self._lost is None

    @property
    def holds(self) -> int:
        """How many times this object acquired without releasing (reentrancy)."""
        return self._holds

    @property
    def lost(self) -> Optional[LockLost]:
        """The :class:`LockLost` that ended the grant, if it was lost."""
        return self._lost

    def check(self) -> int:
        """The token if still held; raises :class:`LockLost` if lost, :class:`FencedError`
        if never acquired."""
        if self._lost is not None:
            raise self._lost
        if not self._holds or self._token is None:
            raise FencedError(f"{self._what()} is not held")
        return self._token

    def _what(self) -> str:
        return f"lock {','.join(self.names)}"

    # -- the commands -----------------------------------------------------------------

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        raise NotImplementedError

    def _options(self, wait_ms: int) -> List[Any]:
        opts: List[Any] = []
        if wait_ms:
            opts += ["WAIT", int(wait_ms)]
        if self.session is not None:
            opts += ["SESSION", self.session.check()]
        if self.delay_ms:
            opts += ["DELAY", int(self.delay_ms)]
        return opts

    def acquire(self, wait_ms: Optional[int] = None, *, ttl_ms: Optional[int] = None) -> Optional[int]:
        """Acquire, waiting server-side (FIFO) up to ``wait_ms`` (default: the object's
        ``wait_ms``; 0 tries once). Returns the fencing token, or ``None`` if not granted.
        Acquiring again while held is reentrant: the same token, one more hold.

        :raises CommandError: e.g. the name is a lock of another kind.
        :raises OutcomeUnknown: retries ran out with an attempt that may have been granted
            (look with ``LOCK.INFO``).
        """
        wait = self.wait_ms if wait_ms is None else int(wait_ms)
        ttl = self.ttl_ms if ttl_ms is None else int(ttl_ms)
        if self.session is not None:
            ttl = 0
        with self._mutex:
            if self._lost is not None and self._holds:
                # A fresh start after a loss.
                self._forget()
            self._listen()
            reply = self.client.call(*self._acquire_command(ttl), *self._options(wait))
            if reply is None:
                return None
            token = int(reply)
            if self._holds and token != self._token:
                # The old grant ended without us hearing of it: this is a new one.
                self._forget()
            self._token = token
            self._holds += 1
            self._lost = None
            if self._holds == 1:
                self._register()
                if self.auto_renew:
                    self._start_watchdog()
            return token

    def release(self) -> None:
        """Drop one hold (the last one frees the grant).

        :raises LockLost: the server did not hold it with this token any more (or it was
            known lost): another holder may have written meanwhile.
        """
        with self._mutex:
            if not self._holds or self._token is None:
                raise FencedError(f"{self._what()} is not held")
            lost = self._lost
            if self._holds == 1:
                self._unregister()
                self._stop_watchdog.set()
            try:
                ok = self._release_command()
            finally:
                self._holds -= 1
            if not ok and lost is None:
                lost = self._make_lost("release answered 0: not held with this token", "not_held")
            if lost is not None or self._holds == 0:
                self._forget()
                self._lost = lost
            if lost is not None:
                raise lost

    def _release_command(self) -> bool:
        return bool(self.client.call("LOCK.RELEASE", self.names[0], self.owner, self._token))

    def renew(self, ttl_ms: Optional[int] = None) -> None:
        """Extend the lease to ``ttl_ms`` from now (default: the object's ``ttl_ms``).
        Not for a grant in a session (keep the session alive instead).

        :raises LockLost: the grant was not held with this token any more.
        """
        if self.session is not None:
            raise FencedError(f"{self._what()} lives in session {self.session.id}: "
                              "keep the session alive instead of renewing")
        with self._mutex:
            token = self.check()
            ttl = self.ttl_ms if ttl_ms is None else int(ttl_ms)
            if not self._renew_command(token, ttl):
                raise self._mark_lost("renew answered 0: not held with this token", "not_held")

    def _renew_command(self, token: int, ttl: int) -> bool:
        return bool(self.client.call("LOCK.RENEW", self.names[0], self.owner, token, ttl))

    def verify(self) -> bool:
        """Ask ``LOCK.INFO`` whether the server still lists this grant; if not, mark it lost.
        Returns whether it is still held."""
        if not self.held:
            return False
        token = self._token
        for name in self.names:
            info = self.client.lock_info(name)
            holders = (info or {}).get("holders")
            if holders is None and info is not None:
                holders = [info]
            if not any(int(h.get("token", -1)) == token and h.get("owner") == self.owner
                       for h in holders or []):
                if self._token == token and self._holds:
                    self._mark_lost(f"LOCK.INFO {name} no longer lists token {token}", "verified")
                return False
        return True

    # -- loss -------------------------------------------------------------------------

    def _make_lost(self, why: str, reason: str) -> LockLost:
        return LockLost(f"{self._what()} (owner {self.owner}, token {self._token}) lost: {why}",
                        name=self.names[0], token=self._token, reason=reason)

    def _mark_lost(self, why: str, reason: str) -> LockLost:
        """Record the loss, stop renewing, call ``on_lost``; returns the error."""
        with self._mutex:
            if self._lost is not None:
                return self._lost
            err = self._make_lost(why, reason)
            self._lost = err
            self._stop_watchdog.set()
            self._unregister()
        if self.on_lost is not None:
            try:
                self.on_lost(self, err)
            except Exception:
                log.exception("on_lost callback failed")
        return err

    def _on_loss_event(self, ev: LossEvent) -> None:
        if ev.reason in ENDED and ev.token == self._token and self._holds:
            self._mark_lost(f"event {ev.reason} on {ev.channel}", ev.reason)

    # -- bookkeeping ------------------------------------------------------------------

    def _listen(self) -> None:
        """Subscribe to this grant's loss channel before acquiring (if events are on)."""
        if not self.events or self._subscribed:
            return
        self._subscribed = True
        ev = self.client.events
        if self.session is not None:
            return  # the session listens on its own channel
        if self._owner_given:
            ev.subscribe(OWNER_CHANNEL.format(self.owner))
        else:
            # Every owner this client makes up shares one prefix: one pattern for all.
            prefix = OWNER_CHANNEL.format(self.client.owner_prefix)
            ev.subscribe(prefix + "*", pattern=True)
            # A pattern hears no `lagged` notice of its own: fenced sends one to
            # `fenced:lost:lagged` for pattern subscribers.
            ev.subscribe(LAGGED_CHANNEL)

    def _register(self) -> None:
        if self._token is None:
            return
        if self.events and not self._registered:
            for n in self.names:
                self.client.events.register(self, n, self._token)
            self._registered = True
        if self.session is not None:
            self.session._add(self)

    def _unregister(self) -> None:
        if self._registered and self._token is not None:
            for n in self.names:
                self.client.events.unregister(self, n, self._token)
        self._registered = False
        if self.session is not None:
            self.session._remove(self)

    def _forget(self) -> None:
        self._unregister()
        self._stop_watchdog.set()
        self._holds = 0
        self._token = None
        self._lost = None

    def _start_watchdog(self) -> None:
        self._stop_watchdog = stop = threading.Event()
        t = threading.Thread(target=self._watch, args=(stop,), name=f"fenced-renew-{self.names[0]}",
                             daemon=True)
        self._watchdog = t
        t.start()

    def _watch(self, stop: threading.Event) -> None:
        """Renew every ttl/3; lost when renew says 0 or no renewal succeeded for a TTL."""
        period = max(self.ttl_ms / 3000.0, 0.01)
        last_ok = time.monotonic()
        while not stop.wait(period):
            try:
                self.renew()
                last_ok = time.monotonic()
            except LockLost:
                return
            except FencedError as e:
                if isinstance(e, CommandError) or time.monotonic() - last_ok > self.ttl_ms / 1000.0:
                    self._mark_lost(f"no renewal for a whole ttl: {e}", "renew_failed")
                    return

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> int:
        token = self.acquire()
        if token is None:
            raise NotAcquired(f"{self._what()} not acquired within {self.wait_ms} ms")
        return token

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional["TracebackType"]) -> None:
        if exc_type is None:
            self.release()  # raises LockLost if the body may have run without the lock
        else:
            try:
                self.release()
            except FencedError:
                pass

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("held" if self._holds else "free")
        return f"<{type(self).__name__} {','.join(self.names)} owner={self.owner} token={self._token} {state}>"


class Lock(_Grant):
    """The exclusive, fair (FIFO) lock: ``LOCK.ACQUIRE``.

    >>> with Lock(r, "job", ttl_ms=10_000, wait_ms=5_000) as token:
    ...     write_with(token)

    :param client: a :class:`FencedClient` or a ``redis.Redis``.
    :param name: the lock name.
    :param ttl_ms: the lease (ignored in a session).
    :param wait_ms: how long :meth:`acquire` and ``with`` wait by default (0: try once).
    :param owner: the holder's name (default: made up, unique to this object); objects with
        the same owner reenter each other's grant.
    :param session: take the lock in this :class:`~fenced.Session`.
    :param delay_ms: lock-delay after the grant expires (``DELAY``).
    :param auto_renew: renew every ``ttl_ms/3`` on a daemon thread while held.
    :param on_lost: ``on_lost(lock, LockLost)`` when the grant is found lost.
    :param events: subscribe to the lock-loss channel (default: the client's setting).
    """

    def __init__(self, client: ClientLike, name: str, **kwargs: Any) -> None:
        self.names = [name]
        super().__init__(client, **kwargs)

    @property
    def name(self) -> str:
        return self.names[0]

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        return ["LOCK.ACQUIRE", self.name, self.owner, ttl_ms]

    def info(self) -> Optional[Dict[str, Any]]:
        """``LOCK.INFO`` of this name."""
        return self.client.lock_info(self.name)


class ReadLock(Lock):
    """The shared side of a read-write lock: ``LOCK.READ``."""

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        return ["LOCK.READ", self.name, self.owner, ttl_ms]


class WriteLock(Lock):
    """The exclusive side of a read-write lock: ``LOCK.WRITE``."""

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        return ["LOCK.WRITE", self.name, self.owner, ttl_ms]


class RWLock:
    """A read-write lock: many readers, or one writer; a queued writer blocks new readers.

    >>> rw = RWLock(r, "table", ttl_ms=10_000)
    >>> with rw.read(wait_ms=1000) as token: ...
    >>> with rw.write(wait_ms=1000) as token: ...

    Each :meth:`read`/:meth:`write` call makes a new lock object (with an owner of its
    own unless ``owner=`` is given); the keyword arguments default to the RWLock's.
    """

    def __init__(self, client: ClientLike, name: str, **defaults: Any) -> None:
        self.client = as_client(client if defaults.get("session") is None else defaults["session"].client)
        self.name = name
        self.defaults = defaults

    def read(self, **kwargs: Any) -> ReadLock:
        """A new :class:`ReadLock` on this name."""
        return ReadLock(self.client, self.name, **{**self.defaults, **kwargs})

    def write(self, **kwargs: Any) -> WriteLock:
        """A new :class:`WriteLock` on this name."""
        return WriteLock(self.client, self.name, **{**self.defaults, **kwargs})

    def info(self) -> Optional[Dict[str, Any]]:
        return self.client.lock_info(self.name)


class Permit(Lock):
    """One permit of a :class:`Semaphore`: ``LOCK.PERMIT``, with its own lease and token (permits
    handed over by one release share that command's token)."""

    def __init__(self, client: ClientLike, name: str, permits: int, **kwargs: Any) -> None:
        self.permits = int(permits)
        super().__init__(client, name, **kwargs)

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        return ["LOCK.PERMIT", self.name, self.owner, self.permits, ttl_ms]


class Semaphore:
    """A counting semaphore of ``permits`` permits (Redisson's
    ``PermitExpirableSemaphore``): each :meth:`acquire` gives a :class:`Permit` with its
    own owner, lease and fencing token.

    >>> sem = Semaphore(r, "pool", permits=3, ttl_ms=10_000)
    >>> p = sem.acquire(wait_ms=1000)        # a Permit, or None
    >>> with sem.permit(wait_ms=1000) as token: ...
    """

    def __init__(self, client: ClientLike, name: str, permits: int, **defaults: Any) -> None:
        if not 1 <= int(permits) <= 65_536:
            raise ValueError("permits must be 1..=65536")
        self.client = as_client(client if defaults.get("session") is None else defaults["session"].client)
        self.name = name
        self.permits = int(permits)
        self.defaults = defaults

    def permit(self, **kwargs: Any) -> Permit:
        """A new, not yet acquired :class:`Permit` (a context manager)."""
        return Permit(self.client, self.name, self.permits, **{**self.defaults, **kwargs})

    def acquire(self, wait_ms: Optional[int] = None, **kwargs: Any) -> Optional[Permit]:
        """Acquire one permit: the :class:`Permit` (see its ``token``), or ``None``."""
        p = self.permit(**kwargs)
        return p if p.acquire(wait_ms) is not None else None

    def info(self) -> Optional[Dict[str, Any]]:
        return self.client.lock_info(self.name)


class MultiLock(_Grant):
    """Several names at once, all or none, with **one** token: ``LOCK.MACQUIRE`` /
    ``LOCK.MRELEASE``. A waiter waits in every queue at once, so there is no deadlock by
    order.

    >>> with MultiLock(r, ["a", "b", "c"], ttl_ms=10_000, wait_ms=2_000) as token: ...

    Renewal (and ``auto_renew``) sends ``LOCK.RENEW`` for each name with the shared token.
    """

    def __init__(self, client: ClientLike, names: Sequence[str], **kwargs: Any) -> None:
        names = list(names)
        if not 1 <= len(names) <= 64 or len(set(names)) != len(names):
            raise ValueError("a multi-lock takes 1..=64 distinct names")
        self.names = names
        super().__init__(client, **kwargs)

    def _acquire_command(self, ttl_ms: int) -> List[Any]:
        return ["LOCK.MACQUIRE", self.owner, ttl_ms, len(self.names), *self.names]

    def _release_command(self) -> bool:
        return bool(self.client.call("LOCK.MRELEASE", self.owner, self._token,
                                     len(self.names), *self.names))

    def _renew_command(self, token: int, ttl: int) -> bool:
        return all([bool(self.client.call("LOCK.RENEW", n, self.owner, token, ttl))
                    for n in self.names])
