"""Stream logs in the SQL store: chunks of consecutive messages (``stream_chunks`` rows, blob layout in
``stream_chunks.py``), read back by offset range or by timestamp, dropped from the head.

A mixin of :class:`persistence.sql_store.SqlStore` (which provides ``_write``, ``_read`` and
``_dialect``). Seqs are offsets + 1; a chunk never holds more than
:data:`~persistence.stream_chunks.CHUNK_MESSAGES` messages, which bounds the index range a read scans.
"""

from __future__ import annotations

from typing import Iterator

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .models import stream_chunks
from .stream_chunks import CHUNK_MESSAGES, Chunk, encode, split

_COLUMNS = ("queue_id", "first_seq", "last_seq", "count", "bytes", "first_ms", "last_ms", "data")
_SQLITE_INSERT = (f"INSERT INTO stream_chunks ({', '.join(_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(_COLUMNS))})")
_SQLITE_READ = ("SELECT first_seq, last_seq, data FROM stream_chunks WHERE queue_id = ? "
                "AND first_seq > ? AND first_seq <= ? AND last_seq > ? ORDER BY first_seq LIMIT ?")

c = stream_chunks.c


def chunk_rows(queue_id: int, entries: list) -> list[tuple]:
    """``stream_chunks`` rows (in _COLUMNS order) for consecutive entries of one log."""
    rows = []
    for part in split(entries):
        blob, size = encode(part)
        rows.append((queue_id, part[0].seq, part[-1].seq, len(part), size,
                     part[0].created_ms, part[-1].created_ms, blob))
    return rows


def log_stats(conn: Connection, queue_id: int | None = None) -> dict[int, tuple[int, int, int]]:
    """{queue id: (message count, lowest seq, highest seq)} of every stored log (or of one)."""
    query = select(c.queue_id, func.sum(c.count), func.min(c.first_seq), func.max(c.last_seq))
    if queue_id is not None:
        query = query.where(c.queue_id == queue_id)
    return {qid: (int(n), int(lo), int(hi)) for qid, n, lo, hi in conn.execute(query.group_by(c.queue_id))}


