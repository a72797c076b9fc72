"""Run the alembic migrations programmatically (no cwd-relative alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection


def migrations_dir() -> Path:
    """Folder of the installed ``migrations`` package (shipped next to ``persistence``)."""
    import migrations

    return Path(migrations.__file__).resolve().parent


def make_config(url: str | None = None, connection: Connection | None = None) -> Config:
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
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            step(make_config(connection=conn), revision)
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    _run(command.upgrade, url, revision)


def downgrade(url: str, revision: str) -> None:
    _run(command.downgrade, url, revision)


def upgrade_connection(connection: Connection, revision: str = "head") -> None:
    """Upgrade using a caller-owned connection (the caller commits)."""
    command.upgrade(make_config(connection=connection), revision)


def current(url: str) -> str | None:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
