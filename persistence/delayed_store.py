"""Store operations for the delayed-message exchange (table ``delayed_messages``).

Plain functions over an open :class:`persistence.sql_store.SqlStore`, also offered as
``SqlStore`` methods through the :class:`SqlDelayed` mixin. Writes run on the group-commit
writer thread (ordered with the message writes), reads on an executor thread; each call is
one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from sqlalchemy import bindparam, delete, func, select, tuple_

from .models import delayed_messages

DELETE_CHUNK = 500

_COLUMNS = ("id", "vhost", "exchange", "routing_key", "properties", "body", "due_ms", "created_ms")
_SQLITE_INSERT = (
    f"INSERT INTO delayed_messages ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_DELETE_IDS = delete(delayed_messages).where(
    delayed_messages.c.id.in_(bindparam("ids", expanding=True))
)


@dataclass(slots=True)
class DelayedRow:
    id: int
    vhost: str
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    due_ms: int
    created_ms: int

    def as_tuple(self) -> tuple:
        return (self.id, self.vhost, self.exchange, self.routing_key, self.properties, self.body,
                self.due_ms, self.created_ms)


def insert_delayed(store, rows: Iterable[tuple]) -> None:
    """Insert rows given as tuples in ``_COLUMNS`` order (one transaction)."""
    rows = list(rows)
    if not rows:
        return
    with store._write() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(_SQLITE_INSERT, rows)  # skips per-row bind processing
        else:
            conn.execute(delayed_messages.insert(), [dict(zip(_COLUMNS, r)) for r in rows])


def delete_delayed(store, ids: Iterable[int]) -> None:
    ids = list(ids)
    if not ids:
        return
    with store._write() as conn:
        for i in range(0, len(ids), DELETE_CHUNK):
            conn.execute(_DELETE_IDS, {"ids": ids[i:i + DELETE_CHUNK]})


def delete_delayed_exchange(store, vhost: str, exchange: str) -> int:
    """Drop every pending delayed message of one exchange (the exchange was deleted)."""
    d = delayed_messages.c
    with store._write() as conn:
        return conn.execute(
            delete(delayed_messages).where(d.vhost == vhost, d.exchange == exchange)
        ).rowcount


def load_delayed(store, from_due: int, from_id: int, before_due: int, limit: int) -> list[DelayedRow]:
    """Rows with (due_ms, id) >= (from_due, from_id) and due_ms < before_due, in due order."""
    d = delayed_messages.c
    with store._read() as conn:
        rows = conn.execute(
            select(d.id, d.vhost, d.exchange, d.routing_key, d.properties, d.body, d.due_ms,
                   d.created_ms)
            .where(tuple_(d.due_ms, d.id) >= tuple_(from_due, from_id), d.due_ms < before_due)
            .order_by(d.due_ms, d.id)
            .limit(limit)
        ).all()
    return [DelayedRow(r[0], r[1], r[2], r[3], bytes(r[4]), bytes(r[5]), r[6], r[7]) for r in rows]


def delayed_stats(store) -> tuple[int, int, int | None]:
    """(row count, max id or 0, min due_ms or None)."""
    d = delayed_messages.c
    with store._read() as conn:
        count, max_id, min_due = conn.execute(
            select(func.count(), func.coalesce(func.max(d.id), 0), func.min(d.due_ms))
        ).one()
    return int(count), int(max_id), None if min_due is None else int(min_due)


class SqlDelayed:
    """The functions above as store methods (mixed into :class:`SqlStore`)."""

    def insert_delayed(self, rows: Iterable[tuple]) -> None:
        insert_delayed(self, rows)

    def delete_delayed(self, ids: Iterable[int]) -> None:
        delete_delayed(self, ids)

    def delete_delayed_exchange(self, vhost: str, exchange: str) -> int:
        return delete_delayed_exchange(self, vhost, exchange)

    def load_delayed(self, from_due: int, from_id: int, before_due: int,
                     limit: int) -> list[DelayedRow]:
        return load_delayed(self, from_due, from_id, before_due, limit)

    def delayed_stats(self) -> tuple[int, int, int | None]:
        return delayed_stats(self)
