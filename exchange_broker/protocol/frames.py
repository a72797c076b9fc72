"""The frame layer every AMQP 0-9-1 user of this project goes through (server, inter-node client,
Spark client, load generator): frame headers packed and parsed, method / content header / body
framing, and the per-message frames (basic.publish, basic.ack/nack) built with ``struct``.

Nothing else in the package code packs or parses a frame header: a reader asks :func:`frame_at`
for the frame at a position of its buffer (and :func:`content_at` for a whole content header +
body), a writer asks :func:`frame` (or the fast paths here and in ``codec.py``) for bytes. Only the
benchmarks' load generator, whose loop must stay lean, unpacks with :data:`FRAME_HEAD` itself.
"""

from __future__ import annotations

import struct

from exchange_broker.protocol.constants import (FRAME_BODY, FRAME_END, FRAME_END_BYTE, FRAME_ERROR, FRAME_HEADER,
                                                FRAME_HEARTBEAT, FRAME_METHOD)
from exchange_broker.protocol.errors import AMQPError

FRAME_HEAD = struct.Struct(">BHI")        # frame type, channel, payload size
CONTENT_HEAD = struct.Struct(">HHQ")      # content header payload: class, weight, body size
METHOD_ID = struct.Struct(">I")           # (class << 16) | method, first 4 bytes of a method payload
_CONTENT_FRAME_HEAD = struct.Struct(">BHIHHQ")
_PUBLISH_HEAD = struct.Struct(">BHIHHH")  # frame type, channel, size, class, method, reserved-1
_ACK = struct.Struct(">BHIHHQB")
TAG_BITS = struct.Struct(">QB")        # delivery tag + bit octet of basic.ack/nack/reject (payload offset 4)
_HEADER_FRAME = struct.Struct(">BHIHHQH")  # a content header frame: head, class, weight, body size, flags

HEARTBEAT_FRAME = FRAME_HEAD.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    """One whole frame: header, payload, frame end."""
    return FRAME_HEAD.pack(ftype, channel, len(payload)) + payload + FRAME_END_BYTE


def frame_at(buf, pos: int, n: int) -> tuple[int, int, int] | None:
    """The complete frame at ``buf[pos:]`` (``n`` = bytes in ``buf``): (type, channel, end), its
    payload being ``buf[pos + 7:end]`` and the next frame starting at ``end + 1``; None when it
    is not all there yet. A bad frame-end octet raises AMQPError (501)."""
    if n - pos < 8:
        return None
    ftype, channel, size = FRAME_HEAD.unpack_from(buf, pos)
    end = pos + 7 + size
    if end >= n:
        return None
    if buf[end] != FRAME_END:
        raise AMQPError(FRAME_ERROR, f"invalid frame end byte 0x{buf[end]:02x}", hard=True)
    return ftype, channel, end


def content_at(buf, pos: int, n: int, channel: int) -> tuple[int, int, int, int, int] | None:
    """The usual content, all in ``buf`` at ``pos`` (right after its method frame): a well-formed
    content header frame of class 60 (basic) on ``channel`` and, unless the body is empty,
    exactly one body frame.
    Returns (first property-flags word, end of the properties, body start, body end, position
    after the content); the properties are ``buf[pos + 19:end]`` (flags included). None when it
    is not all there or not that simple: then take the frames one by one (which also reports
    whatever is wrong with them)."""
    if n - pos < 22:
        return None
    ftype, ch, size, class_id, _weight, body_size, flags = _HEADER_FRAME.unpack_from(buf, pos)
    hend = pos + 7 + size
    if ftype != FRAME_HEADER or ch != channel or size < 14 or hend >= n or buf[hend] != FRAME_END \
            or class_id != 60:
        return None
    b = hend + 1
    if not body_size:
        return flags, hend, b, b, b
    if n - b < 8:
        return None
    ftype, ch, size = FRAME_HEAD.unpack_from(buf, b)
    bend = b + 7 + size
    if ftype != FRAME_BODY or ch != channel or size != body_size or bend >= n or buf[bend] != FRAME_END:
        return None
    return flags, hend, b + 7, bend, bend + 1


