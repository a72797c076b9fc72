"""Exchange type ``x-consistent-hash`` (RabbitMQ's rabbitmq_consistent_hash_exchange plugin).

Each binding's key is its destination's *weight*: an integer from 1 to 10,000 (RabbitMQ's limit and
error texts). The destinations own consecutive buckets of a ring, ``weight`` buckets each, in the
order they were bound; a message goes to the one destination owning the bucket that a jump
consistent hash (Lamping & Veach) of the message's hash value picks among all buckets, so each
destination gets a share proportional to its weight, and adding a destination moves only the
messages that land on its new buckets.

What is hashed, as the plugin (exchange arguments):

* nothing given: the routing key;
* ``hash-header: H``: the value of message header ``H`` (a message without it: one fixed value, so
  all such messages reach one destination, as RabbitMQ's hash of ``undefined``);
* ``hash-property: P``, P one of ``correlation_id``, ``message_id``, ``timestamp`` (the timestamp in
  seconds, as the plugin hashes it); both arguments at once, or another property: 406.

A destination bound twice (two weights) keeps the ring position and weight of its first binding,
as the plugin ignores the second; unbinding one of them keeps the other's (the plugin drops the
destination from the ring until the next restart). The hash is murmur3 (not Erlang's phash2): the
same key always reaches the same destination here, but not necessarily the one RabbitMQ picks.
"""
from __future__ import annotations

from datetime import datetime

import mmh3

from .base import BindingKey, BindingTable, Dest, args_key
from .types import ExchangeType, InvalidExchangeArguments

X_CONSISTENT_HASH = "x-consistent-hash"
MAX_WEIGHT = 10_000
PROPERTIES = ("correlation_id", "message_id", "timestamp")
_MASK64 = (1 << 64) - 1


class RoutingFields(dict):
    """Message headers handed to ``match`` along with the message's other properties
    (``properties``), for types that route on a property (``wants_properties``)."""

    __slots__ = ("properties",)

    def __init__(self, headers: dict | None, properties: dict) -> None:
        super().__init__(headers or ())
        self.properties = properties


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach 2014): a bucket in ``range(buckets)`` for a 64-bit key."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def hash_value(value) -> int:
    """A stable 64-bit hash of a routing key, header or property value (type-tagged for non-text)."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        data = repr(args_key(value)).encode()
    return mmh3.hash64(data, signed=False)[0]


def _text(value):
    return bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def hash_on(arguments: dict | None) -> tuple[str, str] | None:
    """``("header", H)``, ``("property", P)`` or None (the routing key); 406 for bad arguments."""
    args = arguments or {}
    header = _text(args.get("hash-header"))
    prop = _text(args.get("hash-property"))
    header = header if isinstance(header, str) else None
    prop = prop if isinstance(prop, str) else None
    if header is not None and prop is not None:
        raise InvalidExchangeArguments("hash-header and hash-property are mutually exclusive")
    if prop is not None:
        if prop not in PROPERTIES:
            raise InvalidExchangeArguments(f"Unsupported property: {prop}")
        return ("property", prop)
    return ("header", header) if header is not None else None


def weight_of(routing_key: str) -> int:
    """The binding key as a weight; ValueError with the plugin's texts otherwise."""
    try:
        weight = int(routing_key.strip())
    except ValueError:
        raise ValueError(f"The binding key must be an integer: {routing_key!r}") from None
    if weight < 1:
        raise ValueError("The binding key must be greater than 0")
    if weight > MAX_WEIGHT:
        raise ValueError(f"The binding key must not exceed {MAX_WEIGHT}")
    return weight


class ConsistentHashIndex(BindingTable):
    """Weighted hash ring over the bound destinations; ``match`` gives one destination."""

    def __init__(self, on: tuple[str, str] | None) -> None:
        super().__init__()
        self.on = on
        self.wants_headers = on is not None and on[0] == "header"
        self.wants_properties = on is not None and on[0] == "property"
        self._ring: list[Dest] = []          # bucket number -> destination
        self._weights: dict[Dest, int] = {}  # destination -> weight of its first binding

    def bind(self, dest: Dest, routing_key: str, arguments: dict | None = None) -> bool:
        weight_of(routing_key)
        return super().bind(dest, routing_key, arguments)

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        if dest not in self._weights:
            weight = weight_of(routing_key)
            self._weights[dest] = weight
            self._ring.extend([dest] * weight)

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        # rebuild from the bindings left: each destination once, at its first binding's place
        self._weights = {}
        self._ring = []
        for d, rk, _ in self._bindings.values():
            if d not in self._weights:
                self._weights[d] = weight_of(rk)
                self._ring.extend([d] * self._weights[d])

    def weights(self) -> dict[Dest, int]:
        """Each destination's weight (its number of buckets on the ring)."""
        return dict(self._weights)

    def key_of(self, routing_key: str, headers: dict | None):
        """The value a message is hashed on (None: the header or property is missing)."""
        if self.on is None:
            return routing_key
        kind, name = self.on
        if kind == "header":
            return headers.get(name) if headers else None
        props = getattr(headers, "properties", None) or {}
        value = props.get(name)
        if name == "timestamp" and isinstance(value, datetime):
            return str(int(value.timestamp()))
        return value

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        ring = self._ring
        if not ring:
            return []
        if len(ring) == 1:
            return [ring[0]]
        return [ring[jump_hash(hash_value(self.key_of(routing_key, headers)), len(ring))]]


class ConsistentHashType(ExchangeType):
    name = X_CONSISTENT_HASH

    def make_index(self, arguments: dict | None, registry: dict[str, ExchangeType]) -> BindingTable:
        return ConsistentHashIndex(hash_on(arguments))
