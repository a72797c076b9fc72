"""basic.* through real clients: returns, consumers, cancel notifications, get, QoS, acks,
recover, redelivery order, round-robin and message sizes. Behaviour checked against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import re
import time

import aio_pika
import aiormq.exceptions as amqe
import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from eb_support import RawClient, uniq

slow = pytest.mark.slow

CTAG = re.compile(r"^amq\.ctag-[A-Za-z0-9_-]{22}$")


def pump(conn, predicate=lambda: False, timeout: float = 5.0):
    """Process pika I/O until predicate() holds or timeout passes; returns predicate()."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    return predicate()


def settle(conn, seconds: float = 0.2) -> None:
    """Give the broker time to send anything more it would send."""
    pump(conn, timeout=seconds)


def ready(conn, queue: str) -> int:
    ch = conn.channel()
    count = ch.queue_declare(queue, passive=True).method.message_count
    ch.close()
    return count


def drain(ch, queue: str) -> list[tuple[bytes, bool]]:
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


class Collector:
    """A pika on_message_callback that records deliveries."""

    def __init__(self) -> None:
        self.got: list[tuple[pika.spec.Basic.Deliver, bytes]] = []

    def __call__(self, _ch, method, _props, body) -> None:
        self.got.append((method, body))

    @property
    def bodies(self) -> list[bytes]:
        return [b for _, b in self.got]


# -- mandatory / basic.return ------------------------------------------------------------------

def test_mandatory_unroutable_is_returned_312(pika_conn, channel):
    returns = []
    channel.add_on_return_callback(lambda _c, method, props, body: returns.append(
        (method.reply_code, method.reply_text, method.exchange, method.routing_key, props.headers, body)))
    channel.basic_publish("amq.direct", "nowhere", b"m1", pika.BasicProperties(headers={"h": 1}),
                          mandatory=True)
    channel.basic_publish("", "no-such-queue", b"m2", mandatory=True)
    channel.basic_publish("amq.direct", "nowhere", b"not mandatory")  # silently dropped
    assert pump(pika_conn, lambda: len(returns) == 2)
    settle(pika_conn, 0.1)
    assert returns == [(312, "NO_ROUTE", "amq.direct", "nowhere", {"h": 1}, b"m1"),
                       (312, "NO_ROUTE", "", "no-such-queue", None, b"m2")]


def test_mandatory_unroutable_on_confirm_channel_raises(connect):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("amq.direct", "nowhere", b"lost", mandatory=True)
    [returned] = ei.value.messages
    assert returned.method.reply_code == 312 and returned.body == b"lost"
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"routed", mandatory=True)  # routed: no exception
    assert ready(conn, q) == 1


def test_mandatory_unroutable_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(on_return_raises=True)
            with pytest.raises(amqe.PublishError) as ei:
                await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key="nowhere",
                                                  mandatory=True)
            frame = ei.value.frame
            assert (frame.reply_code, frame.reply_text, frame.exchange, frame.routing_key) == (
                312, "NO_ROUTE", "", "nowhere")
            # without on_return_raises the publish resolves to the returned message
            ch2 = await conn.channel()
            result = await ch2.default_exchange.publish(aio_pika.Message(b"y"), routing_key="nowhere",
                                                        mandatory=True)
            assert isinstance(result.delivery, commands.Basic.Return) and result.body == b"y"
            # routed and unroutable-but-not-mandatory publishes are simply acked
            q = await ch.declare_queue(exclusive=True)
            ok = await ch.default_exchange.publish(aio_pika.Message(b"z"), routing_key=q.name,
                                                   mandatory=True)
            assert isinstance(ok, commands.Basic.Ack)
            ok = await ch.default_exchange.publish(aio_pika.Message(b"z"), routing_key="nowhere",
                                                   mandatory=False)
            assert isinstance(ok, commands.Basic.Ack)
    asyncio.run(main())


# -- consumers ---------------------------------------------------------------------------------

def test_consume_with_client_tag_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            got: asyncio.Queue = asyncio.Queue()

            async def on_message(message):
                await message.ack()
                await got.put(message)

            tag = await q.consume(on_message, consumer_tag="my-consumer")
            assert tag == "my-consumer"
            await ch.default_exchange.publish(aio_pika.Message(b"hello"), routing_key=q.name)
            message = await asyncio.wait_for(got.get(), 5)
            assert (message.body, message.consumer_tag, message.redelivered, message.delivery_tag) == (
                b"hello", "my-consumer", False, 1)
            await q.cancel(tag)
    asyncio.run(main())


