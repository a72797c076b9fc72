"""per-vhost default queue type (RabbitMQ's default_queue_type)

Revision ID: 0010_rabbit4_features
Revises: 0007
Create Date: 2026-11-27 15:00:00

* New nullable column ``vhosts.default_queue_type``: the x-queue-type a queue declared without one
  gets in that vhost (NULL: classic, as before).
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_rabbit4_features"
down_revision: str | Sequence[str] | None = "0009_mqtt"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("vhosts", sa.Column("default_queue_type", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vhosts") as batch:
        batch.drop_column("default_queue_type")
