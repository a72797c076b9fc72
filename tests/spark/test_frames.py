"""The client's delivery parser (``amqp/frames.py``) and the columns it fills (``amqp/batch.py``).

Frames are encoded by pamqp (and, for the property list a stream queue adds, byte for byte as
the brokers send it), then fed to a ``Connection`` in pieces of every size: each delivery must
come out the same whatever the split, through the one-step path (all three frames in the
buffer) and the per-frame path (split frames, bodies over several frames) alike.
"""

from __future__ import annotations

import struct

import pytest

pa = pytest.importorskip("pyarrow")

from pamqp import body as pbody, commands, frame as pframe, header as pheader  # noqa: E402

from spark_integration.amqp import Connection, ConnectionParams, DeliveryBatch  # noqa: E402
from spark_integration.amqp.batch import offset_properties  # noqa: E402
from spark_integration.reader import _keep, _RangeState  # noqa: E402
from spark_integration.rows import batch_to_record_batch, to_record_batch  # noqa: E402

HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def deliver(tag, body, props=None, exchange="ex", key="rk", ctag="ctag-1", redelivered=False,
            frame_max=64):
    frames = [commands.Basic.Deliver(consumer_tag=ctag, delivery_tag=tag, redelivered=redelivered,
                                     exchange=exchange, routing_key=key),
              pheader.ContentHeader(0, len(body), props or commands.Basic.Properties())]
    frames += [pbody.ContentBody(body[i:i + frame_max]) for i in range(0, len(body), frame_max)]
    return b"".join(pframe.marshal(f, 1) for f in frames)


def stream_deliver(tag, offset, body, key="s"):
    """A delivery as a stream queue sends it for a message published without properties: the
    headers table holds only ``x-stream-offset`` as a long (``l``)."""
    method = pframe.marshal(commands.Basic.Deliver(consumer_tag="ctag-s", delivery_tag=tag,
                                                   exchange="", routing_key=key), 1)
    table = b"\x0fx-stream-offsetl" + struct.pack(">q", offset)
    payload = struct.pack(">HHQH", 60, 0, len(body), 0x2000) + struct.pack(">I", len(table)) + table
    head = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    return method + head + struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce"


def parse_in_pieces(data: bytes, size: int) -> DeliveryBatch:
    conn = Connection(ConnectionParams.from_url("amqp://guest:guest@127.0.0.1:1/%2F"))
    for i in range(0, len(data), size):
        conn._parse(data[i:i + size])
    assert conn._rest == b"" and conn._partial is None
    return conn._pop(10 ** 6)


def sample() -> tuple[bytes, list[tuple]]:
    """Deliveries of every shape, and what each must come out as:
    (tag, redelivered, exchange, key, body, offset, message_id, headers)."""
    ts_props = commands.Basic.Properties(message_id="m-3", headers={"x-stream-offset": 7, "a": "b"},
                                         priority=4)
    parts = [
        (deliver(1, b"plain"), (1, False, "ex", "rk", b"plain", None, None, None)),
        (HEARTBEAT, None),
        (deliver(2, b"", redelivered=True), (2, True, "ex", "rk", b"", None, None, None)),
        (deliver(3, b"p" * 150, ts_props, key="other"),       # body over three frames
         (3, False, "ex", "other", b"p" * 150, 7, "m-3", {"x-stream-offset": 7, "a": "b"})),
        (stream_deliver(4, 10, b"s" * 20), (4, False, "", "s", b"s" * 20, 10, None,
                                           {"x-stream-offset": 10})),
        (stream_deliver(5, 2 ** 40, b""), (5, False, "", "s", b"", 2 ** 40, None,
                                          {"x-stream-offset": 2 ** 40})),
        (deliver(6, b"small-int", commands.Basic.Properties(headers={"x-stream-offset": 5})),
         (6, False, "ex", "rk", b"small-int", 5, None, {"x-stream-offset": 5})),
        (deliver(7, "é".encode(), exchange="ex-2", key="ключ", ctag="ctag-2"),
         (7, False, "ex-2", "ключ", "é".encode(), None, None, None)),
    ]
    return b"".join(p for p, _ in parts), [e for _, e in parts if e is not None]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 13, 64, 100, 1000, 1 << 20])
def test_every_split_gives_the_same_deliveries(size):
    data, expected = sample()
    got = parse_in_pieces(data, size)
    assert len(got) == len(expected)
    assert got.offsets == [e[5] for e in expected]
    for row, e in zip(got.rows(), expected):
        tag, redelivered, exchange, key, body, offset, message_id, headers = e
        assert (row.delivery_tag, row.redelivered, row.exchange, row.routing_key, row.body) == \
            (tag, redelivered, exchange, key, body)
        assert row.properties.message_id == message_id
        assert row.properties.headers == headers
    assert got.consumer_tags == ["ctag-1"] * 3 + ["ctag-s"] * 2 + ["ctag-1", "ctag-2"]


