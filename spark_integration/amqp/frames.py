"""Incoming frames: the connection's receive buffer parsed into deliveries and methods.

This is the client's hot path (every message read passes through it), so it is written for
few Python operations per delivery:

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

import struct

from .batch import offset_properties, stream_offset_of
from .codec import (CONTENT_HDR, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD, HDR,
                    TAG_BIT, decode_properties, shortstr)
from .errors import ConnectionClosed

__all__ = ["parse_frames"]

M_DELIVER = (60 << 16) | 60
_METHOD = struct.Struct(">I")          # class and method ids
# a header frame without properties (its end byte included) and the next frame's head
_PLAIN = struct.Struct(">BHIHHQHBBHI")
# the property list holding only the offset header, the frame's end, the next frame's head
_OFFSET_ONLY = struct.Struct(">21sqBBHI")
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
    n = len(buf)
    pos = 0
    unpack_hdr = HDR.unpack_from
    unpack_method = _METHOD.unpack_from
    unpack_tag = TAG_BIT.unpack_from
    unpack_plain = _PLAIN.unpack_from
    unpack_offset = _OFFSET_ONLY.unpack_from
    extend = conn._deliveries.extend
    ctags = conn._ctag_cache
    names = conn._name_cache
    while n - pos >= 8:
        ftype, channel, size = unpack_hdr(buf, pos)
        end = pos + 7 + size
        if end >= n:
            break
        if buf[end] != FRAME_END:
            raise conn._fail(ConnectionClosed("protocol error: bad frame end"))
        if ftype == FRAME_METHOD and unpack_method(buf, pos + 7)[0] == M_DELIVER:
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
            # a header frame without properties or with only the offset header is read
            # together with the body frame's head
            h = end + 1
            b = 0                                 # start of the body frame, once known
            if n - h >= 29:
                htype, _c, hsize, _k, _w, body_size, flags, hend, btype, _c, bsize = \
                    unpack_plain(buf, h)
                if htype == FRAME_HEADER:
                    props = offset = None
                    if hsize == 14 and hend == FRAME_END and not flags:
                        b = h + 22
                    elif flags == 0x2000 and hsize == 43 and n - h >= 58:
                        table, offset, hend, btype, _c, bsize = unpack_offset(buf, h + 21)
                        if table == _OFFSET_TABLE and hend == FRAME_END:
                            b = h + 51
                    if not b:
                        hend = h + 7 + hsize
                        if hend + 8 < n and buf[hend] == FRAME_END:
                            props = decode_properties(buf, h + 21, flags)
                            offset = stream_offset_of(props)
                            b = hend + 1
                            btype, _c, bsize = unpack_hdr(buf, b)
                    if b:
                        if not body_size:
                            extend((tag, bits & 1 == 1, pair, ctag, props, b"", offset))
                            pos = b
                            continue
                        bend = b + 7 + bsize
                        if (btype == FRAME_BODY and bsize == body_size and bend < n
                                and buf[bend] == FRAME_END):
                            extend((tag, bits & 1 == 1, pair, ctag, props, buf[b + 7:bend],
                                    offset))
                            pos = bend + 1
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
            _cls, _w, body_size, flags = CONTENT_HDR.unpack_from(buf, pos + 7)
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
            conn._on_method(channel, buf[pos:end + 1])
        pos = end + 1
    return pos


def _complete(conn) -> None:
    tag, redelivered, pair, ctag, props, _left, chunks, offset = conn._partial
    conn._partial = None
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    conn._deliveries.extend((tag, redelivered, pair, ctag, props, body, offset))
