from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from eb_support import table_names
from persistence import SqlStore, migrate
from persistence.models import Base

TABLES = {
    "vhosts", "users", "permissions", "exchanges", "queues", "bindings", "messages", "stream_offsets",
    "delayed_messages", "policies", "vhost_limits", "user_limits", "topic_permissions",
    "cluster_nodes", "queue_leases", "cluster_counters",
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


def test_sqlite_file_is_created_in_data_dir(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = SqlStore(f"sqlite:///{data_dir / 'broker.db'}")
    store.open()
    store.close()
    assert Path(data_dir / "broker.db").is_file()
