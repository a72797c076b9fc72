"""The stored form of stream logs (persistence/stream_chunks.py): chunks encode and decode every
field exactly, cut where they must (gaps, size), and refuse a blob they do not know."""

from __future__ import annotations

import pytest

from persistence.store import StoredMessage
from persistence.stream_chunks import CHUNK_MESSAGES, Chunk, encode, split


def _m(seq, body=b"b", created=1000, exchange="", rk="k", props=b"\x00\x00"):
    return StoredMessage(1, seq, exchange, rk, props, body, created)


def _decoded(entries):
    blob, size = encode(entries)
    chunk = Chunk(blob)
    assert size == sum(len(e.properties) + len(e.body) for e in entries)
    return chunk, chunk.rows(entries[0].seq, 0, chunk.n)


def test_round_trip_keeps_every_field_and_slices_ranges():
    entries = [_m(s, b"x" * (s % 7), 5000 + s // 3, exchange=("amq.topic" if s % 2 else "ünï"),
                  rk=f"k.{s % 3}", props=b"\x10\x00\x02" if s % 5 else b"\x00\x00")
               for s in range(11, 111)]
    chunk, rows = _decoded(entries)
    assert rows == [(e.seq, e.exchange, e.routing_key, e.properties, e.body, e.created_ms)
                    for e in entries]
    assert chunk.rows(11, 40, 43) == rows[40:43]
    assert chunk.sizes() == [len(e.properties) + len(e.body) for e in entries]
    assert chunk.first_at_or_after(5020) == rows.index(next(r for r in rows if r[5] >= 5020))
    assert chunk.first_at_or_after(10 ** 9) == chunk.n


def test_timestamps_that_fall_or_jump_far_and_empty_bodies_still_round_trip():
    entries = [_m(1, b"", 10 ** 12), _m(2, b"", 5), _m(3, b"z", 10 ** 12 + 2 ** 40)]
    _chunk, rows = _decoded(entries)
    assert [(r[4], r[5]) for r in rows] == [(b"", 10 ** 12), (b"", 5), (b"z", 10 ** 12 + 2 ** 40)]


def test_many_distinct_names_use_a_wide_index():
    entries = [_m(s, rk=f"key-{s}") for s in range(1, 70_001)]
    parts = split(entries, max_messages=100_000, max_bytes=1 << 30)
    assert len(parts) == 1
    _chunk, rows = _decoded(parts[0])
    assert rows[-1][2] == "key-70000" and rows[65_540][2] == "key-65541"


def test_split_cuts_at_gaps_the_message_bound_and_the_byte_bound():
    entries = [_m(s) for s in range(1, 5001)] + [_m(s) for s in range(5003, 5010)]
    parts = split(entries)
    assert [len(p) for p in parts] == [CHUNK_MESSAGES, CHUNK_MESSAGES, 5000 - 2 * CHUNK_MESSAGES, 7]
    for p in parts:
        assert p[-1].seq - p[0].seq == len(p) - 1  # consecutive within a chunk
    big = [_m(s, b"x" * 400_000) for s in range(1, 8)]
    assert [len(p) for p in split(big)] == [3, 3, 1]  # closed once past 1 MiB
    assert split([]) == []


def test_an_unknown_version_is_refused_not_misread():
    blob, _ = encode([_m(1)])
    with pytest.raises(ValueError, match="version 9"):
        Chunk(b"\x09" + blob[1:])
