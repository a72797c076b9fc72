"""Fixtures: real SQLite files in tmp_path and throwaway databases on the local PostgreSQL."""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from persistence import SqlStore

PG_ADMIN_URL = os.environ.get(
    "EB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

_pg_admin: Engine | None = None
_pg_error: str | None = None


def _pg_admin_engine() -> Engine:
    """Autocommit engine on the maintenance database; skips the test if PostgreSQL is unreachable."""
    global _pg_admin, _pg_error
    if _pg_admin is None and _pg_error is None:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            _pg_admin = engine
        except Exception as exc:  # noqa: BLE001 - any failure means "no PostgreSQL here"
            engine.dispose()
            _pg_error = f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc.__class__.__name__}: {exc}"
    if _pg_admin is None:
        pytest.skip(_pg_error or "PostgreSQL unreachable")
    return _pg_admin


@pytest.fixture
def pg_admin() -> Engine:
    """Autocommit engine on the PostgreSQL maintenance database (skips if unreachable)."""
    return _pg_admin_engine()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped (WITH FORCE) afterwards."""
    admin = _pg_admin_engine()
    name = f"eb_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'broker.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(fixture)


@pytest.fixture
def store(db_url) -> Iterator[SqlStore]:
    s = SqlStore(db_url)
    s.open()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session", autouse=True)
def _dispose_pg_admin() -> Iterator[None]:
    yield
    if _pg_admin is not None:
        _pg_admin.dispose()
