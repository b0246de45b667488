"""The exceptions of the fenced client. Every one of them is a :class:`FencedError`."""

from __future__ import annotations

from typing import Optional


class FencedError(Exception):
    """Base class of every error this package raises."""


class CommandError(FencedError):
    """The server refused the command (an ``-ERR …`` reply): bad arguments, a lock of
    another kind, a permission refusal. Nothing was applied."""


class Unavailable(FencedError):
    """No attempt of the command can have taken effect (only ``-TRYAGAIN`` answers): sending
    it again, even as a new command, is safe."""


class OutcomeUnknown(FencedError):
    """Every retry ran out and at least one attempt **may** have been applied (a
    ``-TIMEOUT outcome unknown`` answer or a connection lost with the command in flight).
    Look (``LOCK.INFO``) before acting again."""


class NotAcquired(FencedError):
    """A context manager could not acquire its lock within its wait."""


class LockLost(FencedError):
    """A lock you held is no longer yours: its release or renewal answered 0, its session
    is gone, or a lock-loss event said it ended. From the moment it was lost another holder
    may exist; only the fencing token checked at the storage protects your data."""

    def __init__(self, message: str, *, name: Optional[str] = None,
                 token: Optional[int] = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.name = name
        self.token = token
        self.reason = reason


class SessionLost(LockLost):
    """The session no longer exists (it lapsed or was closed): every lock taken in it is
    lost."""


class StaleToken(FencedError):
    """The protected storage refused a write: a newer fencing token has written there."""

    def __init__(self, message: str, *, token: Optional[int] = None,
                 current: Optional[int] = None) -> None:
        super().__init__(message)
        self.token = token
        self.current = current
