"""MQTT's retained messages written through the durability's ordered writer (``persistence/
mqtt_retained.py``): what ``mqtt/retained.RetainedStore`` calls as its ``persist``."""

from __future__ import annotations

from persistence.mqtt_retained import clear_retained, load_retained, set_retained


class RetainedWrites:
    def __init__(self, durability) -> None:
        self.durability = durability

    def set(self, vhost: str, topic: str, qos: int, payload: bytes, properties: bytes):
        """Returns the waiter that fires once the row is committed."""
        self.durability.write(lambda store: set_retained(store, vhost, topic, qos, payload, properties))
        return self.durability.pending_definition

    def clear(self, vhost: str, topic: str):
        self.durability.write(lambda store: clear_retained(store, vhost, topic))
        return self.durability.pending_definition


def stored_retained(store) -> list[tuple[str, str, int, bytes, bytes]]:
    """Every stored retained message (blocking: run it off the loop)."""
    return load_retained(store)
