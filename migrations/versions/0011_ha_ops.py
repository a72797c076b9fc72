"""queues follow the nodes: a queue's requested move, a node being drained

Revision ID: 0011_ha_ops
Revises: 0007
Create Date: 2026-11-27 15:10:00

* ``queue_leases.moving_to``: the node a queue's leadership is to be handed to (``cluster
  rebalance``, ``cluster drain``); its leader hands it over and clears it.
* ``cluster_nodes.draining``: set by ``cluster drain NODE`` until ``cluster revive NODE``: no queue
  is placed on or moved to that node.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_ha_ops"
down_revision: str | Sequence[str] | None = "0010_rabbit4_features"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queue_leases") as batch:
        batch.add_column(sa.Column("moving_to", sa.String(), nullable=True))
    with op.batch_alter_table("cluster_nodes") as batch:
        batch.add_column(sa.Column("draining", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("cluster_nodes") as batch:
        batch.drop_column("draining")
    with op.batch_alter_table("queue_leases") as batch:
        batch.drop_column("moving_to")