def test_server_generated_consumer_tag_and_tag_reuse(broker):
    raw = RawClient(broker.port)
    try:
        raw.send(1, commands.Channel.Open())
        raw.expect(commands.Channel.OpenOk)
        raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
        q = raw.expect(commands.Queue.DeclareOk).queue
        raw.send(1, commands.Basic.Consume(queue=q, consumer_tag=""))
        tag1 = raw.expect(commands.Basic.ConsumeOk).consumer_tag
        raw.send(1, commands.Basic.Consume(queue=q, consumer_tag=""))
        tag2 = raw.expect(commands.Basic.ConsumeOk).consumer_tag
        assert CTAG.match(tag1) and CTAG.match(tag2) and tag1 != tag2
        raw.send(1, commands.Basic.Cancel(consumer_tag="not-a-consumer"))  # unknown tag: cancel-ok
        assert raw.expect(commands.Basic.CancelOk).consumer_tag == "not-a-consumer"
        raw.send(1, commands.Basic.Consume(queue=q, consumer_tag=tag1))
        close = raw.expect(commands.Connection.Close)  # reusing a tag is a connection error
        assert (close.reply_code, close.reply_text) == (
            530, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag1}'")
        raw.send(0, commands.Connection.CloseOk())
    finally:
        raw.sock.close()


def test_exclusive_consumer(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    tag = ch.basic_consume(q, Collector(), exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().basic_consume(q, Collector())
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")
    ch.basic_cancel(tag)
    ch.basic_consume(q, Collector())  # free again
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().basic_consume(q, Collector(), exclusive=True)  # others already consume
    assert ei.value.reply_code == 403


def test_exclusive_consumer_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("q"), auto_delete=True)

            async def ignore(message):
                pass

            await q.consume(ignore, exclusive=True)
            async with await aio_pika.connect(broker.url) as other:
                q2 = await (await other.channel()).get_queue(q.name)
                with pytest.raises(amqe.ChannelAccessRefused) as ei:
                    await q2.consume(ignore)
                assert ei.value.args[0] == f"ACCESS_REFUSED - queue '{q.name}' in vhost '/' in exclusive use"
    asyncio.run(main())


def test_no_ack_consumer_aio_pika(broker, connect):
    observer = connect()

    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("q"))
            for i in range(5):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            got = []
            done = asyncio.Event()

            async def on_message(message):
                got.append(message.body)
                if len(got) == 5:
                    done.set()

            await ch.set_qos(prefetch_count=1)  # does not limit no-ack consumers
            tag = await q.consume(on_message, no_ack=True)
            await asyncio.wait_for(done.wait(), 5)
            assert got == [b"0", b"1", b"2", b"3", b"4"]
            await q.cancel(tag)
            await ch.close()  # nothing was unacked, so nothing comes back
            assert ready(observer, q.name) == 0
            ch = await conn.channel()
            await (await ch.get_queue(q.name)).delete()
    asyncio.run(main())


def test_basic_cancel_stops_deliveries_and_keeps_unacked_ackable(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=2)
    col = Collector()
    tag = ch.basic_consume(q, col)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    assert pump(conn, lambda: len(col.got) == 2)
    ch.basic_cancel(tag)
    ch.basic_ack(col.got[0][0].delivery_tag)
    ch.basic_ack(col.got[1][0].delivery_tag)
    settle(conn)
    assert col.bodies == [b"0", b"1"]
    assert ready(conn, q) == 3


def test_broker_cancels_consumers_when_their_queue_is_deleted(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(name, Collector())
    other = connect().channel()
    assert other.queue_declare(name, passive=True).method.consumer_count == 1
    other.queue_delete(name)
    assert pump(conn, lambda: cancelled == [tag])
    assert ch.consumer_tags == []
    assert ch.is_open  # only the consumer goes, not the channel


def test_broker_cancel_aio_pika(broker, connect):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("q"))

            async def ignore(message):
                pass

            tag = await q.consume(ignore)
            underlay = await ch.get_underlay_channel()
            assert tag in underlay.consumers
            connect().channel().queue_delete(q.name)
            for _ in range(250):
                if tag not in underlay.consumers:
                    break
                await asyncio.sleep(0.02)
            assert tag not in underlay.consumers
            assert not ch.is_closed
    asyncio.run(main())