class SqlStreamLog:
    """Stream-log reads and writes (mixed into :class:`SqlStore`)."""

    def _insert_chunks(self, conn: Connection, logs: dict[int, list]) -> None:
        rows = [row for qid, entries in logs.items() if entries for row in chunk_rows(qid, entries)]
        if not rows:
            return
        if conn.dialect.name == "sqlite":  # straight to the driver, like message rows
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.executemany(_SQLITE_INSERT, rows)
            except conn.dialect.loaded_dbapi.Error as exc:
                raise DBAPIError.instance(_SQLITE_INSERT, None, exc, conn.dialect.loaded_dbapi.Error,
                                          dialect=conn.dialect) from exc
            finally:
                cur.close()
        else:
            conn.execute(insert(stream_chunks), [dict(zip(_COLUMNS, r)) for r in rows])

    def append_log(self, queue_id: int, entries: list) -> None:
        """Append consecutive messages to a log in one transaction (tests, conversions)."""
        with self._write() as conn:
            self._insert_chunks(conn, {queue_id: entries})

    def read_log(self, queue_id: int, start: int, end: int) -> list[tuple]:
        """Messages with ``start < seq <= end``, in seq order, as plain tuples
        (seq, exchange, routing_key, properties, body, created_ms)."""
        out: list[tuple] = []
        for first, _last, blob in self.read_chunks(queue_id, start, end, limit=None):
            chunk = Chunk(blob)
            lo = max(start + 1 - first, 0)
            hi = min(end + 1 - first, chunk.n)
            out += chunk.rows(first, lo, hi)
        return out

    def read_chunks(self, queue_id: int, start: int, end: int,
                    limit: int | None = 64) -> list[tuple[int, int, bytes]]:
        """(first seq, last seq, blob) of up to ``limit`` (None: all) stored chunks holding seqs
        in ``start < seq <= end``, in order (the first and last may reach beyond the range)."""
        if end <= start:
            return []
        args = (queue_id, start - CHUNK_MESSAGES, end, start, -1 if limit is None else limit)
        with self._read() as conn:
            if self._dialect == "sqlite":  # straight to the driver: ~2x faster per row
                cur = conn.connection.driver_connection.cursor()
                try:
                    return cur.execute(_SQLITE_READ, args).fetchall()
                finally:
                    cur.close()
            found = conn.execute(
                select(c.first_seq, c.last_seq, c.data)
                .where(c.queue_id == queue_id, c.first_seq > args[1], c.first_seq <= end,
                       c.last_seq > start)
                .order_by(c.first_seq).limit(limit)).all()
        return [(int(first), int(last), bytes(blob)) for first, last, blob in found]

    def find_seq_at_time(self, queue_id: int, created_ms: int) -> int | None:
        """The lowest seq whose created_ms >= ``created_ms`` (None: none is that recent).
        Relies on created_ms never falling as seq rises (streams stamp appends monotonically)."""
        with self._read() as conn:
            row = conn.execute(
                select(c.first_seq, c.data)
                .where(c.queue_id == queue_id, c.last_ms >= created_ms)
                .order_by(c.last_ms, c.first_seq).limit(1)).first()
        if row is None:
            return None
        chunk = Chunk(row[1])
        return int(row[0]) + chunk.first_at_or_after(created_ms)

    def delete_messages_upto(self, queue_id: int, seq: int) -> int:
        """Drop the head of a log: every message with seq <= ``seq`` (a chunk holding both sides
        is written again with the kept part). Returns how many messages were dropped."""
        with self._write() as conn:
            where = (c.queue_id == queue_id, c.last_seq <= seq)
            dropped = int(conn.scalar(select(func.coalesce(func.sum(c.count), 0)).where(*where)))
            conn.execute(delete(stream_chunks).where(*where))
            cut = conn.execute(
                select(c.first_seq, c.data)
                .where(c.queue_id == queue_id, c.first_seq <= seq, c.last_seq > seq)).first()
            if cut is not None:
                first, blob = int(cut[0]), cut[1]
                chunk = Chunk(blob)
                kept = [_Entry(*r) for r in chunk.rows(first, seq + 1 - first, chunk.n)]
                conn.execute(delete(stream_chunks).where(c.queue_id == queue_id,
                                                         c.first_seq == first))
                conn.execute(insert(stream_chunks),
                             [dict(zip(_COLUMNS, r)) for r in chunk_rows(queue_id, kept)])
                dropped += chunk.n - len(kept)
        return dropped

    def iter_message_sizes(self, queue_id: int, chunk: int = 64) -> Iterator[tuple[int, int, int]]:
        """(seq, len(properties) + len(body), created_ms) of every message of a log, in seq
        order, read ``chunk`` chunks at a time."""
        after = 0
        while True:
            with self._read() as conn:
                found = conn.execute(
                    select(c.first_seq, c.data)
                    .where(c.queue_id == queue_id, c.first_seq > after)
                    .order_by(c.first_seq).limit(chunk)).all()
            for first, blob in found:
                ch = Chunk(blob)
                for i, (size, created) in enumerate(zip(ch.sizes(), ch.created)):
                    yield first + i, size, created
            if len(found) < chunk:
                return
            after = found[-1][0]

    def log_bytes(self, queue_id: int) -> int:
        """Sum of len(properties) + len(body) over a log's messages."""
        with self._read() as conn:
            return int(conn.scalar(
                select(func.coalesce(func.sum(c.bytes), 0)).where(c.queue_id == queue_id)))

    def log_last_ms(self, queue_id: int) -> int | None:
        """created_ms of a log's newest message (None: the log is empty)."""
        with self._read() as conn:
            got = conn.scalar(select(func.max(c.last_ms)).where(c.queue_id == queue_id))
        return None if got is None else int(got)


class _Entry:
    """A message read back from a chunk, in the shape :func:`chunk_rows` takes."""

    __slots__ = ("seq", "exchange", "routing_key", "properties", "body", "created_ms")

    def __init__(self, seq, exchange, routing_key, properties, body, created_ms) -> None:
        self.seq = seq
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.created_ms = created_ms
