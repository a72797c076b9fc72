"""Policies and operator policies in the SQL store (table ``policies``).

Functions of a :class:`persistence.sql_store.SqlStore` (its ``_write`` / ``_read`` / ``_upsert``
plumbing), one transaction per call. ``value`` is RabbitMQ's runtime-parameter value as JSON text:
``{"pattern", "apply-to", "priority", "definition"}``.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, select

from .models import policies


def put_policy(store, kind: str, vhost: str, name: str, value_json: str) -> None:
    with store._write() as conn:
        store._upsert(conn, policies, ["vhost", "kind", "name"],
                      {"vhost": vhost, "kind": kind, "name": name, "value_json": value_json})


def delete_policy(store, kind: str, vhost: str, name: str) -> None:
    with store._write() as conn:
        conn.execute(delete(policies).where(policies.c.vhost == vhost, policies.c.kind == kind,
                                            policies.c.name == name))


def delete_vhost_policies(store, vhost: str) -> None:
    with store._write() as conn:
        conn.execute(delete(policies).where(policies.c.vhost == vhost))


def load_policies(store) -> list[dict]:
    """Every stored policy: ``{"vhost", "kind", "name", "value": dict}`` (unreadable rows skipped)."""
    out = []
    with store._read() as conn:
        rows = conn.execute(select(policies).order_by(policies.c.vhost, policies.c.kind, policies.c.name))
        for r in rows:
            try:
                value = json.loads(r.value_json)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append({"vhost": r.vhost, "kind": r.kind, "name": r.name, "value": value})
    return out
