"""MQTT retained messages: the last retained PUBLISH of each topic, per vhost

Revision ID: 0009_mqtt
Revises: 0007
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_mqtt"
down_revision: str | Sequence[str] | None = "0008_shovels"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mqtt_retained",
        sa.Column("vhost", sa.String(), nullable=False),
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("qos", sa.SmallInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("properties", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("vhost", "topic", name="pk_mqtt_retained"),
    )


def downgrade() -> None:
    op.drop_table("mqtt_retained")
