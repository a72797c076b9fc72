from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from eb_support import REPO, subprocess_env, table_names
from persistence import SqlStore, migrate
from persistence.models import Base

TABLES = {
    "vhosts", "users", "permissions", "exchanges", "queues", "bindings", "messages", "stream_offsets",
    "delayed_messages", "policies", "vhost_limits", "user_limits", "topic_permissions",
    "cluster_nodes", "queue_leases", "cluster_counters", "stream_chunks", "runtime_parameters",
    "mqtt_retained",
}


def _head() -> str:
    head = ScriptDirectory.from_config(migrate.make_config()).get_current_head()
    assert head is not None
    return head


def _diff(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()


def test_migrations_folder_ships_with_package():
    folder = migrate.migrations_dir()
    for name in ("env.py", "script.py.mako", "__init__.py", "versions/0001_initial.py",
                 "versions/0002_delayed_messages.py"):
        assert (folder / name).is_file(), name


def test_round_trip(db_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no alembic.ini in the cwd: config is built in code
    assert migrate.current(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == _head()
    assert table_names(db_url) == TABLES
    migrate.downgrade(db_url, "base")
    assert migrate.current(db_url) is None
    assert table_names(db_url) == set()
    migrate.upgrade(db_url, "head")
    assert migrate.current(db_url) == _head()
    assert table_names(db_url) == TABLES


def test_no_drift_between_models_and_migrations(db_url):
    migrate.upgrade(db_url)
    assert _diff(db_url) == []


def test_store_open_applies_migrations_and_is_idempotent(db_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = SqlStore(db_url)
    try:
        store.open()
        store.open()
        assert migrate.current(db_url) == _head()
        assert _diff(db_url) == []
    finally:
        store.close()
    again = SqlStore(db_url)  # re-open an existing database
    again.open()
    again.close()
    assert migrate.current(db_url) == _head()


def test_the_heads_read_without_alembic_are_alembics(db_url):
    assert migrate.head_revisions() == {_head()}
    store = SqlStore(db_url)
    try:
        store.open()
        with store.engine.connect() as conn:
            assert migrate.is_at_head(conn)
        assert store.schema_revision == _head()
    finally:
        store.close()


def test_a_store_at_the_newest_revision_opens_without_importing_alembic(tmp_path):
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    opened = ("import sys; from persistence.sql_store import SqlStore; s = SqlStore(sys.argv[1]); s.open(); "
              "s.close(); print(s.schema_revision, 'alembic' in sys.modules)")
    run = [sys.executable, "-c", opened, url]
    env = subprocess_env()
    first = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=str(REPO), env=env)
    assert first.stdout.split() == [_head(), "True"], first.stderr  # a new store: migrated
    again = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=str(REPO), env=env)
    assert again.stdout.split() == [_head(), "False"], again.stderr


def test_sqlite_file_is_created_in_data_dir(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = SqlStore(f"sqlite:///{data_dir / 'broker.db'}")
    store.open()
    store.close()
    assert Path(data_dir / "broker.db").is_file()


def test_0007_moves_stream_rows_into_chunks_and_back(db_url, tmp_path, monkeypatch):
    """A store written before 0007 (a stream's messages as rows of ``messages``, with a gap left
    by nothing and a classic queue beside it): the upgrade moves the stream's rows into chunks
    that read back the same, leaves the classic queue's rows alone; the downgrade restores rows."""
    from pamqp import encode as pencode
    from sqlalchemy import text

    monkeypatch.chdir(tmp_path)
    migrate.upgrade(db_url, "0006")
    stream_args = pencode.field_table({"x-queue-type": "stream"})
    rows = [{"q": 1, "s": s, "ex": "amq.direct" if s % 3 else "", "rk": f"k{s % 2}",
             "p": b"\x00\x00", "b": b"m%d" % s, "c": 1000 + s} for s in range(1, 5001)]
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            ins = text("INSERT INTO queues (id, vhost, name, durable, exclusive, auto_delete, "
                       "arguments, delivered_mark) VALUES (:id, '/', :n, true, false, false, :a, 0)")
            conn.execute(ins, {"id": 1, "n": "s", "a": stream_args})
            conn.execute(ins, {"id": 2, "n": "c", "a": b""})
            put = text("INSERT INTO messages (queue_id, seq, exchange, routing_key, properties, "
                       "body, created_ms, expires_ms, priority) VALUES (:q, :s, :ex, :rk, :p, :b, :c, "
                       "NULL, 0)")
            conn.execute(put, rows)
            conn.execute(put, [{**r, "q": 2} for r in rows[:10]])
        migrate.upgrade(db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM messages WHERE queue_id = 1")).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM messages WHERE queue_id = 2")).scalar() == 10
        store = SqlStore(db_url)
        store.open()
        try:
            got = store.read_log(1, 0, 10_000)
            assert got == [(r["s"], r["ex"], r["rk"], r["p"], r["b"], r["c"]) for r in rows]
            assert store.find_seq_at_time(1, 3500) == 2500
            assert store.load_definitions().queues[0]["message_count"] == 5000
        finally:
            store.close()
        migrate.downgrade(db_url, "0006")
        with engine.connect() as conn:
            back = conn.execute(text("SELECT seq, body, created_ms FROM messages WHERE queue_id = 1 "
                                     "ORDER BY seq")).all()
        assert [(s, bytes(b), c) for s, b, c in back] == [(r["s"], r["b"], r["c"]) for r in rows]
    finally:
        engine.dispose()
