"""Message TTL (x-message-ttl, per-message expiration) and queue expiry (x-expires) on a classic
queue, sans-IO on a ManualClock: each rule checked at the exact millisecond it applies.
Behaviour as RabbitMQ 3.10 (checked by hand); the real-socket checks are in
tests/extensions/test_ttl.py."""

from __future__ import annotations

import pytest
from sansio import B, E, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def client(clock):
    return SansIOClient(make_broker(clock=clock), clock)


def queue(client, name):
    return client.broker.vhosts["/"].queues.get(name)


def declare(client, name, channel=1, **arguments):
    reply = client.call(Q.Declare(queue=name, arguments=arguments), channel)
    assert isinstance(reply, Q.DeclareOk), reply


# -- x-message-ttl and expiration -----------------------------------------------------------------
def test_queue_ttl_expires_ready_messages_at_their_deadline_without_a_consumer(client, clock):
    declare(client, "q", **{"x-message-ttl": 150})
    client.publish("q", b"old")
    clock.advance(0.1)
    client.publish("q", b"new")  # its own 150 ms start now
    clock.advance(0.049)
    assert queue(client, "q").message_count == 2
    clock.advance(0.002)  # old's deadline (150 ms): the queue's timer drops it, no consumer needed
    assert queue(client, "q").message_count == 1
    clock.advance(0.098)
    assert queue(client, "q").message_count == 1
    clock.advance(0.002)
    assert queue(client, "q").message_count == 0


def test_a_message_is_gettable_until_its_ttl_is_up(client, clock):
    declare(client, "q", **{"x-message-ttl": 300})
    for i in range(5):
        client.publish("q", b"%d" % i)
    clock.advance(0.299)
    assert client.get("q").body == b"0"
    clock.advance(0.002)
    assert client.get("q") is None and queue(client, "q").message_count == 0


def test_per_message_expiration_and_it_is_delivered_intact(client, clock):
    declare(client, "q")
    client.publish("q", b"short", expiration="100")
    client.publish("q", b"long", expiration="60000")
    client.publish("q", b"none")
    clock.advance(0.101)
    d = client.get("q")
    assert d.body == b"long" and d.properties.expiration == "60000"
    assert client.get_all("q") == [b"none"]


@pytest.mark.parametrize("queue_ttl, expiration", [(100, "60000"), (60000, "100")])
def test_the_lower_of_queue_and_message_ttl_applies(client, clock, queue_ttl, expiration):
    declare(client, "q", **{"x-message-ttl": queue_ttl})
    client.publish("q", b"m", expiration=expiration)
    clock.advance(0.099)
    assert queue(client, "q").message_count == 1
    clock.advance(0.002)
    assert client.get_all("q") == []


def test_expiration_zero_is_dropped_at_once_without_a_waiting_consumer(client, clock):
    declare(client, "q")
    client.publish("q", b"now-or-never", expiration="0")
    client.take()  # not even one tick of the clock
    assert client.get_all("q") == []


def test_an_expired_message_behind_a_live_one_waits_for_the_head_and_is_never_delivered(client, clock):
    """RabbitMQ expires at the head only: an expired message further back is dropped when it
    reaches the head, never delivered."""
    declare(client, "q")
    client.publish("q", b"live", expiration="60000")
    client.publish("q", b"dead", expiration="50")
    client.publish("q", b"tail")
    clock.advance(0.2)
    assert queue(client, "q").message_count == 3  # not at the head yet
    assert client.get_all("q") == [b"live", b"tail"]


def test_a_consumer_never_receives_expired_messages(client, clock):
    declare(client, "q", **{"x-message-ttl": 200})
    client.call(B.Qos(prefetch_count=1))
    for i in range(5):
        client.publish("q", b"%d" % i)
    client.call(B.Consume(queue="q", consumer_tag="c"))
    assert [d.body for d in client.deliveries] == [b"0"]
    clock.advance(0.201)  # the other four expire while the first is held
    client.send(B.Ack(delivery_tag=client.deliveries[0].method.delivery_tag))
    client.take()
    assert [d.body for d in client.deliveries] == [b"0"]
    assert queue(client, "q").message_count == 0


def _dead_letters(client, dlq):
    out = []
    while (d := client.get(dlq)) is not None:
        out.append(d)
    return out


@pytest.mark.parametrize("requeue_by", ["nack", "channel_close"])
def test_ttl_passing_while_unacked_then_requeued_expires_it(client, clock, requeue_by):
    """RabbitMQ 3.10: a message whose TTL passed while it was unacked is expired (dead-lettered
    with reason 'expired') when requeued, not redelivered."""
    declare(client, "dlq")
    declare(client, "q", **{"x-message-ttl": 200, "x-dead-letter-exchange": "",
                            "x-dead-letter-routing-key": "dlq"})
    client.publish("q", b"held")
    held = client.get("q", no_ack=False, channel=2)
    clock.advance(0.3)
    assert queue(client, "dlq").message_count == 0  # unacked: not expired while held
    if requeue_by == "nack":
        client.send(B.Nack(delivery_tag=held.method.delivery_tag, requeue=True), channel=2)
    else:
        client.close_channel(2)
    client.take()
    assert queue(client, "q").message_count == 0
    [d] = _dead_letters(client, "dlq")
    assert d.body == b"held" and d.properties.headers["x-death"][0]["reason"] == "expired"


