"""`exchange-broker db upgrade|current|downgrade` as a user runs them, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic.script import ScriptDirectory

from eb_support import subprocess_env, table_names
from persistence import migrate

CORE_TABLES = {"vhosts", "users", "permissions", "exchanges", "queues", "bindings", "messages",
               "stream_offsets"}


def _head() -> str:
    head = ScriptDirectory.from_config(migrate.make_config()).get_current_head()
    assert head
    return head


def _db(cwd, *args: str) -> subprocess.CompletedProcess:
    # subprocess_env: no EXCHANGE_BROKER_* settings, only the command line decides where the store is
    proc = subprocess.run([sys.executable, "-m", "exchange_broker", "db", *args], cwd=str(cwd),
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"db {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _printed(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return lines[-1].strip()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_db_upgrade_current_downgrade_round_trip(kind, workdir, request):
    if kind == "sqlite":
        data = workdir / "store"  # created by the command
        store = ["--data-dir", str(data)]
        url = f"sqlite:///{data / 'broker.db'}"
    else:
        _name, url = request.getfixturevalue("pg_database")
        store = ["--database-url", url]
    head = _head()
    cwd = workdir  # not the repository: no alembic.ini to lean on

    assert _printed(_db(cwd, "upgrade", *store)) == head
    if kind == "sqlite":
        assert (data / "broker.db").is_file()
    assert _printed(_db(cwd, "current", *store)) == head
    assert table_names(url) >= CORE_TABLES

    assert _printed(_db(cwd, "downgrade", *store, "base")) == "base"
    assert table_names(url) == set()

    assert _printed(_db(cwd, "upgrade", *store, "head")) == head
    assert table_names(url) >= CORE_TABLES
    assert migrate.current(url) == head
