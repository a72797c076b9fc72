"""cluster membership, queue leases and cluster counters

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cluster_nodes",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("amqp_address", sa.String(), nullable=False),
        sa.Column("admin_address", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("incarnation", sa.BigInteger(), nullable=False),
        sa.Column("failover_timeout", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_cluster_nodes"),
    )
    op.create_table(
        "queue_leases",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("leader", sa.String(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("vhost", "queue", name="pk_queue_leases"),
    )
    op.create_table(
        "cluster_counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_cluster_counters"),
    )


def downgrade() -> None:
    op.drop_table("cluster_counters")
    op.drop_table("queue_leases")
    op.drop_table("cluster_nodes")
