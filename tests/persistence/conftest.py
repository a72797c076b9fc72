"""Fixtures: real SQLite files in tmp_path and throwaway databases on the local PostgreSQL
(``pg_database`` from tests/conftest.py)."""

from __future__ import annotations

from typing import Iterator

import pytest
from sqlalchemy.engine import Engine

from eb_support import pg_admin_engine
from persistence import SqlStore


@pytest.fixture
def pg_admin() -> Engine:
    """Autocommit engine on the PostgreSQL maintenance database (skips if unreachable)."""
    return pg_admin_engine()


@pytest.fixture
def pg_url(pg_database) -> str:
    """URL of a fresh, empty PostgreSQL database, dropped (WITH FORCE) afterwards."""
    return pg_database[1]


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
