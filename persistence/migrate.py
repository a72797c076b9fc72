"""Run the alembic migrations programmatically (no cwd-relative alembic.ini needed).

alembic is imported only when a migration runs (or is asked about): a process whose store is at
the newest revision already (``is_at_head``) starts without it (about a quarter of a second)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from alembic.config import Config

_REVISION = re.compile(r'^(down_revision|revision)\b[^=]*=\s*(.+?)\s*$', re.MULTILINE)


def migrations_dir() -> Path:
    """Folder of the installed ``migrations`` package (shipped next to ``persistence``)."""
    import migrations

    return Path(migrations.__file__).resolve().parent


def head_revisions() -> frozenset[str]:
    """The newest revisions of migrations/versions, read from each file's ``revision`` and
    ``down_revision`` lines without alembic; empty when a file is not written that way (then
    only alembic can say)."""
    revisions, parents = set(), set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        found = dict((key, value) for key, value in _REVISION.findall(path.read_text()))
        revision, down = found.get("revision", ""), found.get("down_revision", "")
        if not re.fullmatch(r'"[^"]+"', revision) or not re.fullmatch(r'None|"[^"]+"', down):
            return frozenset()  # a tuple of parents, a computed name, ...: leave it to alembic
        revisions.add(revision.strip('"'))
        if down != "None":
            parents.add(down.strip('"'))
    return frozenset(revisions - parents)


def stored_revisions(connection: Connection) -> frozenset[str]:
    """The revisions alembic recorded in this database (empty: none, or no schema yet)."""
    if not inspect(connection).has_table("alembic_version"):
        return frozenset()
    return frozenset(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())


def is_at_head(connection: Connection) -> bool:
    """Whether the schema is at the newest revision already (nothing to migrate)."""
    heads = head_revisions()
    return bool(heads) and stored_revisions(connection) == heads


def make_config(url: str | None = None, connection: Connection | None = None) -> "Config":
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        # configparser interpolation: a literal '%' (e.g. in URL-encoded options) must be doubled
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        cfg.attributes["url"] = url
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _engine(url: str):
    from sqlalchemy import pool

    from .database_url import parse
    return parse(url).engine(poolclass=pool.NullPool)  # libpq's URLs too (several hosts, service, ...)


def _run(step, url: str, revision: str) -> None:
    from alembic import command

    step = getattr(command, step)
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            step(make_config(connection=conn), revision)
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    _run("upgrade", url, revision)


def downgrade(url: str, revision: str) -> None:
    _run("downgrade", url, revision)


def upgrade_connection(connection: Connection, revision: str = "head") -> None:
    """Upgrade using a caller-owned connection (the caller commits)."""
    from alembic import command

    command.upgrade(make_config(connection=connection), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
