"""Priority queues (x-max-priority + the priority property) and consumer priorities (x-priority).
Checked against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq, wait_until
from ext_helpers import count, get_all


def publish(ch, q, body, priority=None):
    ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))


def test_higher_priority_first_fifo_within_a_priority(ch):
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    for body, prio in [(b"l1", 1), (b"h1", 9), (b"n1", None), (b"l2", 1), (b"h2", 9), (b"m1", 5),
                       (b"n2", 0)]:
        publish(ch, q, body, prio)
    assert [b for _m, _p, b in get_all(ch, q)] == [b"h1", b"h2", b"m1", b"l1", b"l2", b"n1", b"n2"]


def test_priority_above_the_maximum_counts_as_the_maximum(ch):
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 3})
    publish(ch, q, b"three", 3)
    publish(ch, q, b"two-hundred", 200)
    publish(ch, q, b"two", 2)
    got = get_all(ch, q)
    assert [b for _m, _p, b in got] == [b"three", b"two-hundred", b"two"]
    assert got[1][1].priority == 200  # the property is delivered unchanged


def test_without_x_max_priority_the_property_is_ignored(ch):
    q = uniq("prio")
    ch.queue_declare(q)
    publish(ch, q, b"a", 1)
    publish(ch, q, b"b", 9)
    assert [b for _m, _p, b in get_all(ch, q)] == [b"a", b"b"]


def test_requeue_keeps_the_position_within_the_priority(ch):
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    for body, prio in [(b"h1", 5), (b"h2", 5), (b"h3", 5), (b"l1", 1), (b"l2", 1)]:
        publish(ch, q, body, prio)
    tags = {}
    for _ in range(4):
        m, _p, body = ch.basic_get(q)
        tags[body] = m.delivery_tag
    assert list(tags) == [b"h1", b"h2", b"h3", b"l1"]
    ch.basic_nack(tags[b"h2"], requeue=True)
    ch.basic_nack(tags[b"l1"], requeue=True)
    publish(ch, q, b"h4", 5)
    got = get_all(ch, q)
    assert [b for _m, _p, b in got] == [b"h2", b"h4", b"l1", b"l2"]
    assert [m.redelivered for m, _p, _b in got] == [True, False, True, False]
    ch.basic_ack(tags[b"h1"])
    ch.basic_ack(tags[b"h3"])


def test_channel_close_requeues_into_priority_order(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 2})
    for body, prio in [(b"a", 2), (b"b", 1), (b"c", 0)]:
        publish(ch, q, body, prio)
    ch2 = conn.channel()
    for _ in range(3):
        ch2.basic_get(q)
    publish(ch, q, b"d", 1)
    ch2.close()
    assert wait_until(lambda: count(ch, q) == 4)
    assert [b for _m, _p, b in get_all(ch, q)] == [b"a", b"b", b"d", b"c"]


def test_priority_order_with_a_consumer(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    for i in range(10):
        publish(ch, q, b"%d" % i, i)
    ch.basic_qos(prefetch_count=1)
    got = []
    for m, _p, body in ch.consume(q, inactivity_timeout=0.5):
        if m is None:
            break
        got.append(int(body))
        ch.basic_ack(m.delivery_tag)
    ch.cancel()
    assert got == list(range(9, -1, -1))


@pytest.mark.parametrize("value, text", [(256, "{max_value_exceeded,256}"), (-1, "{value_negative,-1}"),
                                         ("5", '"expected integer, got longstr"')])
def test_invalid_max_priority_is_406(ch, value, text):
    q = uniq("prio")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, arguments={"x-max-priority": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue "
                                    f"'{q}' in vhost '/': {text}")


@pytest.mark.parametrize("value", [1, 255])
def test_max_priority_bounds_are_accepted(ch, value):
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": value})
    publish(ch, q, b"lo", 0)
    publish(ch, q, b"hi", 255)
    assert [b for _m, _p, b in get_all(ch, q)] == [b"hi", b"lo"]


def test_max_priority_must_be_equivalent_on_redeclare(ch):
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, arguments={"x-max-priority": 6})
    assert exc.value.reply_code == 406


# -- consumer priorities ---------------------------------------------------------------------------

def _consumer(conn, q, prio, prefetch, got, name, ack=False):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    args = {"x-priority": prio} if prio is not None else None

    def on_msg(c, m, _p, body):
        got.append((name, body))
        if ack:
            c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on_msg, arguments=args)
    return ch


def test_higher_priority_consumer_gets_messages_while_it_has_capacity(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("cprio")
    ch.queue_declare(q)
    got = []
    _consumer(conn, q, None, 0, got, "low", ack=True)
    _consumer(conn, q, 10, 0, got, "high", ack=True)
    _consumer(conn, q, 5, 0, got, "mid", ack=True)
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i)
    deadline = time.monotonic() + 5
    while len(got) < 20 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert {name for name, _b in got} == {"high"}


def test_blocked_high_priority_consumer_lets_lower_ones_take_over(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("cprio")
    ch.queue_declare(q)
    got = []
    _consumer(conn, q, 1, 0, got, "low")
    _consumer(conn, q, 10, 2, got, "high")  # never acks: full after two
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    # (pika may run the two channels' callbacks interleaved: compare per consumer)
    assert [b for n, b in got if n == "high"] == [b"0", b"1"]
    assert [b for n, b in got if n == "low"] == [b"2", b"3", b"4", b"5"]


def test_equal_priority_consumers_round_robin(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("cprio")
    ch.queue_declare(q)
    got = []
    _consumer(conn, q, 3, 0, got, "a", ack=True)
    _consumer(conn, q, 3, 0, got, "b", ack=True)
    _consumer(conn, q, 0, 0, got, "never", ack=True)
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    names = [n for n, _b in got]
    assert names.count("a") == 3 and names.count("b") == 3


def test_invalid_consumer_priority_is_406(connect):
    ch = connect().channel()
    q = uniq("cprio")
    ch.queue_declare(q)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' "
                                    f"in vhost '/': \"expected integer, got longstr\"")


def test_priorities_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("prio"), arguments={"x-max-priority": 3})
            for body, prio in [(b"low", 0), (b"high", 3), (b"mid", 2)]:
                await ch.default_exchange.publish(aio_pika.Message(body, priority=prio), routing_key=q.name)
            out = []
            while (msg := await q.get(fail=False)) is not None:
                out.append(msg.body)
                await msg.ack()
            assert out == [b"high", b"mid", b"low"]
            # consumer priorities through aio-pika's consume arguments
            q2 = await ch.declare_queue(uniq("cprio"))
            seen = []
            lo_ch, hi_ch = await conn.channel(), await conn.channel()
            lo_q = await lo_ch.get_queue(q2.name)
            hi_q = await hi_ch.get_queue(q2.name)

            async def on_lo(msg):
                seen.append("lo")
                await msg.ack()

            async def on_hi(msg):
                seen.append("hi")
                await msg.ack()

            await lo_q.consume(on_lo, arguments={"x-priority": 1})
            await hi_q.consume(on_hi, arguments={"x-priority": 5})
            for i in range(5):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q2.name)
            for _ in range(100):
                if len(seen) == 5:
                    break
                await asyncio.sleep(0.02)
            assert seen == ["hi"] * 5
    asyncio.run(main())
