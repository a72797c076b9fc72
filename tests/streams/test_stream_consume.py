"""Items 2 and 3: appending with offsets, x-stream-offset on every delivery, and basic.consume
with x-stream-offset, prefetch and acks (replies and texts as RabbitMQ 3.10 gives them)."""

from __future__ import annotations

import asyncio
import datetime
import math
import time

import aio_pika
import aiormq.exceptions as amqe
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from eb_support import uniq
from stream_helpers import STREAM, connect, declare_stream, publish, read


@pytest.fixture
def stream(conn):
    """A stream with five confirmed messages m0..m4."""
    ch = conn.channel()
    name = uniq()
    declare_stream(ch, name)
    ch.confirm_delivery()
    publish(ch, name, [b"m%d" % i for i in range(5)])
    return name


def test_offsets_rise_and_header_on_every_delivery(conn, broker):
    ch = conn.channel()
    name = uniq()
    declare_stream(ch, name)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"plain")
    ch.basic_publish("", name, b"headers", pika.BasicProperties(headers={"k": "v", "n": 7},
                                                                content_type="text/plain"))
    ch.basic_publish("", name, b"persistent", pika.BasicProperties(delivery_mode=2,
                                                                   correlation_id="c1"))
    got = read(conn, name, 3, offset="first")
    assert [(b, o) for b, o, _ in got] == [(b"plain", 0), (b"headers", 1), (b"persistent", 2)]
    assert all(isinstance(o, int) for _, o, _ in got)  # pika: its long type (AMQP "l")
    assert got[1][2] == {"k": "v", "n": 7, "x-stream-offset": 1}  # the publisher's headers kept
    # on the wire the offset is a 'l' (signed 64-bit) field, as RabbitMQ sends it
    raw = broker.call(lambda: broker.broker.vhosts["/"].queues[name].tail[0].properties)
    assert b"\x0fx-stream-offsetl" + (0).to_bytes(8, "big") in raw


def test_consuming_removes_nothing(conn, stream):
    assert len(read(conn, stream, 5, offset="first")) == 5
    ch = conn.channel()
    assert ch.queue_declare(stream, passive=True).method.message_count == 5
    again = read(conn, stream, 5, offset="first")
    assert [b for b, _, _ in again] == [b"m%d" % i for i in range(5)]


@pytest.mark.parametrize("offset, expected", [
    ("first", [0, 1, 2, 3, 4]),
    ("last", [4]),
    ("next", []),
    (None, []),          # the default is next
    (0, [0, 1, 2, 3, 4]),
    (3, [3, 4]),
    (-1, [0, 1, 2, 3, 4]),
    (100, []),
    ("1h", [0, 1, 2, 3, 4]),
])
def test_start_offsets(conn, stream, offset, expected):
    got = read(conn, stream, len(expected) or None, offset=offset, idle=0.3)
    assert [o for _, o, _ in got] == expected


