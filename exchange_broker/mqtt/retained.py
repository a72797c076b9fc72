"""Retained messages: the last retained PUBLISH of each topic, per vhost, handed to new
subscribers. Kept in memory; ``persist`` (the store, see ``persistence/mqtt_retained.py``)
receives every change when the broker has a store."""

from __future__ import annotations

from dataclasses import dataclass, field

from exchange_broker.mqtt import properties, topics
from exchange_broker.mqtt.wire import MalformedPacket, Reader


@dataclass
class Retained:
    topic: str
    payload: bytes
    qos: int
    properties: dict = field(default_factory=dict)


class RetainedStore:
    def __init__(self, persist=None) -> None:
        self.by_vhost: dict[str, dict[str, Retained]] = {}
        # set(vhost, topic, qos, payload, property bytes) / clear(vhost, topic), or None
        self.persist = persist

    def load(self, rows) -> None:
        """Stored rows (vhost, topic, qos, payload, property block) at start-up."""
        for vhost, topic, qos, payload, raw in rows:
            try:
                props = properties.decode(Reader(raw)) if raw else {}
            except MalformedPacket:
                props = {}
            self.by_vhost.setdefault(vhost, {})[topic] = Retained(topic, payload, qos, props)

    def set(self, vhost: str, item: Retained):
        """A retained PUBLISH: an empty payload clears the topic's retained message. Returns the
        store's waiter for the change (None: nothing to wait for)."""
        topics_ = self.by_vhost.setdefault(vhost, {})
        if not item.payload:
            if topics_.pop(item.topic, None) is not None and self.persist is not None:
                return self.persist.clear(vhost, item.topic)
            return None
        topics_[item.topic] = item
        if self.persist is not None:
            return self.persist.set(vhost, item.topic, item.qos, item.payload, properties.encode(item.properties))

    def matching(self, vhost: str, topic_filter: str) -> list[Retained]:
        return [r for t, r in sorted(self.by_vhost.get(vhost, {}).items())
                if topics.matches(topic_filter, t)]

    def count(self) -> int:
        return sum(len(t) for t in self.by_vhost.values())
