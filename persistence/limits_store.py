"""Vhost limits, user limits and topic permissions in the SQL store (tables ``vhost_limits``,
``user_limits``, ``topic_permissions``).

Functions of an open :class:`persistence.sql_store.SqlStore` (its ``_write`` / ``_read`` /
``_upsert`` plumbing), one transaction per call. Writes run on the group-commit writer thread
(``SqlDurability.write``), ordered with every other definition write; ``load`` runs at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import delete, select

from .models import topic_permissions, user_limits, vhost_limits


@dataclass
class LimitsAndTopics:
    vhost_limits: list[dict] = field(default_factory=list)      # {"vhost", "name", "value"}
    user_limits: list[dict] = field(default_factory=list)       # {"user", "name", "value"}
    topic_permissions: list[dict] = field(default_factory=list)  # {"user","vhost","exchange","write","read"}


def put_vhost_limit(store, vhost: str, name: str, value: int) -> None:
    with store._write() as conn:
        store._upsert(conn, vhost_limits, ["vhost", "name"], {"vhost": vhost, "name": name, "value": value})


def delete_vhost_limit(store, vhost: str, name: str) -> None:
    with store._write() as conn:
        conn.execute(delete(vhost_limits).where(vhost_limits.c.vhost == vhost, vhost_limits.c.name == name))


def put_user_limit(store, user: str, name: str, value: int) -> None:
    with store._write() as conn:
        store._upsert(conn, user_limits, ["user", "name"], {"user": user, "name": name, "value": value})


def delete_user_limit(store, user: str, name: str) -> None:
    with store._write() as conn:
        conn.execute(delete(user_limits).where(user_limits.c.user == user, user_limits.c.name == name))


def put_topic_permission(store, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
    with store._write() as conn:
        store._upsert(conn, topic_permissions, ["user", "vhost", "exchange"],
                      {"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read})


def delete_topic_permission(store, user: str, vhost: str, exchange: str) -> None:
    with store._write() as conn:
        t = topic_permissions
        conn.execute(delete(t).where(t.c.user == user, t.c.vhost == vhost, t.c.exchange == exchange))


def load(store) -> LimitsAndTopics:
    """Everything stored, in a stable order."""
    out = LimitsAndTopics()
    with store._read() as conn:
        for r in conn.execute(select(vhost_limits).order_by(vhost_limits.c.vhost, vhost_limits.c.name)):
            out.vhost_limits.append(dict(r._mapping))
        for r in conn.execute(select(user_limits).order_by(user_limits.c.user, user_limits.c.name)):
            out.user_limits.append(dict(r._mapping))
        t = topic_permissions
        for r in conn.execute(select(t).order_by(t.c.user, t.c.vhost, t.c.exchange)):
            out.topic_permissions.append(dict(r._mapping))
    return out
