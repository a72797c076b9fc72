"""The stored form of a stream's log: chunks of consecutive messages, one row and one blob each.

A stream appends tens of thousands of messages a second and never updates them; a row per message
made the writer bind nine parameters per message while holding the GIL the event loop needs. A
chunk (up to :data:`CHUNK_MESSAGES` messages or about :data:`CHUNK_BYTES` bytes, all appended in one
commit) is one row whose blob holds its messages column by column:

========================  ====================================================================
``<BBIIq`` header         version (1), flags, message count, length of the names section,
                          first created_ms
names                     JSON ``[[exchange, routing_key], ...]``: the distinct pairs
pair index                ``uint16`` per message (``uint32`` with flag 1; omitted when the
                          chunk has one pair)
created_ms                ``uint32`` per message, after the first one's (``int64`` with flag 2)
properties lengths        ``uint32`` per message
body lengths              ``uint32`` per message
properties, bodies        all properties, then all bodies, concatenated
========================  ====================================================================

Integers are little-endian. Encoding costs a few list comprehensions per chunk; decoding a range
of a chunk slices only the messages asked for. Pure: no IO here (``sql_stream_log.py`` stores the
chunks).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from bisect import bisect_left
from itertools import accumulate

VERSION = 1
CHUNK_MESSAGES = 2048        # at most this many messages per chunk (reads rely on the bound)
CHUNK_BYTES = 1 << 20        # a chunk is closed once its properties and bodies pass this size
_HEAD = struct.Struct("<BBIIq")
FRAME_HEAD = struct.Struct("<qI")  # a chunk in a byte stream (/api/stream-chunks): first offset, length
WIDE_INDEX, WIDE_CREATED = 1, 2  # flags
_SWAP = sys.byteorder == "big"  # arrays are written little-endian


def _arr(code: str, values) -> bytes:
    a = array(code, values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _load(code: str, data: bytes, pos: int, n: int) -> tuple[array, int]:
    a = array(code)
    end = pos + n * a.itemsize
    a.frombytes(data[pos:end])
    if _SWAP:
        a.byteswap()
    return a, end


def split(entries: list, max_messages: int = CHUNK_MESSAGES, max_bytes: int = CHUNK_BYTES) -> list:
    """``entries`` (objects with exchange, routing_key, properties, body, created_ms, seq; seqs
    rising) cut into the lists that make one chunk each: consecutive seqs (a chunk stores only its
    first), at most ``max_messages`` and about ``max_bytes``."""
    n = len(entries)
    if not n:
        return []
    contiguous = entries[-1].seq - entries[0].seq == n - 1
    if contiguous and n <= max_messages and n * 64 < max_bytes:
        if sum([len(e.body) for e in entries]) < max_bytes:
            return [entries]
    out, cur, size = [], [], 0
    for e in entries:
        if cur and e.seq != cur[-1].seq + 1:  # a gap (appends whose commit failed)
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += len(e.body) + len(e.properties)
        if len(cur) >= max_messages or size >= max_bytes:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def encode(entries: list) -> tuple[bytes, int]:
    """One chunk's blob for ``entries`` (as for :func:`split`); returns (blob, bytes), bytes
    being the sum of len(properties) + len(body) (what stream retention counts)."""
    n = len(entries)
    pairs: dict = {}
    index = [pairs.setdefault((e.exchange, e.routing_key), len(pairs)) for e in entries]
    created = [e.created_ms for e in entries]
    base = created[0]
    props = [e.properties for e in entries]
    bodies = [e.body for e in entries]
    plens = [len(p) for p in props]
    blens = [len(b) for b in bodies]
    names = json.dumps(list(pairs), separators=(",", ":")).encode()
    flags = 0
    deltas = [c - base for c in created]
    try:
        stamps = _arr("I", deltas)
    except OverflowError:  # not rising, or 49 days apart: not from a stream's appends
        flags |= WIDE_CREATED
        stamps = _arr("q", deltas)
    parts = [b"", names]
    if len(pairs) > 1:
        if len(pairs) >= 65536:
            flags |= WIDE_INDEX
        parts.append(_arr("I" if flags & WIDE_INDEX else "H", index))
    parts[0] = _HEAD.pack(VERSION, flags, n, len(names), base)
    parts += [stamps, _arr("I", plens), _arr("I", blens), b"".join(props), b"".join(bodies)]
    return b"".join(parts), sum(plens) + sum(blens)


class Chunk:
    """A decoded chunk's columns; messages are sliced out on demand (:meth:`rows`)."""

    __slots__ = ("data", "n", "names", "index", "created", "pends", "bends", "props_at", "bodies_at")

    def __init__(self, blob) -> None:
        data = self.data = bytes(blob)
        version, flags, n, names_len, base = _HEAD.unpack_from(data, 0)
        if version != VERSION:
            raise ValueError(f"stream chunk version {version} is not known to this broker")
        self.n = n
        pos = _HEAD.size
        self.names = [tuple(p) for p in json.loads(data[pos:pos + names_len])]
        pos += names_len
        self.index = None
        if len(self.names) > 1:
            self.index, pos = _load("I" if flags & WIDE_INDEX else "H", data, pos, n)
        deltas, pos = _load("q" if flags & WIDE_CREATED else "I", data, pos, n)
        self.created = [base + d for d in deltas]
        plens, pos = _load("I", data, pos, n)
        blens, pos = _load("I", data, pos, n)
        self.pends = list(accumulate(plens, initial=0))
        self.props_at = pos
        self.bodies_at = pos + self.pends[-1]
        self.bends = list(accumulate(blens, initial=0))

    def sizes(self) -> list[int]:
        """len(properties) + len(body) of each message."""
        p, b = self.pends, self.bends
        return [p[i + 1] - p[i] + b[i + 1] - b[i] for i in range(self.n)]

    def first_at_or_after(self, created_ms: int) -> int:
        """The index of the first message created at ``created_ms`` or later (n: none)."""
        return bisect_left(self.created, created_ms)

    def rows(self, first_seq: int, lo: int, hi: int) -> list[tuple]:
        """Messages ``lo <= i < hi`` as (seq, exchange, routing_key, properties, body, created_ms)."""
        data, pa, ba, pe, be = self.data, self.props_at, self.bodies_at, self.pends, self.bends
        names, index, created = self.names, self.index, self.created
        one = names[0]
        return [(first_seq + i,
                 *(one if index is None else names[index[i]]),
                 data[pa + pe[i]:pa + pe[i + 1]], data[ba + be[i]:ba + be[i + 1]], created[i])
                for i in range(lo, hi)]


# -- chunks in a byte stream (GET /api/stream-chunks) -------------------------------------------------
def frame(first_offset: int, blob: bytes) -> bytes:
    """One stored chunk for a byte stream: ``<qI`` (its first offset, blob length), the blob."""
    return FRAME_HEAD.pack(first_offset, len(blob)) + bytes(blob)


def read_frames(data: bytes) -> list[tuple[int, "Chunk"]]:
    """(first offset, Chunk) of every chunk in ``data`` (a whole /api/stream-chunks answer)."""
    out, pos, n = [], 0, len(data)
    while pos < n:
        if n - pos < FRAME_HEAD.size:
            raise ValueError("stream chunks: cut short in a frame header")
        first, size = FRAME_HEAD.unpack_from(data, pos)
        pos += FRAME_HEAD.size
        if n - pos < size:
            raise ValueError("stream chunks: cut short in a chunk")
        out.append((first, Chunk(data[pos:pos + size])))
        pos += size
    return out
