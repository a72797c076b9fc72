"""runtime parameters (shovels, federation upstreams and upstream sets)

Revision ID: 0008_shovels
Revises: 0007
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_shovels"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runtime_parameters",
        sa.Column("component", sa.String(length=64), nullable=False),
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("component", "vhost", "name", name="pk_runtime_parameters"),
    )


def downgrade() -> None:
    op.drop_table("runtime_parameters")
