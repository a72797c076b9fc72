"""Store operations for MQTT's retained messages (table ``mqtt_retained``): plain functions over
an open :class:`persistence.sql_store.SqlStore`; writes run on the group-commit writer thread
(``durability.write``), the load at start-up off the event loop. Each call is one transaction."""

from __future__ import annotations

from sqlalchemy import delete, select

from .models import mqtt_retained


def set_retained(store, vhost: str, topic: str, qos: int, payload: bytes, properties: bytes) -> None:
    """The topic's retained message is this one (replacing any)."""
    with store._write() as conn:
        store._upsert(conn, mqtt_retained, ["vhost", "topic"], {
            "vhost": vhost, "topic": topic, "qos": qos, "payload": payload, "properties": properties})


def clear_retained(store, vhost: str, topic: str) -> None:
    with store._write() as conn:
        conn.execute(delete(mqtt_retained).where(mqtt_retained.c.vhost == vhost,
                                                 mqtt_retained.c.topic == topic))


def load_retained(store) -> list[tuple[str, str, int, bytes, bytes]]:
    """Every retained message: (vhost, topic, qos, payload, properties)."""
    with store._read() as conn:
        rows = conn.execute(select(mqtt_retained.c.vhost, mqtt_retained.c.topic, mqtt_retained.c.qos,
                                   mqtt_retained.c.payload, mqtt_retained.c.properties))
        return [(v, t, q, bytes(pl), bytes(pr)) for v, t, q, pl, pr in rows]
