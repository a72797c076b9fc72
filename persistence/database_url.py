"""The store's ``--database-url``, parsed once, and every database connection made from it.

PostgreSQL URLs are libpq's own (``postgresql://`` or ``postgres://``, ``postgresql+psycopg://``
too): libpq parses them and picks the host, so everything libpq takes works, the same for
every connection the broker opens:

* several hosts: ``postgresql://u@db1:5432,db2:5432/broker?target_session_attrs=read-write``
  (or ``primary``): libpq tries them in order and keeps the first that is the primary, so after
  a promotion every new connection goes to the new primary;
* ``sslmode``, ``sslrootcert``, ``application_name``, ``connect_timeout``, ... as query parameters;
* a ``service`` (``?service=broker``, from ``pg_service.conf``) and the ``PG*`` environment
  variables (``PGHOST``, ``PGPASSWORD``, ...; ``postgresql://`` alone takes everything from them).

SQLAlchemy's URL parser knows one host only, so the store's engine gets its connections from
:meth:`Database.engine`'s ``creator`` (psycopg with the libpq URL), never from SQLAlchemy's parse.
SQLite URLs (``sqlite:///path``) go to SQLAlchemy as they are.

Every error is a ValueError of one line that never shows the password.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

EXAMPLES = "postgresql://user:password@host/database or sqlite:////path/to/broker.db"
PG_SCHEMES = ("postgresql", "postgres")
# libpq's defaults would wait for ever on a host that drops packets: a connection attempt (per host)
# and unacknowledged data time out instead; an operator's own values win
DEFAULT_PARAMS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "10",
                  "keepalives_interval": "5", "keepalives_count": "3", "tcp_user_timeout": "20000"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Database:
    """A parsed ``--database-url``: ``url`` as the broker keeps it (``postgresql+psycopg://...`` or
    ``sqlite:///...``), ``backend`` (``postgresql`` or ``sqlite``) and, for PostgreSQL, ``conninfo``
    (the libpq URL given to psycopg) and ``params`` (libpq's keywords, as libpq parsed them)."""

    url: str
    backend: str
    conninfo: str = ""
    params: tuple[tuple[str, str], ...] = ()

    @property
    def is_postgres(self) -> bool:
        return self.backend == "postgresql"

    def param(self, name: str, default: str | None = None) -> str | None:
        return dict(self.params).get(name, default)

    @property
    def hosts(self) -> list[str]:
        """``host:port`` of each host the URL names (libpq's order); empty: libpq's default."""
        hosts = (self.param("host") or "").split(",") if self.param("host") else []
        ports = (self.param("port") or "").split(",")
        return [f"{h}:{ports[i] if i < len(ports) else ports[-1]}".rstrip(":") for i, h in enumerate(hosts)]

    def display(self) -> str:
        """The URL without its password (for logs and errors)."""
        return hide_password(self.url)

    def with_params(self, **values: str) -> "Database":
        """The same database with these libpq parameters set (e.g. ``application_name``)."""
        if not self.is_postgres:
            return self
        return parse(_set_query(self.url, {k: str(v) for k, v in values.items()}))

    def connect_params(self) -> dict[str, str]:
        """Extra keywords for psycopg.connect: the defaults the URL does not set itself."""
        given = dict(self.params)
        return {k: v for k, v in DEFAULT_PARAMS.items() if k not in given}

    def connect(self, **kwargs: Any):
        """A new psycopg connection (libpq picks the host: ``target_session_attrs`` and all)."""
        import psycopg
        return psycopg.connect(self.conninfo, **{**self.connect_params(), **kwargs})

    def engine(self, **kwargs: Any):
        """A SQLAlchemy engine on this database. PostgreSQL: every pooled connection is made by
        :meth:`connect`, so a multi-host URL works and the pool follows the primary."""
        from sqlalchemy import create_engine
        if not self.is_postgres:
            return create_engine(self.url, **kwargs)
        connect_args = kwargs.pop("connect_args", {})
        return create_engine("postgresql+psycopg://", creator=lambda: self.connect(**connect_args), **kwargs)


def hide_password(url: str) -> str:
    """``url`` with the password of its user info and of a ``password=`` parameter as ``***``."""
    head, sep, rest = url.partition("://")
    if not sep:
        return "***" if "password" in url else url
    authority, slash, tail = _split_authority(rest)
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.partition(":")[0] + ":***"
        authority = f"{userinfo}@{hosts}"
    tail = re.sub(r"(^|[?&])password=[^&]*", r"\1password=***", tail)
    return f"{head}://{authority}{slash}{tail}"


def _split_authority(rest: str) -> tuple[str, str, str]:
    """``user@hosts``, the separator and what follows (path and query) of a URL without its scheme."""
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0], default=len(rest))
    return rest[:cut], rest[cut:cut + 1], rest[cut + 1:]


def _set_query(url: str, values: dict[str, str]) -> str:
    base, _, query = url.partition("?")
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in values]
    pairs.extend(values.items())
    return f"{base}?{urlencode(pairs, quote_via=quote)}"


@functools.lru_cache(maxsize=64)
def parse(url: str) -> Database:
    """``url`` checked and made explicit (cached: every caller shares one parse of a setting).
    ValueError (one line, no password) for anything that is not a PostgreSQL or SQLite URL."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"--database-url is empty (expected {EXAMPLES})")
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError(f"--database-url is not a database URL (expected {EXAMPLES})")
    backend, _, driver = match.group(1).lower().partition("+")
    rest = url[match.end():]
    if backend in PG_SCHEMES:
        if driver not in ("", "psycopg"):
            raise ValueError(f"--database-url: the PostgreSQL driver {driver!r} is not supported "
                             f"(use postgresql://..., served by psycopg 3)")
        return _postgres(rest)
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise ValueError(f"--database-url: the SQLite driver {driver!r} is not supported (use sqlite:///...)")
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
        try:
            make_url(url)
        except (ArgumentError, ValueError):
            raise ValueError(f"--database-url is not a database URL (expected {EXAMPLES})") from None
        return Database(url=url, backend="sqlite")
    raise ValueError(f"--database-url: unsupported database {backend!r} (expected {EXAMPLES})")


def _postgres(rest: str) -> Database:
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict
    conninfo = "postgresql://" + rest
    try:
        params = conninfo_to_dict(conninfo)  # libpq's own parser (PQconninfoParse)
    except (ProgrammingError, ValueError) as exc:
        why = " ".join(hide_password(str(exc)).split())
        raise ValueError(f"--database-url is not a database URL ({why}; expected {EXAMPLES})") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"--database-url is not a database URL (port {port!r} is not a port number; "
                             f"expected {EXAMPLES})")
    tsa = params.get("target_session_attrs")
    if tsa and tsa not in ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"):
        raise ValueError(f"--database-url: target_session_attrs {tsa!r} is not one of any, read-write, "
                         f"read-only, primary, standby, prefer-standby")
    return Database(url="postgresql+psycopg://" + rest, backend="postgresql", conninfo=conninfo,
                    params=tuple(sorted((k, str(v)) for k, v in params.items())))
