"""Message TTL (x-message-ttl, per-message expiration) and queue expiry (x-expires) as clients
see them over a real socket: the timers on the real event loop, the error texts. Behaviour and
error texts checked by hand against RabbitMQ 3.10. The rules themselves (deadlines to the
millisecond, expiry at the head, requeue after the TTL passed, what counts as use for x-expires)
are tested sans-IO on a ManualClock in tests/queue_types/test_classic_ttl.py."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq, wait_until
from ext_helpers import count, get_all


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
    ch.confirm_delivery()
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"none")
    assert wait_until(lambda: count(ch, q) == 2, timeout=5)  # the queue's timer, no get needed
    got = get_all(ch, q)
    assert [b for _m, _p, b in got] == [b"long", b"none"]
    assert got[0][1].expiration == "60000"  # delivered with its expiration property intact


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


def test_ttl_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("ttl"), arguments={"x-message-ttl": 100})
            await ch.default_exchange.publish(aio_pika.Message(b"gone"), routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"also gone", expiration=0.05),
                                              routing_key=q.name)
            for _ in range(250):  # both expire by the queue's timer (100 ms, 50 ms)
                if (await q.declare()).message_count == 0:
                    break
                await asyncio.sleep(0.02)
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
