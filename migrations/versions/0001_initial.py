"""initial schema: definitions, messages, stream offsets

Revision ID: 0001
Revises:
Create Date: 2024-01-01 00:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUE_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "vhosts",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_vhosts"),
    )
    op.create_table(
        "users",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("hashing_algorithm", sa.String(), nullable=False),
        sa.Column("tags_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "permissions",
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("configure", sa.Text(), nullable=False),
        sa.Column("write", sa.Text(), nullable=False),
        sa.Column("read", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user", "vhost", name="pk_permissions"),
    )
    op.create_table(
        "exchanges",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("durable", sa.Boolean(), nullable=False),
        sa.Column("auto_delete", sa.Boolean(), nullable=False),
        sa.Column("internal", sa.Boolean(), nullable=False),
        sa.Column("arguments", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("vhost", "name", name="pk_exchanges"),
    )
    op.create_table(
        "queues",
        sa.Column("id", QUEUE_ID, autoincrement=True, nullable=False),
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("durable", sa.Boolean(), nullable=False),
        sa.Column("exclusive", sa.Boolean(), nullable=False),
        sa.Column("auto_delete", sa.Boolean(), nullable=False),
        sa.Column("arguments", sa.LargeBinary(), nullable=False),
        sa.Column("delivered_mark", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_queues"),
        sa.UniqueConstraint("vhost", "name", name="uq_queues_vhost"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "bindings",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("destination", sa.String(), nullable=False),
        sa.Column("destination_type", sa.String(length=16), nullable=False),
        sa.Column("routing_key", sa.String(), nullable=False),
        sa.Column("arguments_sha1", sa.String(length=40), nullable=False),
        sa.Column("arguments", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "vhost",
            "source",
            "destination",
            "destination_type",
            "routing_key",
            "arguments_sha1",
            name="pk_bindings",
        ),
    )
    op.create_table(
        "messages",
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("exchange", sa.String(), nullable=False),
        sa.Column("routing_key", sa.String(), nullable=False),
        sa.Column("properties", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name="fk_messages_queue_id_queues",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue_id", "seq", name="pk_messages"),
    )
    op.create_table(
        "stream_offsets",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("vhost", "queue", "name", name="pk_stream_offsets"),
    )


def downgrade() -> None:
    op.drop_table("stream_offsets")
    op.drop_table("messages")
    op.drop_table("bindings")
    op.drop_table("queues")
    op.drop_table("exchanges")
    op.drop_table("permissions")
    op.drop_table("users")
    op.drop_table("vhosts")
