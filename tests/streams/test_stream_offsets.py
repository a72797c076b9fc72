"""Item 5: named consumers store their offset on the broker and resume after it.

AMQP: the consume argument ``x-stream-consumer-name`` (the broker records the offset of the
acked prefix of that consumer's deliveries; a consume with the name and no x-stream-offset
resumes at stored + 1). Admin: ``Broker.stream_offset`` / ``set_stream_offset`` /
``stream_offsets`` / ``stream_info``."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest

from exchange_broker.queue_types.stream import find_stream

from eb_support import uniq
from stream_helpers import STREAM, declare_stream, publish, read


@pytest.fixture
def stream(conn):
    ch = conn.channel()
    name = uniq()
    declare_stream(ch, name)
    ch.confirm_delivery()
    publish(ch, name, [b"m%d" % i for i in range(10)])
    return name


def _offset(broker, queue, name):
    return broker.call(lambda: find_stream(broker.broker, "/", queue).query_offset(name))


def _wait_offset(broker, queue, name, want, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _offset(broker, queue, name) != want:
        time.sleep(0.02)
    return _offset(broker, queue, name)


def test_named_consumer_resumes_after_its_last_ack(conn, broker, stream):
    assert _offset(broker, stream, "reader-1") is None
    got = read(conn, stream, 4, offset="first", name="reader-1")
    assert [o for _, o, _ in got] == [0, 1, 2, 3]
    assert _wait_offset(broker, stream, "reader-1", 3) == 3
    # no x-stream-offset: resume after the stored offset (a new channel, as a restarted reader)
    got = read(conn, stream, 3, name="reader-1")
    assert [o for _, o, _ in got] == [4, 5, 6]
    assert _wait_offset(broker, stream, "reader-1", 6) == 6
    # another name is independent; with nothing stored the default ("next") applies
    assert read(conn, stream, None, name="reader-2", idle=0.3) == []
    assert _offset(broker, stream, "reader-2") is None
    # an explicit x-stream-offset wins over the stored one (acks are still recorded)
    got = read(conn, stream, 2, offset=1, name="reader-1")
    assert [o for _, o, _ in got] == [1, 2]
    assert _wait_offset(broker, stream, "reader-1", 2) == 2


def test_only_the_acked_prefix_is_stored(conn, broker, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    tags = []
    ch.basic_consume(stream, lambda c, m, p, b: tags.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first", "x-stream-consumer-name": "r"})
    conn.process_data_events(0.3)
    assert tags == [1, 2, 3, 4, 5]                   # offsets 0..4
    ch.basic_ack(3)                                  # out of order: 0 and 1 still unacked
    conn.process_data_events(0.1)
    assert _offset(broker, stream, "r") is None
    ch.basic_ack(2, multiple=True)                   # now 0, 1, 2 are all acked
    assert _wait_offset(broker, stream, "r", 2) == 2
    conn.process_data_events(0.3)                    # credit freed: offsets 5..7 arrive
    assert tags == [1, 2, 3, 4, 5, 6, 7, 8]
    ch.close()                                       # 3..7 go back unprocessed
    time.sleep(0.1)
    assert _offset(broker, stream, "r") == 2
    assert [o for _, o, _ in read(conn, stream, 2, name="r")] == [3, 4]


def test_acks_after_cancel_still_count(conn, broker, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    tags = []
    tag = ch.basic_consume(stream, lambda c, m, p, b: tags.append(m.delivery_tag),
                           arguments={"x-stream-offset": "first", "x-stream-consumer-name": "late"})
    conn.process_data_events(0.3)
    ch.basic_cancel(tag)
    ch.basic_ack(3, multiple=True)
    assert _wait_offset(broker, stream, "late", 2) == 2


def test_admin_methods(conn, broker, stream):
    b = broker.broker
    broker.call(lambda: find_stream(b, "/", stream).set_offset("admin-set", 6))
    assert _offset(broker, stream, "admin-set") == 6
    assert [o for _, o, _ in read(conn, stream, 3, name="admin-set")] == [7, 8, 9]
    offsets = broker.call(lambda: dict(find_stream(b, "/", stream).offsets))
    assert offsets == {"admin-set": 9}
    info = broker.call(lambda: find_stream(b, "/", stream).info())
    assert (info["first_offset"], info["next_offset"], info["messages"]) == (0, 10, 10)
    assert info["offsets"] == {"admin-set": 9}
    with pytest.raises(KeyError):
        broker.call(lambda: find_stream(b, "/", "no-such-queue").query_offset("x"))
    classic = conn.channel().queue_declare("", exclusive=True).method.queue
    with pytest.raises(ValueError):
        broker.call(lambda: find_stream(b, "/", classic).query_offset("x"))


def test_named_consumer_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            name = uniq()
            await ch.declare_queue(name, durable=True, arguments=STREAM)
            for i in range(8):
                await ch.default_exchange.publish(aio_pika.Message(b"n%d" % i), routing_key=name)

        async def reader(n, **args):
            async with await aio_pika.connect(broker.url) as conn:
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=2)
                q = await ch.get_queue(name, ensure=False)
                seen = []
                async with q.iterator(arguments={"x-stream-consumer-name": "aio", **args}) as it:
                    async for message in it:
                        seen.append(message.headers["x-stream-offset"])
                        await message.ack()
                        if len(seen) == n:
                            break
                return seen

        assert await reader(5, **{"x-stream-offset": "first"}) == [0, 1, 2, 3, 4]
        await asyncio.sleep(0.1)
        assert _offset(broker, name, "aio") == 4
        assert await reader(3) == [5, 6, 7]           # a restarted reader resumes
    asyncio.run(main())
