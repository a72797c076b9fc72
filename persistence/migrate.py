"""Run the alembic migrations programmatically (no cwd-relative alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine
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


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(make_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(make_config(url), revision)


def upgrade_connection(connection: Connection, revision: str = "head") -> None:
    """Upgrade using a caller-owned connection (the caller commits)."""
    command.upgrade(make_config(connection=connection), revision)


def current(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
