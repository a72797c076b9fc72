"""Stream filtering over AMQP 0-9-1 (RabbitMQ 3.13): x-stream-filter-value on publish,
x-stream-filter (string or array) and x-stream-match-unfiltered on basic.consume, with pika;
the filter must survive a restart (messages read back from the store are filtered too)."""
from __future__ import annotations

import pika
import pytest
from stream_helpers import connect, declare_stream, publish, read

from eb_support import uniq
from exchange_broker.queue_types.stream_filter import filter_spec, wanted
from exchange_broker.protocol import codec


def _fill(ch, q):
    """Offsets 0-8: three each of california, texas and unfiltered, interleaved."""
    ch.confirm_delivery()
    for i in range(3):
        publish(ch, q, [f"ca{i}".encode()], {"x-stream-filter-value": "california"})
        publish(ch, q, [f"tx{i}".encode()], {"x-stream-filter-value": "texas"})
        publish(ch, q, [f"un{i}".encode()])


@pytest.mark.parametrize("extra, expected", [
    ({"x-stream-filter": "california"}, [b"ca0", b"ca1", b"ca2"]),
    ({"x-stream-filter": ["texas", "california"]}, [b"ca0", b"tx0", b"ca1", b"tx1", b"ca2", b"tx2"]),
    ({"x-stream-filter": "texas", "x-stream-match-unfiltered": True},
     [b"tx0", b"un0", b"tx1", b"un1", b"tx2", b"un2"]),
    ({"x-stream-filter": "nevada"}, []),
    ({}, [b"ca0", b"tx0", b"un0", b"ca1", b"tx1", b"un1", b"ca2", b"tx2", b"un2"]),
])
def test_filtered_consumers_get_their_values(conn, extra, expected):
    ch = conn.channel()
    q = uniq("fs")
    declare_stream(ch, q)
    _fill(ch, q)
    got = read(conn, q, offset="first", extra=extra, idle=0.7)
    assert [b for b, _, _ in got] == expected
    # offsets are the stream's own (skipped ones leave gaps)
    if extra.get("x-stream-filter") == "california":
        assert [o for _, o, _ in got] == [0, 3, 6]


def test_live_filtered_consumer_and_filter_size_argument(conn):
    ch = conn.channel()
    q = uniq("fs")
    declare_stream(ch, q, **{"x-stream-filter-size-bytes": 32})
    got = []
    cch = conn.channel()
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(q, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-filter": "texas"})
    _fill(ch, q)
    for _ in range(100):   # up to 10 s on a loaded machine
        conn.process_data_events(0.1)
        if len(got) >= 3:
            break
    conn.process_data_events(0.3)   # nothing more arrives
    assert got == [b"tx0", b"tx1", b"tx2"]


@pytest.mark.parametrize("value, text", [(8, "Invalid value"), (300, "Invalid value"),
                                         ("big", "Invalid type")])
def test_filter_size_checked_as_rabbitmq(connect, value, text):
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        declare_stream(ch, uniq("fs"), **{"x-stream-filter-size-bytes": value})
    assert err.value.reply_code == 406 and f"{text} for x-stream-filter-size-bytes" in err.value.reply_text


def test_filtering_reads_back_from_the_store(broker_process):
    b = broker_process()
    c = connect(b.port)
    ch = c.channel()
    declare_stream(ch, "kept")
    _fill(ch, "kept")
    c.close()
    assert b.terminate() == 0
    b = broker_process()
    c = connect(b.port)
    try:
        got = read(c, "kept", offset="first", extra={"x-stream-filter": ["california"],
                                                      "x-stream-match-unfiltered": True}, idle=0.7)
        assert [x for x, _, _ in got] == [b"ca0", b"un0", b"ca1", b"un1", b"ca2", b"un2"]
    finally:
        c.close()


def test_filter_spec_as_rabbitmq_reads_it():
    assert filter_spec({}) is None
    assert filter_spec({"x-stream-match-unfiltered": True}) is None    # no filter: everything
    assert filter_spec({"x-stream-filter": 5}) is None                  # not a string: no filtering
    assert filter_spec({"x-stream-filter": ["a", 1, b"b"]}) == (frozenset({b"a", b"b"}), False)
    spec = filter_spec({"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"})
    assert spec == (frozenset({b"a"}), False)                          # only a bool counts
    props = codec.encode_properties
    assert wanted(spec, props({"headers": {"x-stream-filter-value": "a"}}))
    assert not wanted(spec, props({"headers": {"x-stream-filter-value": "b"}}))
    assert not wanted(spec, props({"headers": {"x-stream-filter-value": 7}}))   # unfiltered
    assert wanted((frozenset({b"a"}), True), props({"headers": {"x-stream-filter-value": 7}}))
