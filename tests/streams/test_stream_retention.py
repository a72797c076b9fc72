"""Item 4: retention by x-max-length-bytes and x-max-age, in whole segments
(x-stream-max-segment-size-bytes); consumers asking for a truncated offset start at the first kept.
x-max-age is tested sans-IO on a ManualClock in tests/queue_types/test_stream_retention_clock.py."""

from __future__ import annotations

import asyncio
import time

import aio_pika

from eb_support import uniq
from exchange_broker.queue_types.stream import find_stream
from stream_helpers import STREAM, declare_stream, publish, read

BODY = b"x" * 98          # + 2 bytes of empty properties = 100 bytes a message


def _info(broker, name):
    return broker.call(lambda: find_stream(broker.broker, "/", name).info())


def test_max_length_bytes_truncates_whole_segments(conn, broker):
    ch = conn.channel()
    name = uniq()
    # segments of 5 messages (a segment is closed once it holds >= 500 bytes), at most 2000 bytes
    declare_stream(ch, name, **{"x-max-length-bytes": 2000, "x-stream-max-segment-size-bytes": 500})
    ch.confirm_delivery()
    publish(ch, name, [BODY] * 100)
    info = _info(broker, name)
    first = info["first_offset"]
    assert first > 0 and first % 5 == 0              # dropped at a segment boundary
    assert info["next_offset"] == 100
    # the limit holds, give or take the active segment (retention runs when a segment fills up)
    assert info["bytes"] <= 2000 + 500
    assert 100 - first == ch.queue_declare(name, passive=True).method.message_count
    # RabbitMQ keeps every complete segment that fits: 3 complete ones + the active one here
    assert first == 100 - (3 * 5 + 5)
    # asking for offset 0 (or "first") starts at the first offset kept
    for start in (0, "first", first - 1):
        got = read(conn, name, 100 - first, offset=start, prefetch=200)
        assert [o for _, o, _ in got] == list(range(first, 100))
    # a consumer in the kept range is unaffected
    assert [o for _, o, _ in read(conn, name, 3, offset=97)] == [97, 98, 99]


def test_retention_while_a_consumer_is_behind(conn, broker):
    ch = conn.channel()
    name = uniq()
    declare_stream(ch, name, **{"x-max-length-bytes": 1000, "x-stream-max-segment-size-bytes": 300})
    ch.confirm_delivery()
    publish(ch, name, [BODY] * 5)
    reader = conn.channel()
    reader.basic_qos(prefetch_count=2)
    seen = []
    reader.basic_consume(name, lambda c, m, p, b: seen.append((m.delivery_tag,
                                                               p.headers["x-stream-offset"])),
                         arguments={"x-stream-offset": "first"})
    conn.process_data_events(0.3)
    assert [o for _, o in seen] == [0, 1]            # stuck on its prefetch, not acking
    publish(ch, name, [BODY] * 60)                   # meanwhile the head is truncated
    first = _info(broker, name)["first_offset"]
    assert first > 2
    reader.basic_ack(seen[-1][0], multiple=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (not seen or seen[-1][1] != 64):
        conn.process_data_events(0.05)
        if seen and len(seen) % 2 == 0:
            reader.basic_ack(seen[-1][0], multiple=True)
    offsets = [o for _, o in seen]
    assert offsets[:2] == [0, 1]
    assert offsets[2:] == list(range(first, 65))     # skipped straight to the first kept


def test_retention_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            name = uniq()
            await ch.declare_queue(name, durable=True, arguments={
                **STREAM, "x-max-length-bytes": 1500, "x-stream-max-segment-size-bytes": 400})
            for i in range(50):
                await ch.default_exchange.publish(aio_pika.Message(b"y" * 100), routing_key=name)
            info = _info(broker, name)
            first = info["first_offset"]
            assert 0 < first < 50 and info["bytes"] <= 1500 + 400
            await ch.set_qos(prefetch_count=100)
            q = await ch.get_queue(name, ensure=False)
            offsets = []
            async with q.iterator(arguments={"x-stream-offset": 0}) as it:
                async for message in it:
                    offsets.append(message.headers["x-stream-offset"])
                    await message.ack()
                    if offsets[-1] == 49:
                        break
            assert offsets == list(range(first, 50))
    asyncio.run(main())
