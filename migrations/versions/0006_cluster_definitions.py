"""cluster step 1b: queue ids from a PostgreSQL sequence, each node's definitions version

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:15:00

* PostgreSQL: the sequence ``queue_ids`` hands out queue ids to every broker process on the store
  (nodes of a cluster reserve blocks of it), starting after the highest id already used.
  SQLite stays single-process: ids are still allocated by the broker (max id + 1).
* ``cluster_nodes.definitions_version``: the definitions version each node has loaded (written
  with its heartbeat; ``cluster status`` shows it).
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster_nodes") as batch:
        batch.add_column(sa.Column("definitions_version", sa.BigInteger(), nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SEQUENCE IF NOT EXISTS queue_ids")
        op.execute("SELECT setval('queue_ids', COALESCE((SELECT max(id) FROM queues), 0) + 1, false)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE IF EXISTS queue_ids")
    with op.batch_alter_table("cluster_nodes") as batch:
        batch.drop_column("definitions_version")