def test_per_message_ttl_passing_while_unacked_then_requeued_expires_it(client, clock):
    declare(client, "dlq")
    declare(client, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    client.publish("q", b"held", expiration="200")
    client.publish("q", b"kept")
    assert client.get("q", no_ack=False, channel=2) and client.get("q", no_ack=False, channel=2)
    clock.advance(0.3)
    client.close_channel(2)  # both requeued: the expired one is dead-lettered
    [d] = _dead_letters(client, "dlq")
    assert d.body == b"held" and d.properties.headers["x-death"][0]["original-expiration"] == "200"
    assert d.properties.expiration is None
    kept = client.get("q")
    assert kept.body == b"kept" and kept.method.redelivered


def test_a_requeued_message_within_its_ttl_is_redelivered_and_keeps_its_deadline(client, clock):
    declare(client, "q", **{"x-message-ttl": 5000})
    client.publish("q", b"x")
    clock.advance(4.0)
    d = client.get("q", no_ack=False)
    client.send(B.Nack(delivery_tag=d.method.delivery_tag, requeue=True))
    client.take()
    again = client.get("q", no_ack=False)
    assert again.body == b"x" and again.method.redelivered
    client.send(B.Nack(delivery_tag=again.method.delivery_tag, requeue=True))
    clock.advance(1.001)  # 5 s after the publish, not after the requeue
    assert queue(client, "q").message_count == 0


def test_x_death_time_is_the_clocks_wall_time(client, clock):
    declare(client, "dlq")
    declare(client, "q", **{"x-message-ttl": 1000, "x-dead-letter-exchange": "",
                            "x-dead-letter-routing-key": "dlq"})
    client.publish("q", b"m")
    clock.advance(1.5)
    [d] = _dead_letters(client, "dlq")
    when = d.properties.headers["x-death"][0]["time"]
    assert when.timestamp() == int(clock.wall_offset) + 1  # died at 1.0 s on the clock


# -- x-expires ------------------------------------------------------------------------------------
def test_x_expires_deletes_an_unused_queue_messages_do_not_count_as_use(client, clock):
    declare(client, "q", **{"x-expires": 300})
    clock.advance(0.2)
    client.publish("q", b"messages do not count as use")
    clock.advance(0.099)
    assert queue(client, "q") is not None
    clock.advance(0.002)
    assert queue(client, "q") is None


def test_x_expires_a_passive_declare_counts_as_use(client, clock):
    declare(client, "q", **{"x-expires": 400})
    for _ in range(5):
        clock.advance(0.3)
        assert client.exists("q")
    clock.advance(0.399)
    assert queue(client, "q") is not None
    clock.advance(0.002)
    assert not client.exists("q")


def test_x_expires_is_restarted_by_get_and_redeclare_and_held_off_by_a_consumer(client, clock):
    declare(client, "q", **{"x-expires": 500})
    for _ in range(4):  # 4 x 0.4 s > 0.5 s, but every get restarts the countdown
        clock.advance(0.4)
        assert client.get("q") is None
    clock.advance(0.4)
    declare(client, "q", **{"x-expires": 500})  # redeclaring is use too
    clock.advance(0.4)
    assert queue(client, "q") is not None
    client.call(B.Consume(queue="q", consumer_tag="c"))
    clock.advance(60)  # a consumer keeps it alive indefinitely
    assert queue(client, "q") is not None
    client.call(B.Cancel(consumer_tag="c"))  # its departure restarts the countdown
    clock.advance(0.499)
    assert queue(client, "q") is not None
    clock.advance(0.002)
    assert queue(client, "q") is None


def test_one_queues_ttl_does_not_reach_the_copies_routed_to_other_queues(client, clock):
    # the copy for a later queue was made after the first queue had stamped its TTL on the message:
    # a queue without TTL then dropped it (found by the Java client's DeadLetterExchange.deadLetterTwice)
    client.call(E.Declare(exchange="fan", exchange_type="fanout"), 1)
    declare(client, "short", **{"x-message-ttl": 1})
    declare(client, "keep")
    for name in ("short", "keep"):
        client.call(Q.Bind(queue=name, exchange="fan"), 1)
    client.publish("", b"m", exchange="fan")
    clock.advance(10)
    assert queue(client, "short").message_count == 0
    assert queue(client, "keep").message_count == 1 and client.get("keep").body == b"m"
