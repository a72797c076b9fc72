"""Incoming frames: the connection's receive buffer parsed into deliveries and methods.

This is the client's hot path (every message read passes through it), so it is written for
few Python operations per delivery:

* frames are found with the project's codec (``exchange_broker.protocol.frames.frame_at``);
* the buffer is ``bytes``: a body is one slice of it (one copy, no memoryview);
* a delivery whose three frames (``basic.deliver``, content header, one body frame) are all
  in the buffer is parsed in one step, without the per-frame state machine;
* consumer tags and the (exchange, routing key) pair are decoded once and then looked up by
  their raw bytes (a consumer sees the same few over and over);
* the property list a stream queue adds to a message published without properties (a
  headers table holding only ``x-stream-offset``) is recognised by its bytes and read with
  one ``struct`` call; anything else goes through ``codec.decode_properties``;
* a delivery is appended to the connection's flat list of columns (``batch.py``): no tuple
  per delivery, nothing for the garbage collector to scan.

Everything else (bodies split over several frames, a header frame not yet received, cold
methods) goes through the general per-frame path.
"""

from __future__ import annotations

from exchange_broker.protocol.errors import AMQPError as WireError
from exchange_broker.protocol.frames import content_at, content_head_at, frame_at

from .batch import offset_properties, stream_offset_of
from .codec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, I64, TAG_BIT, U16, decode_properties, shortstr
from .errors import ConnectionClosed

__all__ = ["parse_frames"]

_DELIVER_ID = b"\x00\x3c\x00\x3c"     # class 60, method 60: basic.deliver
# a headers table holding only {"x-stream-offset": <long>}: what a stream queue adds to a
# message published without properties
_OFFSET_TABLE = b"\x00\x00\x00\x19\x0fx-stream-offsetl"
_CACHE_MAX = 4096                      # raw names decoded and kept, per connection


def _names(raw: bytes) -> tuple[str, str]:
    """(exchange, routing key) from the tail of a basic.deliver: two short strings."""
    exchange, p = shortstr(raw, 0)
    return exchange, shortstr(raw, p)[0]


def parse_frames(conn, buf: bytes) -> int:
    """Parse every complete frame of ``buf``; returns the position after the last one.

    Complete deliveries are appended to ``conn._deliveries``; a delivery whose frames are not
    all here yet is kept in ``conn._partial``; other methods go to ``conn._on_method``."""
    try:
        return _parse(conn, buf)
    except WireError as exc:
        raise conn._fail(ConnectionClosed(f"protocol error: {exc}")) from None


def _parse(conn, buf: bytes) -> int:
    n = len(buf)
    pos = 0
    unpack_tag = TAG_BIT.unpack_from
    unpack_u16 = U16.unpack_from
    extend = conn._deliveries.extend
    ctags = conn._ctag_cache
    names = conn._name_cache
    while True:
        got = frame_at(buf, pos, n)
        if got is None:
            break
        ftype, channel, end = got
        if ftype == FRAME_METHOD and buf[pos + 7:pos + 11] == _DELIVER_ID:
            p = pos + 12 + buf[pos + 11]
            raw = buf[pos + 11:p]
            ctag = ctags.get(raw)
            if ctag is None:
                if len(ctags) >= _CACHE_MAX:
                    ctags.clear()
                ctag = ctags[raw] = shortstr(raw, 0)[0]
            tag, bits = unpack_tag(buf, p)
            raw = buf[p + 9:end]
            pair = names.get(raw)
            if pair is None:
                if len(names) >= _CACHE_MAX:      # many routing keys: keep the cache small
                    names.clear()
                pair = names[raw] = _names(raw)
            # the common case: the header frame and one body frame follow, all in the buffer;
            # a header frame without properties or with only the offset header is read without
            # decoding a property list
            h = end + 1
            whole = content_at(buf, h, n, channel)
            if whole is not None:
                flags, hend, bstart, bend, nxt = whole
                props = offset = None
                if flags == 0x2000 and hend == h + 50 and buf[h + 21:h + 42] == _OFFSET_TABLE:
                    offset = I64.unpack_from(buf, h + 42)[0]
                elif flags or hend != h + 21:
                    props = decode_properties(buf, h + 21, flags)
                    offset = stream_offset_of(props)
                extend((tag, bits & 1 == 1, pair, ctag, props, buf[bstart:bend] if bend > bstart else b"",
                        offset))
                pos = nxt
                continue
            conn._partial = [tag, bits & 1 == 1, pair, ctag, None, 0, [], None]
        elif ftype == FRAME_BODY:
            part = conn._partial
            if part is not None:               # (the content of a basic.return is dropped)
                chunk = buf[pos + 7:end]
                part[6].append(chunk)
                part[5] -= len(chunk)
                if part[5] <= 0:
                    _complete(conn)
        elif ftype == FRAME_HEADER:
            body_size = content_head_at(buf, pos + 7)[2]
            flags = unpack_u16(buf, pos + 19)[0]
            part = conn._partial
            if part is not None:
                if flags:
                    props = decode_properties(buf, pos + 21, flags)
                    part[7] = stream_offset_of(props)
                    part[4] = None if props == offset_properties(part[7]) else props
                part[5] = body_size
                if body_size == 0:
                    _complete(conn)
        elif ftype == FRAME_METHOD:
            conn._on_method(channel, buf[pos + 7:end])
        pos = end + 1
    return pos


def _complete(conn) -> None:
    tag, redelivered, pair, ctag, props, _left, chunks, offset = conn._partial
    conn._partial = None
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    conn._deliveries.extend((tag, redelivered, pair, ctag, props, body, offset))
