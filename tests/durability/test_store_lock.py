"""One broker per store: a second `exchange-broker serve` on the same SQLite store or the same
PostgreSQL database refuses to start with one line naming the holder (pid, host, since), exit 1;
the first keeps serving its persistent messages exactly once; a SIGKILLed broker's lock goes
with it, so the store can be opened again at once.
"""

from __future__ import annotations

import calendar
import re
import socket
import subprocess
import sys
import time

from sqlalchemy import text

from durability_helpers import PERSISTENT, connect, drain, message_count
from eb_support import SubprocessBroker, close_quietly, pg_admin_engine, subprocess_env, wait_until

REFUSAL = re.compile(r"^exchange-broker: cannot start: the store (?P<store>\S+) is in use by another "
                     r"exchange-broker \(pid (?P<pid>\d+) on host (?P<host>\S+) since "
                     r"(?P<since>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\); stop it first$")


def second_broker(workdir, args: list[str]) -> subprocess.CompletedProcess:
    """A second `serve` on the store of ``args``: run to its end (it must not start)."""
    cmd = SubprocessBroker(workdir, args).command(workdir / "port-second")
    return subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def assert_refused(proc: subprocess.CompletedProcess, holder: SubprocessBroker) -> re.Match:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, nothing logged before it
    m = REFUSAL.match(lines[0])
    assert m, lines[0]
    assert int(m["pid"]) == holder.pid
    assert m["host"] == socket.gethostname()
    since = calendar.timegm(time.strptime(m["since"], "%Y-%m-%dT%H:%M:%SZ"))
    assert time.time() - 300 < since <= time.time() + 1, m["since"]
    return m


def test_a_second_broker_on_the_same_store_is_refused(backend, broker_factory, workdir):
    first = broker_factory()
    conn = connect(first)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("held", durable=True)
        for i in range(20):
            ch.basic_publish("", "held", f"m{i}".encode(), PERSISTENT)

        # the same store named both ways: the data dir, and (SQLite) the database file's URL
        attempts = [backend.args]
        if backend.name == "sqlite":
            attempts.append(["--database-url", backend.url])
        else:
            attempts.append(["--database-url", backend.url.replace("postgresql+psycopg://", "postgres://")])
        for args in attempts:
            m = assert_refused(second_broker(workdir, args), first)
            assert m["store"].endswith("broker.db" if backend.name == "sqlite" else backend.dbname)

        # the first broker goes on; each persistent message is delivered once
        assert first.alive()
        got = drain(conn, "held", expected=20)
        assert sorted(body for body, _ in got) == sorted(f"m{i}".encode() for i in range(20))
        assert message_count(conn, "held") == 0
        for i in range(3):
            ch.basic_publish("", "held", f"after{i}".encode(), PERSISTENT)
    finally:
        close_quietly(conn)

    # SIGKILL: the OS (SQLite) or the server (PostgreSQL) releases the lock; a new broker starts
    first.kill()
    second = broker_factory()
    conn = connect(second)
    try:
        got = drain(conn, "held", expected=3)
        assert sorted(body for body, _ in got) == [b"after0", b"after1", b"after2"]
        assert drain(conn, "held", idle=0.5) == []
    finally:
        close_quietly(conn)
    assert second.terminate() == 0
    assert "Traceback" not in second.log()


def test_sqlite_lock_file_names_the_holder_and_is_emptied_on_a_clean_stop(spawn_broker, workdir):
    data = workdir / "data"
    b = spawn_broker("--data-dir", str(data))
    lock_file = data / "broker.db.lock"
    assert f'"pid": {b.pid}' in lock_file.read_text()
    assert b.terminate() == 0
    assert lock_file.read_text() == ""  # no stale holder named after a clean stop
    assert "Traceback" not in b.log()


def test_db_upgrade_is_refused_while_a_broker_holds_the_store(spawn_broker, workdir):
    data = workdir / "data"
    b = spawn_broker("--data-dir", str(data))
    proc = subprocess.run([sys.executable, "-m", "exchange_broker", "db", "upgrade", "--data-dir", str(data)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("exchange-broker db upgrade: error: the store ")
    assert f"(pid {b.pid} on host" in proc.stderr and "Traceback" not in proc.stderr
    assert b.alive()


def test_postgres_lock_is_taken_again_after_its_session_is_terminated(pg_backend, pg_broker_factory, workdir):
    """An outage ends the session that holds the advisory lock: the broker takes it again when
    the database answers, so a second broker is still refused afterwards."""
    first = pg_broker_factory()
    with pg_admin_engine().connect() as admin:
        killed = admin.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = :d AND application_name LIKE 'exchange-broker %'"), {"d": pg_backend.dbname}).scalar()
    assert killed == 1
    assert first.wait_for_log("the store lock is held again", 20), first.log()[-3000:]
    assert_refused(second_broker(workdir, pg_backend.args), first)
    conn = connect(first)
    try:
        conn.channel().queue_declare("still-served", durable=True)
    finally:
        close_quietly(conn)
    assert wait_until(lambda: first.alive(), 1)