# -- basic.get -----------------------------------------------------------------------------------

def test_get_and_get_empty(channel):
    q = channel.queue_declare("", exclusive=True).method.queue
    assert channel.basic_get(q) == (None, None, None)
    for i in range(3):
        channel.basic_publish("", q, b"%d" % i, pika.BasicProperties(message_id=str(i)))
    seen = []
    for _ in range(3):
        method, props, body = channel.basic_get(q)
        seen.append((method.delivery_tag, method.redelivered, method.message_count, method.exchange,
                     method.routing_key, props.message_id, body))
    assert seen == [(1, False, 2, "", q, "0", b"0"), (2, False, 1, "", q, "1", b"1"),
                    (3, False, 0, "", q, "2", b"2")]
    assert channel.basic_get(q)[0] is None
    channel.basic_ack(3, multiple=True)


def test_get_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            assert await q.get(fail=False) is None
            with pytest.raises(aio_pika.exceptions.QueueEmpty):
                await q.get()
            await ch.default_exchange.publish(aio_pika.Message(b"a", content_type="text/plain"),
                                              routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"b"), routing_key=q.name)
            m = await q.get()
            assert (m.body, m.content_type, m.message_count, m.redelivered) == (b"a", "text/plain", 1, False)
            await m.reject(requeue=True)
            m = await q.get()
            assert (m.body, m.message_count, m.redelivered) == (b"a", 1, True)
            await m.ack()
            m = await q.get(no_ack=True)
            assert (m.body, m.message_count) == (b"b", 0)
    asyncio.run(main())


# -- QoS ---------------------------------------------------------------------------------------

def test_prefetch_per_consumer(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=2)  # global=false: each new consumer may hold 2
    a, b = Collector(), Collector()
    ch.basic_consume(q, a)
    ch.basic_consume(q, b)
    pump(conn, lambda: len(a.got) + len(b.got) >= 4)
    settle(conn)
    assert (len(a.got), len(b.got)) == (2, 2)
    ch.basic_ack(a.got[0][0].delivery_tag)
    pump(conn, lambda: len(a.got) + len(b.got) >= 5)
    settle(conn)
    assert (len(a.got), len(b.got)) == (3, 2)  # the freed slot goes to the consumer that acked
    assert ready(conn, q) == 5


def test_prefetch_change_applies_to_new_consumers_only(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=2)
    a = Collector()
    ch.basic_consume(q, a)
    pump(conn, lambda: len(a.got) >= 2)
    ch.basic_qos(prefetch_count=5)
    b = Collector()
    ch.basic_consume(q, b)
    pump(conn, lambda: len(b.got) >= 5)
    settle(conn)
    assert (len(a.got), len(b.got)) == (2, 5)


def test_global_prefetch_is_shared_by_the_channels_consumers_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=3, global_=True)
            q1 = await ch.declare_queue(exclusive=True)
            q2 = await ch.declare_queue(exclusive=True)
            for q in (q1, q2):
                for i in range(5):
                    await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            held: dict[str, list] = {q1.name: [], q2.name: []}

            async def on_message(message):
                held[message.routing_key].append(message)

            async def settled(expected):
                for _ in range(250):
                    if sum(map(len, held.values())) >= expected:
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)  # and nothing beyond it
                return sum(map(len, held.values()))

            await q1.consume(on_message)
            await q2.consume(on_message)
            assert await settled(3) == 3
            await held[q1.name][0].ack() if held[q1.name] else await held[q2.name][0].ack()
            assert await settled(4) == 4  # exactly one more
            for msgs in held.values():
                for m in msgs:
                    if not m.processed:
                        await m.ack()
            assert await settled(7) == 7  # 3 more after freeing 3 slots
    asyncio.run(main())


def test_global_and_per_consumer_prefetch_together(connect):
    def trial(order, expected_total):
        conn = connect()
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        for i in range(10):
            ch.basic_publish("", q, b"%d" % i)
        for global_qos, count in order:
            ch.basic_qos(prefetch_count=count, global_qos=global_qos)
        a, b = Collector(), Collector()
        ch.basic_consume(q, a)
        ch.basic_consume(q, b)
        pump(conn, lambda: len(a.got) + len(b.got) >= expected_total)
        settle(conn)
        conn.close()
        return len(a.got), len(b.got)

    # per-consumer 2 and channel-wide 3: the first consumer fills up, the second gets what's left
    assert trial([(False, 2), (True, 3)], 3) == (2, 1)
    # RabbitMQ quirk kept: basic.qos global=false also lifts an earlier global limit
    assert trial([(True, 3), (False, 2)], 4) == (2, 2)
    # global alone: shared, the first consumer takes all 3
    assert trial([(True, 3)], 3) == (3, 0)


