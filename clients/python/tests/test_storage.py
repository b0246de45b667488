"""The token check at an SQLite storage, and a paused holder whose stale token is refused."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

import fenced
from fenced.storage import FencedSQLite, create_fenced_table, fenced_read, fenced_write
from conftest import ADDRS, live_ids


def test_fenced_write_one_statement(tmp_path):
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    create_fenced_table(conn, "kv")
    fenced_write(conn, "kv", "k", "v10", 10)
    fenced_write(conn, "kv", "k", "v10b", 10)  # the same holder again
    fenced_write(conn, "kv", "k", "v12", 12)
    with pytest.raises(fenced.StaleToken) as err:
        fenced_write(conn, "kv", "k", "stale", 11)
    assert err.value.current == 12
    assert fenced_read(conn, "kv", "k") == ("v12", 12)
    with pytest.raises(ValueError):
        fenced_write(conn, "kv; DROP TABLE kv", "k", "v", 13)


def test_fenced_sqlite_transaction_is_all_or_nothing(tmp_path):
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
    conn.execute("INSERT INTO accounts VALUES (1, 0), (2, 0)")
    db = FencedSQLite(conn)
    with db.transaction("job", 20) as c:
        c.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
    assert db.fence("job") == 20
    with pytest.raises(fenced.StaleToken):
        with db.transaction("job", 19) as c:
            c.execute("UPDATE accounts SET balance = 99 WHERE id = 2")
    assert db.write("job", 21, "UPDATE accounts SET balance = 7 WHERE id = 2") == 1
    assert conn.execute("SELECT balance FROM accounts ORDER BY id").fetchall() == [(5,), (7,)]
    assert db.fence("other") is None


HOLDER = textwrap.dedent("""
    import sqlite3, sys
    import fenced
    from fenced.storage import FencedSQLite
    addrs, name, db_path = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    fc = fenced.FencedClient.from_addresses(addrs, events=False)
    lock = fenced.Lock(fc, name, ttl_ms=700)
    token = lock.acquire(wait_ms=5000)
    print("TOKEN", token, flush=True)
    sys.stdin.readline()            # paused here (SIGSTOP) past the lease
    db = FencedSQLite(sqlite3.connect(db_path, isolation_level=None))
    try:
        db.write(name, token, "INSERT OR REPLACE INTO data VALUES ('k', ?)", ("from the paused holder",))
        print("WROTE", flush=True)
    except fenced.StaleToken as e:
        print("REFUSED", e.token, e.current, flush=True)
""")


def test_paused_holder_stale_token_is_refused(tmp_path, fc, name):
    db_path = str(tmp_path / "protected.sqlite")
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE data (k TEXT PRIMARY KEY, v TEXT)")
    db = FencedSQLite(conn)
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, ",".join(ADDRS[i] for i in live_ids()), name, db_path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("TOKEN"), (line, proc.stderr.read() if proc.poll() is not None else "")
        old = int(line.split()[1])
        os.kill(proc.pid, signal.SIGSTOP)  # a GC pause, a swap storm, a stopped VM
        proc.stdin.write("go\n")
        proc.stdin.flush()
        # The lease runs out while it is paused; the next holder gets the lock and writes.
        nxt = fenced.Lock(fc, name, ttl_ms=10_000)
        new = nxt.acquire(wait_ms=10_000)
        assert new is not None and new > old
        db.write(name, new, "INSERT OR REPLACE INTO data VALUES ('k', ?)", ("from the new holder",))
        os.kill(proc.pid, signal.SIGCONT)  # the paused holder wakes up and writes
        out, err = proc.communicate(timeout=20)
        assert out.startswith(f"REFUSED {old} {new}"), (out, err)
        assert conn.execute("SELECT v FROM data WHERE k = 'k'").fetchone() == ("from the new holder",)
        nxt.release()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
