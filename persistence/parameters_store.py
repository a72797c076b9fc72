"""Runtime parameters in the SQL store (table ``runtime_parameters``): shovels, federation
upstreams and upstream sets, as RabbitMQ keeps them (component, vhost, name, JSON value).

Functions of an open :class:`persistence.sql_store.SqlStore`, one transaction per call; writes
run on the group-commit writer thread (``SqlDurability.write``), ``load_parameters`` at start-up.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, select

from .models import runtime_parameters as table


def put_parameter(store, component: str, vhost: str, name: str, value_json: str) -> None:
    with store._write() as conn:
        store._upsert(conn, table, ["component", "vhost", "name"],
                      {"component": component, "vhost": vhost, "name": name, "value_json": value_json})


def delete_parameter(store, component: str, vhost: str, name: str) -> None:
    with store._write() as conn:
        conn.execute(delete(table).where(table.c.component == component, table.c.vhost == vhost,
                                         table.c.name == name))


def load_parameters(store) -> list[dict]:
    """Every stored parameter: ``{"component", "vhost", "name", "value"}`` (unreadable rows skipped)."""
    out = []
    with store._read() as conn:
        for r in conn.execute(select(table).order_by(table.c.component, table.c.vhost, table.c.name)):
            try:
                value = json.loads(r.value_json)
            except ValueError:
                continue
            out.append({"component": r.component, "vhost": r.vhost, "name": r.name, "value": value})
    return out