# -- ack / nack / reject -----------------------------------------------------------------------

def test_ack_multiple(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(6)]
    assert tags == [1, 2, 3, 4, 5, 6]
    ch.basic_ack(3, multiple=True)   # 1, 2, 3
    ch.basic_ack(5)                  # 5
    ch.close()                       # 4 and 6 go back
    assert drain(conn.channel(), q) == [(b"3", True), (b"5", True)]


def test_ack_zero_multiple_acks_everything(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    for _ in range(4):
        ch.basic_get(q)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert ready(conn, q) == 0


def test_nack_and_reject_with_multiple_and_requeue_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            for i in range(6):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            msgs = [await q.get() for _ in range(6)]
            await msgs[2].nack(multiple=True, requeue=True)  # 0, 1, 2 back in place
            await msgs[3].reject(requeue=False)              # 3 dropped
            await msgs[4].nack(requeue=False)                # 4 dropped
            await msgs[5].nack(requeue=True)                 # 5 back
            out = []
            while (m := await q.get(fail=False, no_ack=True)) is not None:
                out.append((m.body, m.redelivered))
            assert out == [(b"0", True), (b"1", True), (b"2", True), (b"5", True)]
    asyncio.run(main())


@pytest.mark.parametrize("action,tag", [
    (lambda ch: ch.basic_ack(42), 42),
    (lambda ch: ch.basic_ack(42, multiple=True), 42),
    (lambda ch: ch.basic_ack(0), 0),
    (lambda ch: ch.basic_nack(7), 7),
    (lambda ch: ch.basic_nack(7, multiple=True, requeue=False), 7),
    (lambda ch: ch.basic_reject(7), 7),
])
def test_unknown_delivery_tag_is_406(channel, action, tag):
    action(channel)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.basic_qos(prefetch_count=0)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")


def test_double_ack_is_406_and_unacked_message_returns(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    first = ch.basic_get(q)[0].delivery_tag
    ch.basic_get(q)
    ch.basic_ack(first)
    ch.basic_ack(first)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_qos(prefetch_count=0)
    assert ei.value.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {first}"
    assert drain(conn.channel(), q) == [(b"b", True)]  # the channel error requeued the other one


def test_unknown_delivery_tag_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            underlay = await ch.get_underlay_channel()
            await underlay.basic_ack(99)
            with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                await underlay.basic_qos(prefetch_count=1)
            assert ei.value.args[0] == "PRECONDITION_FAILED - unknown delivery tag 99"
    asyncio.run(main())


# -- recover and redelivery ------------------------------------------------------------------

def test_recover_requeue_redelivers_to_consumer(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    col = Collector()
    ch.basic_consume(q, col)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert pump(conn, lambda: len(col.got) == 3)
    ch.basic_recover(requeue=True)
    assert pump(conn, lambda: len(col.got) == 6)
    assert [(m.delivery_tag, m.redelivered, b) for m, b in col.got] == [
        (1, False, b"0"), (2, False, b"1"), (3, False, b"2"),
        (4, True, b"0"), (5, True, b"1"), (6, True, b"2")]
    ch.basic_ack(6, multiple=True)
    settle(conn)
    assert len(col.got) == 6


def test_redelivered_flag_on_every_redelivery_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=q.name)
            got: asyncio.Queue = asyncio.Queue()
            await q.consume(got.put)
            flags = []
            for _ in range(3):
                message = await asyncio.wait_for(got.get(), 5)
                flags.append(message.redelivered)
                await message.nack(requeue=True)
            message = await asyncio.wait_for(got.get(), 5)
            flags.append(message.redelivered)
            await message.ack()
            assert flags == [False, True, True, True]
            # a new message starts with redelivered=false again
            await ch.default_exchange.publish(aio_pika.Message(b"n"), routing_key=q.name)
            message = await asyncio.wait_for(got.get(), 5)
            assert (message.body, message.redelivered) == (b"n", False)
            await message.ack()
    asyncio.run(main())


def test_unacked_messages_return_in_order_when_channel_closes(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=6)
    col = Collector()
    ch.basic_consume(q, col)
    assert pump(conn, lambda: len(col.got) == 6)
    for method, body in list(col.got):
        if body in (b"1", b"4"):
            ch.basic_ack(method.delivery_tag)
    assert pump(conn, lambda: len(col.got) == 8)  # the two freed slots are refilled
    settle(conn, 0.1)
    assert col.bodies == [b"%d" % i for i in range(8)]
    ch.close()
    expected = [(b"0", True), (b"2", True), (b"3", True), (b"5", True), (b"6", True), (b"7", True),
                (b"8", False), (b"9", False)]
    assert drain(conn.channel(), q) == expected


def test_unacked_messages_return_in_order_when_connection_closes_aio_pika(broker, connect):
    name = uniq("q")
    observer = connect()
    observer.channel().queue_declare(name)

    async def main():
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        for i in range(8):
            await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=name)
        q = await ch.get_queue(name)
        held = []

        async def on_message(message):
            held.append(message)

        await q.consume(on_message)
        for _ in range(250):
            if len(held) == 8:
                break
            await asyncio.sleep(0.02)
        assert len(held) == 8
        for m in held:
            if m.body in (b"0", b"5", b"7"):
                await m.ack()
        await conn.close()

    asyncio.run(main())
    ch = observer.channel()
    for _ in range(100):
        if ch.queue_declare(name, passive=True).method.message_count == 5:
            break
        time.sleep(0.02)
    assert drain(ch, name) == [(b"1", True), (b"2", True), (b"3", True), (b"4", True), (b"6", True)]
    ch.queue_delete(name)


def test_round_robin_across_consumers_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            per_consumer: dict[str, list[int]] = {}
            total = asyncio.Event()

            def make(tag):
                async def on_message(message):
                    per_consumer.setdefault(tag, []).append(int(message.body))
                    await message.ack()
                    if sum(map(len, per_consumer.values())) == 30:
                        total.set()
                return on_message

            for tag in ("c1", "c2", "c3"):
                await q.consume(make(tag), consumer_tag=tag)
            for i in range(30):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            await asyncio.wait_for(total.wait(), 10)
            assert sorted(len(v) for v in per_consumer.values()) == [10, 10, 10]
            # strict rotation: each consumer sees every third message
            for got in per_consumer.values():
                assert got == list(range(got[0], 30, 3))
    asyncio.run(main())


def test_round_robin_across_channels_pika(connect):
    conn = connect()
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    cols = []
    for _ in range(3):
        c = Collector()
        conn.channel().basic_consume(q, c, auto_ack=True)
        cols.append(c)
    pub = conn.channel()
    for i in range(30):
        pub.basic_publish("", q, b"%d" % i)
    assert pump(conn, lambda: sum(len(c.got) for c in cols) == 30)
    assert [len(c.got) for c in cols] == [10, 10, 10]


# -- message sizes ------------------------------------------------------------------------------

def test_body_sizes_around_frame_max(connect):
    conn = connect()
    frame_max = conn._impl.params.frame_max
    assert frame_max >= 4096
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    sizes = [0, 1, frame_max - 9, frame_max - 8, frame_max - 7, 2 * (frame_max - 8), 1024 * 1024]
    bodies = [bytes((i + n) % 251 for i in range(n)) for n in sizes]
    for body in bodies:
        ch.basic_publish("", q, body)
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    assert pump(conn, lambda: len(col.got) == len(bodies))
    assert [len(b) for b in col.bodies] == sizes
    assert col.bodies == bodies


def test_body_sizes_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            frame_max = 131072
            for n in (0, 1, frame_max - 8, 1024 * 1024):
                body = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
                await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
                m = await q.get(no_ack=True)
                assert m.body == body and m.body_size == n
    asyncio.run(main())


@slow
def test_one_128_mib_message(connect):
    size = 128 * 1024 * 1024  # RabbitMQ's default max_message_size: still accepted
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytearray(size)
    body[0], body[size // 2], body[-1] = 1, 2, 3
    ch.basic_publish("", q, bytes(body))
    del body
    got = []

    def on_message(channel, method, _props, data):
        got.append((len(data), data[0], data[size // 2], data[-1], method.redelivered))
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    assert pump(conn, lambda: got, timeout=60)
    assert got == [(size, 1, 2, 3, False)]
    got.clear()
