"""Content a client receives (basic.deliver, basic.get-ok, basic.return), assembled from its
method, content header and body frames. Part of the sans-IO client (``client.py``).

The three content methods are decoded by hand (they are most of what a consumer reads); the
properties stay raw bytes, as a relay passes them on (``codec.parse_properties`` decodes them).
"""

from __future__ import annotations

import struct

from exchange_broker.protocol.constants import FRAME_ERROR, UNEXPECTED_FRAME
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.frames import CONTENT_HEAD

_QB = struct.Struct(">QB")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
DELIVER = 0x003C003C   # basic.deliver
GET_OK = 0x003C0047    # basic.get-ok
RETURN = 0x003C0032    # basic.return


class Delivery:
    """A message received: by basic.deliver (``consumer_tag`` set), basic.get-ok
    (``message_count`` set) or basic.return (``reply_code`` set)."""

    __slots__ = ("channel", "consumer_tag", "delivery_tag", "redelivered", "exchange", "routing_key",
                 "properties", "body", "message_count", "reply_code", "reply_text", "_size", "_parts")

    def __init__(self, channel: int, exchange: str, routing_key: str) -> None:
        self.channel = channel
        self.exchange = exchange
        self.routing_key = routing_key
        self.consumer_tag = ""
        self.delivery_tag = 0
        self.redelivered = False
        self.message_count = None
        self.reply_code = 0
        self.reply_text = ""
        self.properties = b""
        self.body = b""
        self._size = -1  # body size, once the content header is read
        self._parts: list[bytes] = []

    def __repr__(self) -> str:
        return (f"Delivery(channel={self.channel}, tag={self.delivery_tag}, exchange={self.exchange!r}, "
                f"routing_key={self.routing_key!r}, {len(self.body)} bytes)")


def _short(payload: bytes, pos: int) -> tuple[str, int]:
    n = payload[pos]
    return payload[pos + 1:pos + 1 + n].decode("utf-8"), pos + 1 + n


_CACHE_MAX = 4096
_TAGS: dict[bytes, str] = {}                 # consumer tags by their raw bytes
_NAMES: dict[bytes, tuple[str, str]] = {}    # (exchange, routing key) by the raw tail of a deliver


def _names(raw: bytes) -> tuple[str, str]:
    exchange, pos = _short(raw, 0)
    routing_key, pos = _short(raw, pos)
    if pos != len(raw):
        raise IndexError
    if len(_NAMES) >= _CACHE_MAX:
        _NAMES.clear()
    pair = _NAMES[raw] = (exchange, routing_key)
    return pair


def _tag(raw: bytes) -> str:
    if len(_TAGS) >= _CACHE_MAX:
        _TAGS.clear()
    tag = _TAGS[raw] = raw[1:].decode("utf-8")
    return tag


def content_method(channel: int, payload: bytes, mid: int) -> Delivery | None:
    """basic.deliver / get-ok / return, decoded; None for any other method. A consumer sees the
    same few consumer tags, exchanges and routing keys over and over: they are decoded once."""
    try:
        if mid == DELIVER:
            end = 5 + payload[4]
            raw = payload[4:end]
            tag = _TAGS.get(raw) or _tag(raw)
            delivery_tag, bits = _QB.unpack_from(payload, end)
            raw = payload[end + 9:]
            exchange, routing_key = _NAMES.get(raw) or _names(raw)
            d = Delivery(channel, exchange, routing_key)
            d.consumer_tag, d.delivery_tag, d.redelivered = tag, delivery_tag, bool(bits & 1)
            return d
        if mid == GET_OK:
            delivery_tag, bits = _QB.unpack_from(payload, 4)
            exchange, pos = _short(payload, 13)
            routing_key, pos = _short(payload, pos)
            d = Delivery(channel, exchange, routing_key)
            d.delivery_tag, d.redelivered = delivery_tag, bool(bits & 1)
            d.message_count = _U32.unpack_from(payload, pos)[0]
            return d
        if mid == RETURN:
            code = _U16.unpack_from(payload, 4)[0]
            text, pos = _short(payload, 6)
            exchange, pos = _short(payload, pos)
            routing_key, pos = _short(payload, pos)
            d = Delivery(channel, exchange, routing_key)
            d.reply_code, d.reply_text = code, text
            return d
    except (IndexError, struct.error, UnicodeDecodeError):
        raise AMQPError(FRAME_ERROR, "cannot decode a content method", mid >> 16, mid & 0xFFFF,
                        hard=True) from None
    return None


def content_header(d: Delivery | None, payload: bytes) -> bool:
    """The content header of ``d`` (its properties kept raw); True when the content is complete
    (no body)."""
    if d is None or d._size != -1 or len(payload) < 14:
        raise AMQPError(UNEXPECTED_FRAME, "unexpected content header", hard=True)
    _cls, _weight, size = CONTENT_HEAD.unpack_from(payload, 0)
    d.properties = payload[12:]
    d._size = size
    return size == 0


def content_body(d: Delivery | None, payload: bytes) -> bool:
    """A body frame of ``d``; True when the body is complete."""
    if d is None or d._size < 0:
        raise AMQPError(UNEXPECTED_FRAME, "unexpected content body", hard=True)
    parts = d._parts
    if not parts and len(payload) == d._size:  # the usual case: one body frame
        d.body = payload
        return True
    parts.append(payload)
    got = sum(len(p) for p in parts)
    if got > d._size:
        raise AMQPError(FRAME_ERROR, f"content body of {got} bytes exceeds the declared size {d._size}",
                        hard=True)
    if got < d._size:
        return False
    d.body = b"".join(parts)
    d._parts = []
    return True
