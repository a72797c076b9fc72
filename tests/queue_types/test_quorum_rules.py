"""Quorum queue rules sans-IO on a ManualClock: the delivery limit (each return counts, past the
limit the message is dead-lettered or dropped) and the message TTL. The real-socket checks (the
x-delivery-count header a client sees, restarts) are in tests/quorum/test_quorum_queues.py."""

from __future__ import annotations

from sansio import B, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock

QQ = {"x-queue-type": "quorum"}


def setup():
    clock = ManualClock()
    return clock, SansIOClient(make_broker(clock=clock), clock)


def declare(c, name, **arguments):
    reply = c.call(Q.Declare(queue=name, durable=True, arguments=arguments))
    assert isinstance(reply, Q.DeclareOk), reply


def test_every_kind_of_return_counts_and_past_the_limit_the_message_is_dropped():
    clock, c = setup()
    declare(c, "qq", **QQ, **{"x-delivery-limit": 2})
    c.publish("qq", b"x")
    d = c.get("qq", no_ack=False, channel=2)
    c.close_channel(2)  # 1: a channel closed with it unacknowledged
    c.call(B.Qos(prefetch_count=1), channel=3)
    c.call(B.Consume(queue="qq", consumer_tag="c"), channel=3)
    d = c.deliveries[-1]
    assert d.properties.headers["x-delivery-count"] == 1 and d.method.redelivered
    c.call(B.Cancel(consumer_tag="c"), channel=3)
    c.close_channel(3)  # 2: the consumer's channel closed with it unacknowledged
    d = c.get("qq", no_ack=False)
    assert d.properties.headers["x-delivery-count"] == 2
    c.send(B.Reject(delivery_tag=d.method.delivery_tag, requeue=True))  # 3 > 2: dropped (no DLX)
    c.take()
    assert c.get("qq") is None and c.broker.vhosts["/"].queues["qq"].message_count == 0


def test_past_the_limit_it_is_dead_lettered_with_reason_delivery_limit():
    clock, c = setup()
    declare(c, "dlq")
    declare(c, "qq", **QQ, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                              "x-dead-letter-routing-key": "dlq"})
    c.publish("qq", b"poison", headers={"k": "v"})
    for expected in (None, 1):
        d = c.get("qq", no_ack=False)
        assert (d.properties.headers or {}).get("x-delivery-count") == expected
        c.send(B.Nack(delivery_tag=d.method.delivery_tag, requeue=True))
        c.take()
    assert c.get("qq") is None
    dead = c.get("dlq")
    assert dead.body == b"poison" and dead.properties.headers["k"] == "v"
    assert "x-delivery-count" not in dead.properties.headers
    death = dead.properties.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "qq", 1)


def test_message_ttl_on_a_quorum_queue():
    clock, c = setup()
    declare(c, "qq", **QQ, **{"x-message-ttl": 100})
    c.publish("qq", b"gone")
    clock.advance(0.099)
    assert c.broker.vhosts["/"].queues["qq"].message_count == 1
    clock.advance(0.002)
    assert c.get("qq") is None
