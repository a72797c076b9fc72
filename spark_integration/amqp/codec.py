"""Basic properties for the client's hot paths (``struct``, no pamqp per message); the frames
themselves are the project's one codec, ``exchange_broker.protocol.frames`` (plain AMQP 0-9-1:
nothing in it is particular to exchange-broker, so this client works against any broker).

* ``Properties`` / ``Delivery``: what a consumer receives; ``decode_properties`` reads the
  property list of a content header straight out of the receive buffer.
* ``publish_frames``: one ``basic.publish`` + content header + body frames (the sink publishes
  every row through it), the property list encoded here: header tables of strings here, tables
  with typed values (numbers, booleans, nested tables) through pamqp.
"""

from __future__ import annotations

import datetime as _dt
import struct
from typing import Any, NamedTuple

from pamqp import decode as pdecode
from pamqp import encode as pencode

from exchange_broker.protocol import frames
from exchange_broker.protocol.constants import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD

__all__ = ["Properties", "EMPTY_PROPERTIES", "Delivery", "decode_properties", "encode_property_list",
           "publish_frames", "raw_properties", "shortstr", "FRAME_METHOD", "FRAME_HEADER", "FRAME_BODY",
           "FRAME_HEARTBEAT", "FRAME_END", "MAX_PREFETCH"]

MAX_PREFETCH = 65535  # basic.qos prefetch-count is a short

I64 = struct.Struct(">q")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
TAG_BIT = struct.Struct(">QB")


class Properties(NamedTuple):
    """basic properties, decoded; absent ones are None.  ``timestamp`` is seconds since the epoch."""
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


EMPTY_PROPERTIES = Properties()


class Delivery(NamedTuple):
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Properties
    body: bytes
    consumer_tag: str


# property flag bit -> (field index, kind); kinds: s=shortstr, t=table, o=octet, q=u64 timestamp
_PROP_LAYOUT = ((15, "s"), (14, "s"), (13, "t"), (12, "o"), (11, "o"), (10, "s"), (9, "s"),
                (8, "s"), (7, "s"), (6, "q"), (5, "s"), (4, "s"), (3, "s"), (2, "s"))


def shortstr(buf, pos: int) -> tuple[str, int]:
    """A short string from ``buf`` (bytes or bytearray) at ``pos``; returns (text, next pos)."""
    n = buf[pos]
    return buf[pos + 1:pos + 1 + n].decode("utf-8", "replace"), pos + 1 + n


# a headers table holding only {"x-stream-offset": <long>}: what a stream queue adds to a
# message published without headers (decoded without pamqp: it is on every stream delivery)
_OFFSET_TABLE = b"\x00\x00\x00\x19\x0fx-stream-offsetl"


def decode_properties(buf, pos: int, flags: int) -> Properties:
    """Decode the property list of a content header (``flags`` = first property-flags word)."""
    if flags == 0x2000 and buf[pos:pos + 21] == _OFFSET_TABLE:
        return Properties(None, None, {"x-stream-offset": I64.unpack_from(buf, pos + 21)[0]})
    values: list[Any] = [None] * 14
    if flags & 1:  # continuation flags: skip the extra words (no basic property uses them)
        while True:
            (more,) = U16.unpack_from(buf, pos)
            pos += 2
            if not more & 1:
                break
    for i, (bit, kind) in enumerate(_PROP_LAYOUT):
        if not flags & (1 << bit):
            continue
        if kind == "s":
            values[i], pos = shortstr(buf, pos)
        elif kind == "o":
            values[i] = buf[pos]
            pos += 1
        elif kind == "q":
            (values[i],) = U64.unpack_from(buf, pos)
            pos += 8
        elif buf[pos:pos + 21] == _OFFSET_TABLE:
            values[i] = {"x-stream-offset": I64.unpack_from(buf, pos + 21)[0]}
            pos += 29
        else:
            (size,) = U32.unpack_from(buf, pos)
            _, values[i] = pdecode.field_table(bytes(buf[pos:pos + 4 + size]))
            pos += 4 + size
    return Properties(*values)


# ---------------------------------------------------------------------------- fast encoding
def _short(text: str | None) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if len(raw) > 255:
        raise ValueError(f"AMQP short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def _table(headers) -> bytes:
    """A field table.  Keys and string values (``S``) are encoded here, ``None`` as void;
    a table holding other types (ints, booleans, nested tables...) is encoded by pamqp."""
    items = list(headers.items() if isinstance(headers, dict) else headers)
    parts = []
    for key, value in items:
        if value is None:
            parts.append(_short(str(key)) + b"V")
        elif isinstance(value, str):
            raw = value.encode("utf-8")
            parts.append(_short(str(key)) + b"S" + U32.pack(len(raw)) + raw)
        else:
            return pencode.field_table(dict(items))
    payload = b"".join(parts)
    return U32.pack(len(payload)) + payload


# property name -> (flag bit, kind); in wire order
_FIELDS = (("content_type", 15, "s"), ("content_encoding", 14, "s"), ("headers", 13, "t"),
           ("delivery_mode", 12, "o"), ("priority", 11, "o"), ("correlation_id", 10, "s"),
           ("reply_to", 9, "s"), ("expiration", 8, "s"), ("message_id", 7, "s"),
           ("timestamp", 6, "q"), ("type", 5, "s"), ("user_id", 4, "s"), ("app_id", 3, "s"),
           ("cluster_id", 2, "s"))


def encode_property_list(props: dict | None) -> tuple[int, bytes]:
    """(flags, encoded property list) for a dict of basic properties; None values are absent.

    ``timestamp`` is seconds since the epoch (int/float) or a datetime; ``headers`` a dict or
    (key, value) pairs whose values are sent as strings."""
    if not props:
        return 0, b""
    flags = 0
    parts = []
    get = props.get
    for name, bit, kind in _FIELDS:
        value = get(name)
        if value is None:
            continue
        flags |= 1 << bit
        if kind == "s":
            parts.append(_short(value))
        elif kind == "o":
            parts.append(bytes((int(value) & 0xFF,)))
        elif kind == "q":
            if isinstance(value, _dt.datetime):
                if value.tzinfo is None:
                    value = value.replace(tzinfo=_dt.timezone.utc)
                value = value.timestamp()
            parts.append(U64.pack(int(value)))
        else:
            parts.append(_table(value))
    return flags, b"".join(parts)


def raw_properties(props: dict | None) -> bytes:
    """Content-header property bytes (flags word + list) for a dict of basic properties."""
    flags, plist = encode_property_list(props)
    return U16.pack(flags) + plist


def publish_frames(exchange: str, routing_key: str, body: bytes, props: dict | None = None,
                   mandatory: bool = False, frame_max: int = 131072, channel: int = 1) -> bytes:
    """One basic.publish as bytes: method frame, content header, body frame(s)."""
    return b"".join(frames.publish_frames(channel, _short(exchange), _short(routing_key), mandatory,
                                          raw_properties(props), body, frame_max))
