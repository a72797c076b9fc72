"""Wire constants and the struct-only encoders of the hot path (publish frames, acks).

pamqp encodes everything else; ``encode_publish_pamqp`` is kept to cross-check ours once.
"""
from __future__ import annotations

import struct

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7 byte header + 1 byte frame-end

_FRAME_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACKNACK = struct.Struct(">QB")  # delivery-tag, bits
# basic.ack method frame: type, channel, size(=13), class 60, method 80,
# delivery-tag, bits, frame-end
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_HEARTBEAT = bytes([FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END])

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


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HDR.pack(ftype, channel, len(payload)) + payload + b"\xce"


def encode_publish(channel: int, exchange: str, routing_key: str, body: bytes,
                   delivery_mode: int, frame_max: int) -> bytes:
    """basic.publish + content header + body frame(s), as raw bytes."""
    method = (struct.pack(">HHH", 60, 40, 0) + _shortstr(exchange)
              + _shortstr(routing_key) + b"\x00")  # mandatory=0 immediate=0
    # class-id, weight, body-size, property-flags (bit 12 = delivery-mode)
    header = struct.pack(">HHQHB", 60, 0, len(body), 0x1000, delivery_mode)
    out = [_frame(FRAME_METHOD, channel, method),
           _frame(FRAME_HEADER, channel, header)]
    chunk = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), chunk):
        out.append(_frame(FRAME_BODY, channel, body[i:i + chunk]))
    return b"".join(out)


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
