"""Stream retention by x-max-age (in whole segments, x-stream-max-segment-size-bytes), sans-IO
on a ManualClock: a segment goes once its newest message is older than the age, checked when a
segment is opened and when a consumer attaches. The real-socket checks are in
tests/streams/test_stream_retention.py."""

from __future__ import annotations

from sansio import B, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock
from exchange_broker.queue_types.stream import find_stream

BODY = b"x" * 98  # + 2 bytes of empty properties = 100 bytes a message


def setup(segment_bytes: int):
    clock = ManualClock()
    c = SansIOClient(make_broker(clock=clock), clock)
    reply = c.call(Q.Declare(queue="s", durable=True, arguments={
        "x-queue-type": "stream", "x-max-age": "1s", "x-stream-max-segment-size-bytes": segment_bytes}))
    assert isinstance(reply, Q.DeclareOk), reply
    return clock, c, find_stream(c.broker, "/", "s")


def test_segments_older_than_max_age_go_when_a_new_segment_opens():
    clock, c, s = setup(500)
    for _ in range(10):  # two full segments
        c.publish("s", BODY)
    c.take()
    clock.advance(1.0)  # exactly the age: still kept
    c.publish("s", BODY)  # opens a new segment: retention runs
    c.take()
    assert s.info()["first_offset"] == 0
    for _ in range(4):
        c.publish("s", BODY)
    clock.advance(0.002)
    c.publish("s", BODY)  # the next segment: the first two are now older than 1 s
    c.take()
    assert s.info()["first_offset"] == 10 and s.message_count == 6


def test_max_age_applies_when_a_consumer_attaches():
    clock, c, s = setup(300)
    for _ in range(7):  # segments [0-2] [3-5] [6]
        c.publish("s", BODY)
    c.take()
    clock.advance(1.001)
    c.call(B.Qos(prefetch_count=10))
    c.call(B.Consume(queue="s", consumer_tag="c", arguments={"x-stream-offset": 0}))
    c.take()
    assert [d.properties.headers["x-stream-offset"] for d in c.deliveries] == [6]
    assert s.message_count == 1
