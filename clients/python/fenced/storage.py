"""The token check at the protected storage, for SQLite (stdlib ``sqlite3``).

A lock is not enough: a holder paused past its lease (GC, swap, SIGSTOP) wakes up still
believing it holds the lock, after the next holder has written. The storage must refuse
its writes. Both helpers compare and write **in one step**, so no check-then-write race:

* :func:`fenced_write` — per row: the row keeps the token that wrote it, and one SQL
  statement (an upsert whose update has ``WHERE excluded.token >= table.token``) writes only
  if the new token is not older. Enough when the lock protects single rows.
* :class:`FencedSQLite` — per lock: a fence table keeps the highest token each lock name
  has written with; :meth:`FencedSQLite.transaction` advances it (refusing an older token)
  and runs your writes in the same ``BEGIN IMMEDIATE`` transaction, so a stale holder
  writes *nothing*, whichever rows it touches.

Equal tokens pass (one holder writes many times); an older one raises :class:`StaleToken`.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from .errors import StaleToken

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def create_fenced_table(conn: sqlite3.Connection, table: str) -> None:
    """Create ``table(key TEXT PRIMARY KEY, value, token INTEGER NOT NULL)`` if missing:
    the layout :func:`fenced_write` and :func:`fenced_read` use."""
    t = _ident(table)
    conn.execute(f"CREATE TABLE IF NOT EXISTS {t} "
                 "(key TEXT PRIMARY KEY, value, token INTEGER NOT NULL)")
    conn.commit()


def fenced_write(conn: sqlite3.Connection, table: str, key: str, value: Any, token: int,
                 *, commit: bool = True) -> None:
    """Write ``value`` at ``key`` unless the row was written with a newer token — one
    statement::

        INSERT INTO t(key, value, token) VALUES (?, ?, ?)
        ON CONFLICT(key) DO UPDATE SET value = excluded.value, token = excluded.token
        WHERE excluded.token >= t.token

    :raises StaleToken: the row holds a newer token (nothing written).
    """
    t = _ident(table)
    cur = conn.execute(
        f"INSERT INTO {t}(key, value, token) VALUES (?, ?, ?) "
        f"ON CONFLICT(key) DO UPDATE SET value = excluded.value, token = excluded.token "
        f"WHERE excluded.token >= {t}.token",
        (key, value, int(token)),
    )
    if cur.rowcount == 0:
        current = conn.execute(f"SELECT token FROM {t} WHERE key = ?", (key,)).fetchone()
        if commit:
            conn.commit()
        raise StaleToken(f"token {token} is older than {current[0] if current else '?'} "
                         f"at {table}[{key!r}]", token=int(token),
                         current=current[0] if current else None)
    if commit:
        conn.commit()


def fenced_read(conn: sqlite3.Connection, table: str, key: str) -> Optional[tuple]:
    """``(value, token)`` at ``key``, or ``None``."""
    row = conn.execute(f"SELECT value, token FROM {_ident(table)} WHERE key = ?", (key,)).fetchone()
    return None if row is None else (row[0], row[1])


class FencedSQLite:
    """A per-lock fence in an SQLite database: the highest token each lock name has
    written with, in table ``fence_table`` (created if missing).

    >>> db = FencedSQLite(sqlite3.connect("app.db"))
    >>> with db.transaction("job", token) as conn:      # StaleToken if token is old
    ...     conn.execute("UPDATE accounts SET balance = ? WHERE id = ?", (10, 1))

    The connection should be in autocommit mode (``isolation_level=None``) or have no
    transaction open; :meth:`transaction` issues ``BEGIN IMMEDIATE`` itself.
    """

    def __init__(self, conn: sqlite3.Connection, fence_table: str = "fenced_fence") -> None:
        self.conn = conn
        self.fence_table = _ident(fence_table)
        if conn.in_transaction:
            conn.commit()
        conn.execute(f"CREATE TABLE IF NOT EXISTS {self.fence_table} "
                     "(name TEXT PRIMARY KEY, token INTEGER NOT NULL)")
        conn.commit()

    def fence(self, name: str) -> Optional[int]:
        """The highest token written with under ``name`` (``None``: never)."""
        row = self.conn.execute(f"SELECT token FROM {self.fence_table} WHERE name = ?",
                                (name,)).fetchone()
        return None if row is None else row[0]

    def _advance(self, name: str, token: int) -> None:
        f = self.fence_table
        cur = self.conn.execute(
            f"INSERT INTO {f}(name, token) VALUES (?, ?) "
            f"ON CONFLICT(name) DO UPDATE SET token = excluded.token "
            f"WHERE excluded.token >= {f}.token",
            (name, int(token)),
        )
        if cur.rowcount == 0:
            current = self.fence(name)
            raise StaleToken(f"token {token} is older than {current} for lock {name!r}",
                             token=int(token), current=current)

    @contextmanager
    def transaction(self, name: str, token: int) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``; check and advance the fence of ``name`` to ``token``; run
        the body; ``COMMIT`` — or ``ROLLBACK`` on :class:`StaleToken` or any error, so a
        stale holder's writes never land."""
        c = self.conn
        if c.in_transaction:
            c.commit()
        c.execute("BEGIN IMMEDIATE")
        try:
            self._advance(name, token)
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        else:
            c.execute("COMMIT")

    def write(self, name: str, token: int, sql: str, params: Any = ()) -> int:
        """One fenced statement: :meth:`transaction` around ``conn.execute(sql, params)``.
        Returns its rowcount."""
        with self.transaction(name, token) as c:
            return c.execute(sql, params).rowcount
