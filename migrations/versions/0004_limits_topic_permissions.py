"""vhost limits, user limits and topic permissions

Revision ID: 0004
Revises: 0003
Create Date: 2024-01-04 00:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "vhost_limits",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("vhost", "name", name="pk_vhost_limits"),
    )
    op.create_table(
        "user_limits",
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user", "name", name="pk_user_limits"),
    )
    op.create_table(
        "topic_permissions",
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("exchange", sa.String(), nullable=False),
        sa.Column("write", sa.Text(), nullable=False),
        sa.Column("read", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user", "vhost", "exchange", name="pk_topic_permissions"),
    )


def downgrade() -> None:
    op.drop_table("topic_permissions")
    op.drop_table("user_limits")
    op.drop_table("vhost_limits")
