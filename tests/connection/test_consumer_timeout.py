"""The consumer timeout (x-consumer-timeout, the broker's default), sans-IO on a ManualClock:
a delivery not acknowledged within the timeout closes its channel with 406 and goes back to the
queue. The server checks once a second (``Broker.tick``, as ``server/listener.py`` does); the
real-socket check is in tests/extensions/test_cc_reply_to_timeout.py."""

from __future__ import annotations

from sansio import B, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock

TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {ch} timed out. Timeout value used: {ms} ms. This "
        "timeout value can be configured, see consumers doc guide to learn more")


def setup(**broker_kwargs):
    clock = ManualClock()
    broker = make_broker(clock=clock, **broker_kwargs)
    return broker, clock, SansIOClient(broker, clock)


def seconds(broker, clock, n: float, step: float = 1.0) -> None:
    """Let ``n`` seconds pass with the server's once-a-second check."""
    while n > 1e-9:
        d = min(step, n)
        clock.advance(d)
        broker.tick()
        n -= d


def test_an_unacked_delivery_past_the_timeout_closes_its_channel_and_is_requeued():
    broker, clock, c = setup()
    c.call(Q.Declare(queue="q", arguments={"x-consumer-timeout": 1000}))
    c.publish("q", b"slow")
    c.publish("q", b"fast")
    c.call(B.Qos(prefetch_count=1), channel=2)
    c.call(B.Consume(queue="q", consumer_tag="slow"), channel=2)  # never acks
    clock.advance(0.5)
    c.call(B.Consume(queue="q", consumer_tag="fast", no_ack=True), channel=3)
    seconds(broker, clock, 1.0)  # 1.5 s for fast's (settled) delivery, 1.5 s for slow's
    c.take()
    assert c.closes[0].reply_code == 406 and c.closes[0].reply_text == TEXT.format(ch=2, ms=1000)
    assert len(c.closes) == 1  # channel 3 (no-ack) and the connection are untouched
    got = [(d.channel, d.body, d.method.redelivered) for d in c.deliveries]
    assert got == [(2, b"slow", False), (3, b"fast", False), (3, b"slow", True)]


def test_the_timeout_is_exact_to_the_check_and_an_ack_in_time_keeps_the_channel():
    broker, clock, c = setup()
    c.call(Q.Declare(queue="q", arguments={"x-consumer-timeout": 3000}))
    c.publish("q", b"a")
    c.publish("q", b"b")
    c.call(B.Consume(queue="q", consumer_tag="c"))
    first, second = c.deliveries
    seconds(broker, clock, 2.0, step=2.0)
    c.send(B.Ack(delivery_tag=first.method.delivery_tag))
    seconds(broker, clock, 1.0)  # exactly 3 s after the delivery: not yet over the limit
    c.take()
    assert c.closes == []
    seconds(broker, clock, 0.001)
    c.take()
    assert [f.reply_text for f in c.closes] == [TEXT.format(ch=1, ms=3000)]
    assert broker.vhosts["/"].queues["q"].message_count == 1  # b, back; a was acked
    assert c.get("q").body == b"b"


def test_basic_get_is_covered_too():
    broker, clock, c = setup()
    c.call(Q.Declare(queue="q", arguments={"x-consumer-timeout": 1000}))
    c.publish("q", b"x")
    assert c.get("q", no_ack=False).body == b"x"
    seconds(broker, clock, 2.0)
    c.take()
    assert [f.reply_code for f in c.closes] == [406]
    assert broker.vhosts["/"].queues["q"].message_count == 1


def test_without_the_argument_the_broker_default_applies():
    """RabbitMQ's default is 30 minutes (``serve --consumer-timeout``)."""
    broker, clock, c = setup()
    c.call(Q.Declare(queue="q"))
    c.publish("q", b"x")
    c.call(B.Consume(queue="q", consumer_tag="c"))
    seconds(broker, clock, 30 * 60, step=60)
    c.take()
    assert c.closes == []
    seconds(broker, clock, 60)
    c.take()
    assert [f.reply_text for f in c.closes] == [TEXT.format(ch=1, ms=1_800_000)]
    broker2, clock2, c2 = setup(consumer_timeout_ms=5000)
    c2.call(Q.Declare(queue="q"))
    c2.publish("q", b"x")
    c2.call(B.Consume(queue="q", consumer_tag="c"))
    seconds(broker2, clock2, 6)
    c2.take()
    assert [f.reply_text for f in c2.closes] == [TEXT.format(ch=1, ms=5000)]
