"""What stream consumers are sent: the stored message with an ``x-stream-offset`` header spliced
into its raw properties, and the store reads that bring older offsets back (run off the loop)."""

from __future__ import annotations

import struct

from exchange_broker.core.message import Message
from exchange_broker.protocol import codec

# -- the x-stream-offset header -------------------------------------------------------------------
_OFFSET_KEY = b"\x0fx-stream-offset"
_ENTRY_LEN = 16 + 1 + 8                  # key shortstr (len + 15 bytes), type 'l', int64
_U32 = struct.Struct(">I")


def _template(raw: bytes) -> tuple[bytes, bytes]:
    """(head, tail): ``head + int64 offset + tail`` are ``raw`` with the x-stream-offset header."""
    flags, pos = codec.headers_offset(raw)
    if flags & codec.FLAG_HEADERS:
        size = _U32.unpack_from(raw, pos)[0]
        table = raw[pos + 4:pos + 4 + size]
        if _OFFSET_KEY in table:  # e.g. a stream message republished: replace, don't duplicate
            props = codec.parse_properties(raw)
            headers = dict(props.get("headers") or {})
            if headers.pop("x-stream-offset", None) is not None:
                props["headers"] = headers
                return _template(codec.encode_properties(props))
        return (b"".join((raw[:pos], _U32.pack(size + _ENTRY_LEN), table, _OFFSET_KEY, b"l")),
                raw[pos + 4 + size:])
    flags |= codec.FLAG_HEADERS
    return (b"".join((bytes((flags >> 8, flags & 0xFF)), raw[2:pos], _U32.pack(_ENTRY_LEN),
                      _OFFSET_KEY, b"l")), raw[pos:])


_TEMPLATES: dict[bytes, tuple[bytes, bytes]] = {}
_I64 = struct.Struct(">q")


def _shape(raw: bytes) -> tuple[bytes, bytes]:
    """``_template(raw)``, cached per distinct properties value."""
    t = _TEMPLATES.get(raw)
    if t is None:
        if len(_TEMPLATES) >= 4096:
            _TEMPLATES.clear()
        t = _TEMPLATES[raw] = _template(bytes(raw))
    return t


class _Delivery(Message):
    """What stream consumers are sent (shared by all of them): the properties carry the
    x-stream-offset header, and it is never 'stored', so acking it removes no row."""

    __slots__ = ()


class _OffsetDelivery(_Delivery):
    """A stream's delivery of one offset, made in one call (a stream makes one per offset it
    delivers, or per offset it reads back from the store: this is on the hot path). Its
    ``props_shape`` is the properties' template around the offset (``Message.props_shape``)."""

    __slots__ = ("props_shape",)

    def __init__(self, exchange: str, routing_key: str, shape: tuple[bytes, bytes], offset: int,
                 body: bytes, created_ms: int, queue) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_shape = shape
        self.properties = shape[0] + _I64.pack(offset) + shape[1]
        self.body = body
        self.persistent = True
        self.priority = 0
        self.seq = offset + 1
        self.redelivered = False
        self.queue = queue
        self.stored = False
        self._props = None
        self.expires_ms = None
        self.created_ms = created_ms
        self.rejected = False
        self.delivered_at = None


def _delivery(exchange: str, routing_key: str, properties: bytes, body: bytes, offset: int,
              created_ms: int, queue) -> Message:
    return _OffsetDelivery(exchange, routing_key, _TEMPLATES.get(properties) or _shape(properties),
                           offset, body, created_ms, queue)


def _find_seq_at_time(store, queue_id: int, ts: int):
    return store.find_seq_at_time(queue_id, ts)


def _read_block(store, queue_id: int, start: int, end: int, queue) -> list:
    """Executor: offsets [start, end) as delivery messages, a dense list (None for a missing row)."""
    rows = store.read_log(queue_id, start, end)
    if len(rows) == end - start and (not rows or rows[-1][0] == end):  # dense: no gap
        return [_delivery(exchange, routing_key, props, body, seq - 1, created, queue)
                for seq, exchange, routing_key, props, body, created in rows]
    out: list = [None] * (end - start)
    for seq, exchange, routing_key, props, body, created in rows:
        out[seq - 1 - start] = _delivery(exchange, routing_key, props, body, seq - 1, created, queue)
    return out
