"""A message as one queue holds it: raw properties and body kept from publish to deliver, and
:func:`from_wire`, the one place a Message is made from published properties (every path that
publishes: AMQP, the admin API, move, the delayed exchange, the overview's test message)."""

from __future__ import annotations

import json
import re
from typing import Iterable, Protocol

from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

_CHECKED = codec.FLAG_EXPIRATION | codec.FLAG_USER_ID


class Publisher(Protocol):
    """Who publishes: an authenticated user (``core.auth.User``, the admin API's principal)."""

    name: str
    tags: Iterable[str]


class Message:
    """One message in one queue (fan-out makes a cheap copy per queue; the body is shared)."""

    __slots__ = ("exchange", "routing_key", "properties", "body", "persistent", "priority",
                 "seq", "redelivered", "queue", "stored", "_props", "expires_ms", "created_ms",
                 "rejected", "delivered_at", "ttl")

    # None, or (head, tail) with properties == head + (seq - 1) as 8 bytes + tail: a stream's
    # delivery (its offset in the x-stream-offset header), framed from one template per run
    props_shape = None

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
        self.ttl: int | None = None  # per-message TTL (ms, the ``expiration`` property)

    def copy(self) -> "Message":
        m = Message(self.exchange, self.routing_key, self.properties, self.body, self.persistent,
                    self.priority)
        m._props = self._props
        m.expires_ms = self.expires_ms
        m.created_ms = self.created_ms
        m.ttl = self.ttl
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


def from_wire(exchange: str, routing_key: str, properties: bytes, body: bytes,
              user: Publisher | None = None, quick: tuple | None = None) -> Message:
    """A Message from published (encoded) properties: persistence and priority, the per-message
    TTL (``expiration``) and RabbitMQ's validated user-id, checked against ``user`` (None: the
    broker republishing on its own, e.g. a delayed message coming due). ``quick``: the
    properties' ``codec.quick_properties`` when already known. Raises the channel's 406."""
    dm, prio, flags = quick or codec.quick_properties(properties)
    msg = Message(exchange, routing_key, properties, body, dm == 2, prio)
    if flags & _CHECKED:
        props = msg.props
        if user is not None and flags & codec.FLAG_USER_ID:
            check_user_id(props.get("user_id"), user)
        if flags & codec.FLAG_EXPIRATION:
            msg.ttl = parse_expiration(props.get("expiration"))
    return msg


def check_user_id(claimed, user: Publisher) -> None:
    """RabbitMQ's validated user-id: a ``user_id`` property must name the publishing user,
    unless that user has the ``impersonator`` tag."""
    claimed = _text(claimed)
    if claimed is None or claimed == user.name or "impersonator" in user.tags:
        return
    raise AMQPError(PRECONDITION_FAILED, f"user_id property set to '{claimed}' but authenticated "
                    f"user was '{user.name}'", 60, 40, hard=False)


_LEADING_INTEGER = re.compile(r"[+-]?[0-9]+")
MAX_EXPIRY_MS = 315_360_000_000  # RabbitMQ's largest expiry timer: ten years


def parse_expiration(value) -> int | None:
    """The `expiration` property: integer milliseconds from 0 to ``MAX_EXPIRY_MS``, written as a
    string. Refused as RabbitMQ refuses it (Erlang's ``string:to_integer`` and its error terms:
    ``no_integer``, ``{leftover_string,"..."}``, ``{value_negative,N}``, ``{value_too_large,N}``)."""
    if value is None:
        return None
    text = str(_text(value))
    number = _LEADING_INTEGER.match(text)
    if number is None:
        reason = "no_integer"
    elif number.end() < len(text):
        reason = "{leftover_string,%s}" % json.dumps(text[number.end():], ensure_ascii=False)
    else:
        ms = int(number.group())
        if 0 <= ms <= MAX_EXPIRY_MS:
            return ms
        reason = f"{{value_negative,{ms}}}" if ms < 0 else f"{{value_too_large,{ms}}}"
    raise AMQPError(PRECONDITION_FAILED, f"invalid expiration '{text}': {reason}", 60, 40, hard=False)


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v
