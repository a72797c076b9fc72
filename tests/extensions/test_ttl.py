"""Message TTL (x-message-ttl, per-message expiration) and queue expiry (x-expires).
Behaviour and error texts checked by hand against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq.exceptions
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq, wait_until
from ext_helpers import count, get_all


def test_queue_ttl_expires_ready_messages(ch):
    q = uniq("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 150})
    ch.basic_publish("", q, b"old")
    time.sleep(0.4)
    ch.basic_publish("", q, b"new")
    assert [b for _m, _p, b in get_all(ch, q)] == [b"new"]
    assert wait_until(lambda: count(ch, q) == 0)


def test_queue_ttl_expired_messages_are_removed_without_a_consumer(ch):
    q = uniq("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 300})
    ch.confirm_delivery()  # (RabbitMQ enqueues asynchronously: count only confirmed messages)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    assert count(ch, q) == 5
    assert wait_until(lambda: count(ch, q) == 0, timeout=3)  # a timer removes them


def test_per_message_expiration(ch):
    q = uniq("ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"none")
    time.sleep(0.3)
    got = get_all(ch, q)
    assert [b for _m, _p, b in got] == [b"long", b"none"]
    assert got[0][1].expiration == "60000"  # delivered with its expiration property intact


def test_lower_of_queue_and_message_ttl_applies(ch):
    q = uniq("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"msg-longer", pika.BasicProperties(expiration="60000"))  # queue TTL wins
    q2 = uniq("ttl")
    ch.queue_declare(q2, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", q2, b"msg-shorter", pika.BasicProperties(expiration="100"))  # message wins
    time.sleep(0.3)
    assert get_all(ch, q) == [] and get_all(ch, q2) == []


def test_expiration_zero_is_dropped_without_a_waiting_consumer(ch):
    q = uniq("ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"now-or-never", pika.BasicProperties(expiration="0"))
    time.sleep(0.05)
    assert get_all(ch, q) == []


def test_expired_message_behind_a_live_one_is_never_delivered(ch):
    """RabbitMQ expires at the head only; an expired message further back is dropped when it
    reaches the head, never delivered."""
    q = uniq("ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"live", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"dead", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"tail")
    time.sleep(0.2)
    assert [b for _m, _p, b in get_all(ch, q)] == [b"live", b"tail"]


def test_consumer_never_receives_expired_messages(connect):
    conn = connect()
    ch = conn.channel()
    q = uniq("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 200})
    ch.basic_qos(prefetch_count=1)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    got = []
    for m, _p, body in ch.consume(q, inactivity_timeout=0.5):
        if m is None:
            break
        got.append(body)
        if body == b"0":
            time.sleep(0.4)  # hold the first; the other four expire meanwhile
        ch.basic_ack(m.delivery_tag)
    ch.cancel()
    assert got == [b"0"]
    assert count(ch, q) == 0


@pytest.mark.parametrize("requeue_by", ["nack", "channel_close"])
def test_ttl_passing_while_unacked_then_requeued_expires_it(connect, requeue_by):
    """RabbitMQ 3.10: a message whose TTL passed while it was unacked is expired (dead-lettered
    with reason 'expired') when requeued, not redelivered."""
    conn = connect()
    ch = conn.channel()
    q, dlq = uniq("ttl"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"held")
    ch2 = conn.channel()
    m, _p, _b = ch2.basic_get(q)
    assert m is not None
    time.sleep(0.4)
    if requeue_by == "nack":
        ch2.basic_nack(m.delivery_tag, requeue=True)
    else:
        ch2.close()
    assert wait_until(lambda: count(ch, dlq) == 1)
    assert count(ch, q) == 0
    [(m, props, body)] = get_all(ch, dlq)
    assert body == b"held"
    assert props.headers["x-death"][0]["reason"] == "expired"


def test_per_message_ttl_passing_while_unacked_then_requeued_expires_it(connect):
    conn = connect()
    ch = conn.channel()
    q, dlq = uniq("ttl"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"held", pika.BasicProperties(expiration="200"))
    ch.basic_publish("", q, b"kept")
    ch2 = conn.channel()
    held = [ch2.basic_get(q)[0] for _ in range(2)]
    time.sleep(0.4)
    ch2.close()  # both requeued: the expired one is dead-lettered, the other is ready again
    assert wait_until(lambda: count(ch, dlq) == 1)
    [(_m, p, body)] = get_all(ch, dlq)
    assert body == b"held" and p.headers["x-death"][0]["original-expiration"] == "200"
    [(m, _p, body)] = get_all(ch, q)
    assert body == b"kept" and m.redelivered
    assert len(held) == 2


def test_requeued_message_within_its_ttl_is_redelivered(ch):
    q = uniq("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 5000})
    ch.basic_publish("", q, b"x")
    m, _p, _b = ch.basic_get(q)
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"x" and m.redelivered


@pytest.mark.parametrize("value, text", [
    ("abc", "invalid expiration 'abc': no_integer"),
    ("-1", "invalid expiration '-1': {value_negative,-1}"),
])
def test_invalid_expiration_is_406(connect, value, text):
    conn = connect()
    ch = conn.channel()
    q = uniq("ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=value))
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, passive=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == f"PRECONDITION_FAILED - {text}"
    assert count(conn.channel(), q) == 0


@pytest.mark.parametrize("args, text", [
    ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ({"x-message-ttl": "10"}, '"expected integer, got longstr"'),
    ({"x-expires": 0}, "{value_zero,0}"),
])
def test_invalid_ttl_arguments_are_406(connect, args, text):
    ch = connect().channel()
    q = uniq("ttl")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, arguments=args)
    [name] = args
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f"PRECONDITION_FAILED - invalid arg '{name}' for queue '{q}' "
                                    f"in vhost '/': {text}")


def _exists(connect, q: str) -> bool:
    ch = connect().channel()
    try:
        ch.queue_declare(q, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    ch.close()
    return True


def test_x_expires_deletes_an_unused_queue(connect):
    ch = connect().channel()
    q = uniq("exp")
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"messages do not count as use")
    assert _exists(connect, q)
    # a passive declare counts as use too (RabbitMQ 3.10): poll less often than x-expires
    assert wait_until(lambda: not _exists(connect, q), timeout=3, interval=0.5)


def test_x_expires_passive_declare_counts_as_use(connect):
    ch = connect().channel()
    q = uniq("exp")
    ch.queue_declare(q, arguments={"x-expires": 400})
    for _ in range(5):
        time.sleep(0.2)
        assert _exists(connect, q)
    time.sleep(0.7)
    assert not _exists(connect, q)


def test_x_expires_is_reset_by_use(connect):
    ch = connect().channel()
    q = uniq("exp")
    ch.queue_declare(q, arguments={"x-expires": 500})
    for _ in range(4):  # 4 x 0.3 s > 0.5 s, but every get restarts the countdown
        time.sleep(0.3)
        ch.basic_get(q)
    assert _exists(connect, q)
    # redeclaring also counts as use
    time.sleep(0.3)
    ch.queue_declare(q, arguments={"x-expires": 500})
    time.sleep(0.3)
    assert _exists(connect, q)
    # a consumer keeps it alive indefinitely; its departure restarts the countdown
    tag = ch.basic_consume(q, lambda *a: None)
    time.sleep(0.8)
    assert _exists(connect, q)
    ch.basic_cancel(tag)
    assert wait_until(lambda: not _exists(connect, q), timeout=3, interval=0.7)


def test_ttl_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("ttl"), arguments={"x-message-ttl": 100})
            await ch.default_exchange.publish(aio_pika.Message(b"gone"), routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"also gone", expiration=0.05),
                                              routing_key=q.name)
            await asyncio.sleep(0.3)
            assert await q.get(fail=False) is None
            q2 = await ch.declare_queue(uniq("ttl"))
            await ch.default_exchange.publish(aio_pika.Message(b"kept", expiration=30),
                                              routing_key=q2.name)
            msg = await q2.get()
            assert msg.body == b"kept" and msg.expiration == 30.0
            await msg.ack()
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
                await ch.declare_queue(uniq("ttl"), arguments={"x-max-priority": 256})
    asyncio.run(main())
