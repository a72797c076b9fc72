"""delayed messages: rows held by x-delayed-message exchanges until due

Revision ID: 0002
Revises: 0001
Create Date: 2024-01-02 00:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: a rowid alias


def upgrade() -> None:
    op.create_table(
        "delayed_messages",
        sa.Column("id", ROW_ID, autoincrement=False, nullable=False),
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("exchange", sa.String(), nullable=False),
        sa.Column("routing_key", sa.String(), nullable=False),
        sa.Column("properties", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("due_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_delayed_messages"),
    )
    op.create_index("ix_delayed_messages_due_ms_id", "delayed_messages", ["due_ms", "id"])
    op.create_index("ix_delayed_messages_vhost_exchange", "delayed_messages", ["vhost", "exchange"])


def downgrade() -> None:
    op.drop_index("ix_delayed_messages_vhost_exchange", table_name="delayed_messages")
    op.drop_index("ix_delayed_messages_due_ms_id", table_name="delayed_messages")
    op.drop_table("delayed_messages")
