"""Wire constants and the struct-only encoders of the hot path (publish frames, acks).

pamqp encodes everything else; ``encode_publish_pamqp`` is kept to cross-check ours once.
"""
from __future__ import annotations

import struct

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.protocol import frames
from exchange_broker.protocol.constants import (FRAME_BODY, FRAME_END, FRAME_HEADER,  # noqa: F401
                                                FRAME_HEARTBEAT, FRAME_METHOD, FRAME_OVERHEAD)

# the project's one codec (exchange_broker.protocol.frames) under the names the load generator's
# hot loops use
_FRAME_HDR = frames.FRAME_HEAD
_U32 = frames.METHOD_ID
_ACKNACK = frames.TAG_BITS     # delivery-tag, bits
_HEARTBEAT = frames.HEARTBEAT_FRAME
_frame = frames.frame
ack_frame = frames.ack_frame
_U64 = struct.Struct(">Q")      # a delivery tag, a body size, a message's sequence number

# (class_id << 16) | method_id, read as one big-endian u32 from the payload
M_BASIC_DELIVER = (60 << 16) | 60
M_BASIC_ACK = (60 << 16) | 80
M_BASIC_NACK = (60 << 16) | 120

DEFAULT_FRAME_MAX = 131072


def _shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"shortstr too long: {value!r}")
    return bytes([len(raw)]) + raw


def encode_publish(channel: int, exchange: str, routing_key: str, body: bytes,
                   delivery_mode: int, frame_max: int) -> bytes:
    """basic.publish + content header + body frame(s), as raw bytes."""
    properties = b"\x10\x00" + bytes((delivery_mode,))  # property flags: delivery-mode only
    return b"".join(frames.publish_frames(channel, _shortstr(exchange), _shortstr(routing_key), False,
                                          properties, body, frame_max))


def encode_publish_pamqp(channel, exchange, routing_key, body, delivery_mode,
                          frame_max) -> bytes:
    """Reference encoding through pamqp, used once to cross-check ours."""
    parts = [
        pframe.marshal(commands.Basic.Publish(exchange=exchange,
                                              routing_key=routing_key), channel),
        pframe.marshal(pheader.ContentHeader(
            0, len(body), commands.Basic.Properties(delivery_mode=delivery_mode)),
            channel),
    ]
    chunk = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), chunk):
        parts.append(pframe.marshal(pbody.ContentBody(body[i:i + chunk]), channel))
    return b"".join(parts)



def body_offset(message: bytes, size: int) -> int:
    """Offset of the first body byte in an ``encode_publish`` result with one body frame."""
    offset = len(message) - 1 - size
    if size <= 0 or message[offset - 7] != FRAME_BODY:
        raise ValueError("the message must have exactly one non-empty body frame")
    return offset


def server_name(props: dict) -> str:
    """'product version' from connection.start's server-properties."""
    def s(v):
        return v.decode() if isinstance(v, bytes) else str(v)
    ver = props.get("version")
    prod = s(props.get("product", "?"))
    return f"{prod} {s(ver)}" if ver else prod