def test_methods_between_deliveries_still_reach_the_connection():
    cancel = pframe.marshal(commands.Basic.Cancel(consumer_tag="ctag-1"), 1)
    data = deliver(1, b"a") + cancel + stream_deliver(2, 0, b"b")
    conn = Connection(ConnectionParams.from_url("amqp://guest:guest@127.0.0.1:1/%2F"))
    conn._parse(data)
    assert conn.cancelled == {"ctag-1"}
    assert [d.body for d in conn._pop(10).rows()] == [b"a", b"b"]


def test_the_arrow_batch_is_the_same_from_columns_and_from_rows():
    data, _ = sample()
    got = parse_in_pieces(data, 1 << 20)
    for stream in (False, True):
        assert batch_to_record_batch(got, "q", stream).equals(to_record_batch(got.rows(), "q", stream))
    only_offsets = parse_in_pieces(b"".join(stream_deliver(i, 100 + i, b"x%d" % i)
                                            for i in range(1, 50)), 4096)
    assert only_offsets.raw_properties == [None] * 49          # the offset-only fast path
    batch = batch_to_record_batch(only_offsets, "s", True)
    assert batch.equals(to_record_batch(only_offsets.rows(), "s", True))
    assert batch.column("offset").to_pylist() == list(range(101, 150))
    assert batch.column("headers")[0].as_py() == [("x-stream-offset", "101")]
    assert DeliveryBatch.from_rows(only_offsets.rows()).flat == only_offsets.flat


def batch_with_offsets(offsets):
    flat = []
    for i, off in enumerate(offsets):
        flat.extend((i + 1, False, ("", "s"), "c", None, b"%d" % off, off))
    return DeliveryBatch(flat)


@pytest.mark.parametrize("offsets, resume, end, kept, resume_after", [
    ([0, 1, 2, 3, 4], 0, 10, [0, 1, 2, 3, 4], 5),
    ([0, 1, 2, 3, 4], 2, 10, [2, 3, 4], 5),            # a chunk started before the range
    ([0, 1, 2, 3, 4], 2, 4, [2, 3], 4),                # the range ends inside
    ([5, 6, 7], 2, 10, [5, 6, 7], 8),                  # a gap before (data loss, checked apart)
    ([0, 1], 5, 10, [], 5),                            # all below
    ([0, 2, 3, 7, 9], 1, 8, [2, 3, 7], 8),             # not consecutive
    ([0, 2, 3, 7, 9], 1, 20, [2, 3, 7, 9], 10),
    ([3, 3, 4], 3, 10, [3, 4], 5),                     # a repeated offset is kept once
])
def test_keep_takes_exactly_the_range(offsets, resume, end, kept, resume_after):
    state = _RangeState(resume)
    got = batch_with_offsets(offsets)
    _keep(got, got.offsets, state, end)
    assert state.rows.offsets == kept
    assert state.resume == resume_after
    assert state.last == offsets[-1]


def test_offset_properties():
    assert offset_properties(None).headers is None
    assert offset_properties(3).headers == {"x-stream-offset": 3}


def test_sink_frames_decode_as_the_publishes_of_the_rows():
    """frames_for_batch (the sink's encoder, over the project's codec) read back by pamqp: the fast
    path (no properties, one body frame), an empty body, a body over several frames, headers."""
    from spark_integration.publish_rows import frames_for_batch

    rows = {"body": [b"a", b"", b"x" * 300, b"h"], "routing_key": ["k1", "k2", "k3", "k4"],
            "headers": [None, None, None, {"h": "v"}]}
    batch = pa.RecordBatch.from_pydict(rows, schema=pa.schema([
        ("body", pa.binary()), ("routing_key", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))]))
    out, size = frames_for_batch(batch, "ex", None, True, 128, {})
    assert size == 302 and len(out) == 4
    for data, body, key, headers in zip(out, rows["body"], rows["routing_key"], rows["headers"]):
        frames, pos = [], 0
        while pos < len(data):
            used, channel, f = pframe.unmarshal(data[pos:])
            frames.append(f)
            pos += used
        publish, header, *bodies = frames
        assert (publish.exchange, publish.routing_key, publish.mandatory) == ("ex", key, True)
        assert header.body_size == len(body) and header.properties.headers == headers
        assert b"".join(b.value for b in bodies) == body and all(len(b.value) <= 120 for b in bodies)