def content_frames(channel: int, class_id: int, properties: bytes, body: bytes,
                   frame_max: int) -> list[bytes]:
    """Content header + body frames, the body split so no frame exceeds frame_max."""
    parts = [_CONTENT_FRAME_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), class_id, 0, len(body)),
             properties, FRAME_END_BYTE]
    size = len(body)
    if size:
        chunk = frame_max - 8
        if size <= chunk:
            parts += (FRAME_HEAD.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE)
        else:
            view = memoryview(body)
            for start in range(0, size, chunk):
                piece = view[start:start + chunk]
                parts += (FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return parts


def publish_method(channel: int, exchange_sh: bytes, routing_key_sh: bytes, mandatory: bool) -> bytes:
    """The basic.publish method frame; the exchange and routing key come encoded as short strings
    (``codec.short_str``)."""
    args = exchange_sh + routing_key_sh + (b"\x01" if mandatory else b"\x00")
    return _PUBLISH_HEAD.pack(FRAME_METHOD, channel, 6 + len(args), 60, 40, 0) + args + FRAME_END_BYTE


_PUBLISH_PACKERS: dict[tuple[int, int, int], struct.Struct] = {}


def _publish_packer(a: int, b: int, d: int) -> struct.Struct:
    """basic.publish, content header and body frame header in one Struct, for an exchange and
    routing key (encoded short strings) of a and b bytes and properties of d."""
    if len(_PUBLISH_PACKERS) >= 1024:
        _PUBLISH_PACKERS.clear()
    packer = _PUBLISH_PACKERS[(a, b, d)] = struct.Struct(f">BHIHHH{a}s{b}sBBBHIHHQ{d}sBBHI")
    return packer


def publish_frames(channel: int, exchange_sh: bytes, routing_key_sh: bytes, mandatory: bool,
                   properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """basic.publish + content header + body frames, the properties as raw content-header bytes
    (property flags, then the values). The usual case (one body frame) is one pack and the body
    as it is: the body is not copied before the write."""
    size = len(body)
    if 0 < size <= frame_max - 8:
        a, b, d = len(exchange_sh), len(routing_key_sh), len(properties)
        packer = _PUBLISH_PACKERS.get((a, b, d)) or _publish_packer(a, b, d)
        return [packer.pack(FRAME_METHOD, channel, 7 + a + b, 60, 40, 0, exchange_sh, routing_key_sh,
                            1 if mandatory else 0, FRAME_END, FRAME_HEADER, channel, 12 + d, 60, 0, size,
                            properties, FRAME_END, FRAME_BODY, channel, size),
                body, FRAME_END_BYTE]
    return [publish_method(channel, exchange_sh, routing_key_sh, mandatory)] + \
        content_frames(channel, 60, properties, body, frame_max)


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0) + FRAME_END_BYTE


def nack_frame(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """basic.nack (bits: multiple, requeue); the server sends it with requeue unset."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, bits) + FRAME_END_BYTE


def tag_bits_at(buf, pos: int) -> tuple[int, int]:
    """(delivery tag, bit octet) of a basic.ack/nack/reject whose method payload starts at ``pos``."""
    return TAG_BITS.unpack_from(buf, pos + 4)


def method_id_at(buf, pos: int) -> int:
    """(class << 16) | method of the method payload starting at ``buf[pos:]``."""
    return METHOD_ID.unpack_from(buf, pos)[0]


def content_head_at(buf, pos: int) -> tuple[int, int, int]:
    """(class, weight, body size) of the content header payload starting at ``buf[pos:]``; its
    property flags start at ``pos + 12``."""
    return CONTENT_HEAD.unpack_from(buf, pos)
