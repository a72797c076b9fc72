"""A message as one queue holds it: raw properties and body kept from publish to deliver."""

from __future__ import annotations

from exchange_broker.protocol import codec


class Message:
    """One message in one queue (fan-out makes a cheap copy per queue; the body is shared)."""

    __slots__ = ("exchange", "routing_key", "properties", "body", "persistent", "priority",
                 "seq", "redelivered", "queue", "stored", "_props", "expires_ms", "created_ms",
                 "rejected", "delivered_at")

    def __init__(self, exchange: str, routing_key: str, properties: bytes, body: bytes,
                 persistent: bool = False, priority: int = 0) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.seq = 0
        self.redelivered = False
        self.queue = None
        self.stored = False
        self._props: dict | None = None
        self.expires_ms: int | None = None
        self.created_ms = 0
        self.rejected = False      # refused by a queue's reject-publish overflow
        self.delivered_at = None   # the clock's time() of the last delivery (consumer timeout)

    def copy(self) -> "Message":
        m = Message(self.exchange, self.routing_key, self.properties, self.body, self.persistent,
                    self.priority)
        m._props = self._props
        m.expires_ms = self.expires_ms
        m.created_ms = self.created_ms
        return m

    @property
    def props(self) -> dict:
        """Decoded properties (lazily, only when routing or the API needs them)."""
        if self._props is None:
            self._props = codec.parse_properties(self.properties)
        return self._props

    @property
    def headers(self) -> dict | None:
        return self.props.get("headers")

    @property
    def size(self) -> int:
        return len(self.body)
