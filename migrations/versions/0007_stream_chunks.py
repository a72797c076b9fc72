"""stream logs stored in chunks: one row per run of messages instead of one per message

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 07:00:00

* New table ``stream_chunks`` (``persistence/stream_chunks.py`` has the blob's layout).
* Every stream queue's rows of ``messages`` are moved into chunks (same seqs, bodies, properties,
  exchanges, routing keys and timestamps), in runs of consecutive seqs.
* Downgrade moves them back to ``messages`` rows.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from pamqp import decode as pdecode

from persistence.store import StoredMessage
from persistence.stream_chunks import Chunk, encode, split

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROWS = 20000  # messages read at a time while converting

_messages = sa.table(
    "messages", sa.column("queue_id"), sa.column("seq"), sa.column("exchange"),
    sa.column("routing_key"), sa.column("properties"), sa.column("body"), sa.column("created_ms"),
    sa.column("expires_ms"), sa.column("priority"))
_chunks = sa.table(
    "stream_chunks", sa.column("queue_id"), sa.column("first_seq"), sa.column("last_seq"),
    sa.column("count"), sa.column("bytes"), sa.column("first_ms"), sa.column("last_ms"),
    sa.column("data"))


def _stream_queue_ids(conn) -> list[int]:
    ids = []
    for qid, raw in conn.execute(sa.text("SELECT id, arguments FROM queues")):
        try:
            args = pdecode.field_table(bytes(raw))[1] if raw else {}
        except Exception:  # an unreadable argument table: not a stream declared by this broker
            continue
        kind = args.get("x-queue-type")
        if isinstance(kind, bytes):
            kind = kind.decode("utf-8", "replace")
        if kind == "stream":
            ids.append(qid)
    return ids


def upgrade() -> None:
    op.create_table(
        "stream_chunks",
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("first_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_ms", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["queue_id"], ["queues.id"], name="fk_stream_chunks_queue_id_queues",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("queue_id", "first_seq", name="pk_stream_chunks"),
    )
    op.create_index("ix_stream_chunks_queue_last_ms", "stream_chunks",
                    ["queue_id", "last_ms", "first_seq"])
    conn = op.get_bind()
    m = _messages.c
    for qid in _stream_queue_ids(conn):
        after = 0
        while True:
            rows = conn.execute(
                sa.select(m.seq, m.exchange, m.routing_key, m.properties, m.body, m.created_ms)
                .where(m.queue_id == qid, m.seq > after).order_by(m.seq).limit(_ROWS)).all()
            if not rows:
                break
            entries = [StoredMessage(qid, seq, ex, rk, bytes(p), bytes(b), created)
                       for seq, ex, rk, p, b, created in rows]
            for part in split(entries):  # runs of consecutive seqs, bounded
                blob, size = encode(part)
                conn.execute(_chunks.insert().values(
                    queue_id=qid, first_seq=part[0].seq, last_seq=part[-1].seq,
                    count=len(part), bytes=size, first_ms=part[0].created_ms,
                    last_ms=part[-1].created_ms, data=blob))
            after = rows[-1][0]
        conn.execute(sa.delete(_messages).where(m.queue_id == qid))


def downgrade() -> None:
    conn = op.get_bind()
    c = _chunks.c
    keys = conn.execute(sa.select(c.queue_id, c.first_seq).order_by(c.queue_id, c.first_seq)).all()
    for qid, first in keys:  # one blob in memory at a time
        chunk = Chunk(conn.scalar(sa.select(c.data).where(c.queue_id == qid, c.first_seq == first)))
        conn.execute(_messages.insert(), [
            {"queue_id": qid, "seq": seq, "exchange": ex, "routing_key": rk, "properties": p,
             "body": b, "created_ms": created, "expires_ms": None, "priority": 0}
            for seq, ex, rk, p, b, created in chunk.rows(first, 0, chunk.n)])
    op.drop_index("ix_stream_chunks_queue_last_ms", table_name="stream_chunks")
    op.drop_table("stream_chunks")
