"""Dead-lettering rules (core/deadletter.py, Broker.dead_letter) sans-IO on a ManualClock:
TTL cycles are cut after one death (RabbitMQ 3.10), a requeue is not a death, a missing
dead-letter exchange drops quietly. The x-death shapes a client sees are checked over real
sockets in tests/extensions/test_deadletter.py."""

from __future__ import annotations

from sansio import B, E, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock


def setup():
    clock = ManualClock()
    return clock, SansIOClient(make_broker(clock=clock), clock)


def declare(c, name, **arguments):
    assert isinstance(c.call(Q.Declare(queue=name, arguments=arguments)), Q.DeclareOk)


def count(c, name):
    return c.broker.vhosts["/"].queues[name].message_count


def test_a_ttl_cycle_back_to_the_same_queue_drops_the_message_after_one_death():
    clock, c = setup()
    declare(c, "a", **{"x-message-ttl": 30, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
    c.publish("a", b"x")
    clock.advance(0.029)
    assert count(c, "a") == 1
    clock.advance(0.002)  # expired, dead-lettered to itself: a cycle, dropped
    assert count(c, "a") == 0
    clock.advance(10)
    assert count(c, "a") == 0


def test_a_ttl_cycle_through_two_queues_is_cut_where_it_closes():
    clock, c = setup()
    c.call(E.Declare(exchange="a-x", exchange_type="fanout"))
    declare(c, "watch")
    c.call(Q.Bind(queue="watch", exchange="a-x"))
    declare(c, "a", **{"x-message-ttl": 20, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"})
    declare(c, "b", **{"x-message-ttl": 20, "x-dead-letter-exchange": "a-x"})
    c.call(Q.Bind(queue="a", exchange="a-x"))
    c.publish("a", b"x")
    clock.advance(0.021)
    assert (count(c, "a"), count(c, "b"), count(c, "watch")) == (0, 1, 0)
    clock.advance(0.021)  # b -> a-x: a would close the cycle (dropped there), watch keeps it
    assert (count(c, "a"), count(c, "b"), count(c, "watch")) == (0, 0, 1)
    clock.advance(10)
    assert (count(c, "a"), count(c, "b"), count(c, "watch")) == (0, 0, 1)
    d = c.get("watch")
    assert [(x["queue"], x["reason"]) for x in d.properties.headers["x-death"]] == \
        [("b", "expired"), ("a", "expired")]


def test_a_nack_with_requeue_is_not_dead_lettered():
    clock, c = setup()
    declare(c, "dlq")
    declare(c, "src", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    c.publish("src", b"x")
    d = c.get("src", no_ack=False)
    c.send(B.Nack(delivery_tag=d.method.delivery_tag, requeue=True))
    clock.advance(1)
    assert (count(c, "dlq"), count(c, "src")) == (0, 1)


def test_a_missing_dead_letter_exchange_drops_quietly_and_the_channel_goes_on():
    clock, c = setup()
    declare(c, "src", **{"x-dead-letter-exchange": "absent"})
    c.publish("src", b"x")
    d = c.get("src", no_ack=False)
    c.send(B.Reject(delivery_tag=d.method.delivery_tag, requeue=False))
    c.take()
    assert count(c, "src") == 0 and c.closes == []
    c.publish("src", b"y")
    c.take()
    assert count(c, "src") == 1 and c.closes == []
