"""`exchange-broker db upgrade|current|downgrade` as a user runs them, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from persistence import migrate

REPO = Path(__file__).resolve().parents[2]

CORE_TABLES = {"vhosts", "users", "permissions", "exchanges", "queues", "bindings", "messages",
               "stream_offsets"}


def _head() -> str:
    head = ScriptDirectory.from_config(migrate.make_config()).get_current_head()
    assert head
    return head


def _db(cwd, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for k in [k for k in env if k.startswith("EXCHANGE_BROKER_")]:
        del env[k]  # only the command line decides where the store is
    proc = subprocess.run([sys.executable, "-m", "exchange_broker", "db", *args], cwd=str(cwd),
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"db {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _printed(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return lines[-1].strip()


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


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
    assert _tables(url) >= CORE_TABLES

    assert _printed(_db(cwd, "downgrade", *store, "base")) == "base"
    assert _tables(url) == set()

    assert _printed(_db(cwd, "upgrade", *store, "head")) == head
    assert _tables(url) >= CORE_TABLES
    assert migrate.current(url) == head