def test_next_and_far_offset_get_new_messages(conn, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: dict[str, list] = {"next": [], "far": []}
    for key, off in (("next", "next"), ("far", 1000)):
        ch.basic_consume(stream, lambda c, m, p, b, key=key: (got[key].append(
            p.headers["x-stream-offset"]), c.basic_ack(m.delivery_tag)),
            arguments={"x-stream-offset": off})
    pub = conn.channel()
    pub.confirm_delivery()
    publish(pub, stream, [b"new"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (got["next"] and got["far"]):
        conn.process_data_events(0.05)
    assert got == {"next": [5], "far": [5]}


def test_timestamp_offset(conn):
    ch = conn.channel()
    name = uniq()
    declare_stream(ch, name)
    ch.confirm_delivery()
    publish(ch, name, [b"old1", b"old2"])
    # AMQP timestamps are whole seconds: wait for the next second, then publish the rest
    boundary = math.floor(time.time()) + 1
    time.sleep(boundary - time.time() + 0.05)
    publish(ch, name, [b"new1", b"new2"])
    ts = datetime.datetime.fromtimestamp(boundary, tz=datetime.timezone.utc)
    got = read(conn, name, 2, offset=ts)
    assert [(b, o) for b, o, _ in got] == [(b"new1", 2), (b"new2", 3)]
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    assert [o for _, o, _ in read(conn, name, 4, offset=past)] == [0, 1, 2, 3]
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    assert read(conn, name, None, offset=future, idle=0.3) == []


def test_several_consumers_read_independently(conn, stream):
    a, b = conn.channel(), conn.channel()
    got: dict[str, list] = {"a1": [], "a2": [], "b": []}
    a.basic_qos(prefetch_count=2)
    b.basic_qos(prefetch_count=2)

    def cb(key):
        def on(ch, m, p, body):
            got[key].append(p.headers["x-stream-offset"])
            ch.basic_ack(m.delivery_tag)
        return on
    a.basic_consume(stream, cb("a1"), arguments={"x-stream-offset": "first"})
    a.basic_consume(stream, cb("a2"), arguments={"x-stream-offset": 3})
    b.basic_consume(stream, cb("b"), arguments={"x-stream-offset": 1})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (len(got["a1"]), len(got["a2"]), len(got["b"])) != (5, 2, 4):
        conn.process_data_events(0.05)
    assert got == {"a1": [0, 1, 2, 3, 4], "a2": [3, 4], "b": [1, 2, 3, 4]}


def test_prefetch_is_the_credit_and_acks_refill_it(conn, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(stream, lambda c, m, p, b: got.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})
    conn.process_data_events(0.5)
    assert got == [1, 2]                        # no acks: prefetch stops delivery
    ch.basic_ack(2, multiple=True)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(got) < 4:
        conn.process_data_events(0.05)
    conn.process_data_events(0.2)
    assert got == [1, 2, 3, 4]
    ch.basic_ack(3)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(got) < 5:
        conn.process_data_events(0.05)
    assert got == [1, 2, 3, 4, 5]


def _consume_error(conn, queue, qos=None, **kw):
    ch = conn.channel()
    if qos is not None:
        ch.basic_qos(**qos)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume(queue, lambda *a: None, **kw)
    return exc.value.reply_code, exc.value.reply_text


def test_consume_without_prefetch_is_refused(conn, stream):
    text = (f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{stream}' in "
            f"vhost '/''")
    assert _consume_error(conn, stream) == (406, text)
    # a global (channel) limit is not a consumer prefetch either
    assert _consume_error(conn, stream, {"prefetch_count": 10, "global_qos": True}) == (406, text)
    # no_ack without a prefetch: the prefetch check comes first
    assert _consume_error(conn, stream, auto_ack=True) == (406, text)


@pytest.mark.parametrize("value, term", [
    ("3", '{longstr,<<"3">>}'),
    ("bogus", '{longstr,<<"bogus">>}'),
    (True, "{bool,true}"),
])
def test_invalid_offset_argument(conn, stream, value, term):
    code, text = _consume_error(conn, stream, {"prefetch_count": 5},
                                arguments={"x-stream-offset": value})
    assert code == 406
    assert text == (f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{stream}' in "
                    f"vhost '/': {{invalid_stream_offset_arg,{term}}}")


def test_consumer_priority_refused(conn, stream):
    code, text = _consume_error(conn, stream, {"prefetch_count": 5}, arguments={"x-priority": 0})
    assert (code, text) == (406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue "
                                 f"'{stream}' in vhost '/' of queue type rabbit_stream_queue")


def _connection_error(broker, fn) -> tuple[int, str]:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    with pytest.raises(ConnectionClosedByBroker) as exc:
        fn(conn, ch)
        for _ in range(20):
            conn.process_data_events(0.05)
    return exc.value.reply_code, exc.value.reply_text


def test_no_ack_get_purge_nack_reject_are_540(broker, stream):
    tail = f"not supported by stream queues queue '{stream}' in vhost '/'"
    assert _connection_error(broker, lambda c, ch: ch.basic_consume(
        stream, lambda *a: None, auto_ack=True)) == (
        540, f"NOT_IMPLEMENTED - automatic acknowledgement {tail}")
    assert _connection_error(broker, lambda c, ch: ch.basic_get(stream)) == (
        540, f"NOT_IMPLEMENTED - basic.get {tail}")
    assert _connection_error(broker, lambda c, ch: ch.queue_purge(stream)) == (
        540, f"NOT_IMPLEMENTED - queue.purge {tail}")
    for settle in (lambda ch, tag: ch.basic_nack(tag, requeue=True),
                   lambda ch, tag: ch.basic_nack(tag, requeue=False),
                   lambda ch, tag: ch.basic_reject(tag, requeue=False)):
        def run(c, ch, settle=settle):
            ch.basic_consume(stream, lambda chan, m, p, b: settle(chan, m.delivery_tag),
                             arguments={"x-stream-offset": "first"})
        assert _connection_error(broker, run) == (
            540, f"NOT_IMPLEMENTED - basic.nack and basic.reject {tail}")


def test_recover_redelivers_from_the_first_unacked(conn, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(stream, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]),
                     arguments={"x-stream-offset": "first"})
    conn.process_data_events(0.3)
    assert got == [0, 1, 2, 3, 4]
    ch.basic_ack(2, multiple=True)           # offsets 0 and 1 processed
    conn.process_data_events(0.1)
    ch.basic_recover(requeue=True)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(got) < 8:
        conn.process_data_events(0.05)
    assert got == [0, 1, 2, 3, 4, 2, 3, 4]


def test_publishing_through_an_exchange_and_confirms(conn):
    ch = conn.channel()
    name, ex = uniq(), uniq("fan")
    declare_stream(ch, name)
    ch.exchange_declare(ex, "fanout")
    ch.queue_bind(name, ex)
    classic = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(classic, ex)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish(ex, "rk", b"f%d" % i, mandatory=True)   # confirmed, routed
    got = read(conn, name, 3, offset="first")
    assert [(b, o) for b, o, _ in got] == [(b"f0", 0), (b"f1", 1), (b"f2", 2)]
    assert ch.queue_declare(classic, passive=True).method.message_count == 3


def test_cancel_and_resubscribe(conn, stream):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    got = []
    tag = ch.basic_consume(stream, lambda c, m, p, b: (got.append(p.headers["x-stream-offset"]),
                                                       c.basic_ack(m.delivery_tag)),
                           arguments={"x-stream-offset": 2})
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:  # wait for all three, however slow the host
        conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    assert got == [2, 3, 4]
    assert read(conn, stream, 2, offset=3) and got == [2, 3, 4]


# -- aio-pika ------------------------------------------------------------------------------------
def test_stream_publish_and_consume_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()                      # publisher confirms on
            name = uniq()
            await ch.declare_queue(name, durable=True, arguments=STREAM)
            for i in range(6):
                await ch.default_exchange.publish(aio_pika.Message(b"a%d" % i, headers={"i": i}),
                                                  routing_key=name)
            await ch.set_qos(prefetch_count=4)
            q = await ch.get_queue(name, ensure=False)
            seen = []
            async with q.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    seen.append((message.body, message.headers["x-stream-offset"],
                                 message.headers["i"]))
                    await message.ack()
                    if len(seen) == 6:
                        break
            assert seen == [(b"a%d" % i, i, i) for i in range(6)]
            # two more consumers, each from its own offset, at the same time
            ch2 = await conn.channel()
            await ch2.set_qos(prefetch_count=3)
            q2 = await ch2.get_queue(name, ensure=False)
            got = {"x": [], "y": []}
            done = asyncio.Event()

            def make(key):
                async def on(message):
                    got[key].append(message.headers["x-stream-offset"])
                    await message.ack()
                    if len(got["x"]) == 6 and len(got["y"]) == 2:
                        done.set()
                return on
            await q2.consume(make("x"), arguments={"x-stream-offset": 0})
            await q2.consume(make("y"), arguments={"x-stream-offset": 4})
            await asyncio.wait_for(done.wait(), 5)
            assert got == {"x": [0, 1, 2, 3, 4, 5], "y": [4, 5]}
            # "last" and a timestamp
            q3 = await (await conn.channel()).get_queue(name, ensure=False)
            await q3.channel.set_qos(prefetch_count=3)
            async with q3.iterator(arguments={"x-stream-offset": "last"}) as it:
                async for message in it:
                    assert message.headers["x-stream-offset"] == 5
                    await message.ack()
                    break
            decl = await ch.declare_queue(name, durable=True, arguments=STREAM)
            assert decl.declaration_result.message_count == 6
    asyncio.run(main())


async def _ignore(message) -> None:
    pass


def test_stream_consume_errors_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            name = uniq()
            await ch.declare_queue(name, durable=True, arguments=STREAM)
            q = await ch.get_queue(name, ensure=False)
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await q.consume(_ignore)
            assert "consumer prefetch count is not set" in str(exc.value)
            ch2 = await conn.channel()
            await ch2.set_qos(prefetch_count=1)
            q2 = await ch2.get_queue(name, ensure=False)
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await q2.consume(_ignore, arguments={"x-stream-offset": "nope"})
            assert "invalid_stream_offset_arg" in str(exc.value)
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.get_queue(name, ensure=False)
            with pytest.raises(amqe.ConnectionNotImplemented) as exc:
                await q.consume(_ignore, no_ack=True)
            assert "automatic acknowledgement not supported by stream queues" in str(exc.value)
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.get_queue(name, ensure=False)
            with pytest.raises(amqe.ConnectionNotImplemented) as exc:
                await q.get()
            assert "basic.get not supported by stream queues" in str(exc.value)
    asyncio.run(main())
