"""x-single-active-consumer: one consumer at a time, in order; hand-over when it leaves, with its
unacknowledged messages requeued first. Checked against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import socket
import time

import aio_pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq
from ext_helpers import count

SAC = {"x-single-active-consumer": True}


def _sac_queue(connect):
    """A connection, a channel and a fresh single-active-consumer queue declared on it."""
    conn = connect()
    ch = conn.channel()
    q = uniq("sac")
    ch.queue_declare(q, arguments=SAC)
    return conn, ch, q


def _pump(conn, until, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    return until()


class Recorder:
    def __init__(self, conn, q, name, got, prefetch=0, ack=True):
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.name = name
        self.got = got
        self.tags = []
        self.ack = ack
        self.tag = self.ch.basic_consume(q, self._on)

    def _on(self, ch, m, _p, body):
        self.got.append((self.name, body, m.redelivered))
        if self.ack:
            ch.basic_ack(m.delivery_tag)
        else:
            self.tags.append(m.delivery_tag)


def test_only_one_consumer_receives_in_order(connect):
    conn, ch, q = _sac_queue(connect)
    got = []
    Recorder(conn, q, "first", got)
    Recorder(conn, q, "second", got)
    Recorder(conn, q, "third", got)
    for i in range(30):
        ch.basic_publish("", q, b"%d" % i)
    assert _pump(conn, lambda: len(got) == 30)
    assert [n for n, _b, _r in got] == ["first"] * 30
    assert [int(b) for _n, b, _r in got] == list(range(30))


def test_a_full_active_consumer_does_not_pass_messages_to_the_others(connect):
    conn, ch, q = _sac_queue(connect)
    got = []
    Recorder(conn, q, "active", got, prefetch=2, ack=False)
    Recorder(conn, q, "waiting", got)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    _pump(conn, lambda: False, timeout=0.3)
    assert got == [("active", b"0", False), ("active", b"1", False)]
    assert count(ch, q) == 3


def test_channel_close_hands_over_with_unacked_requeued_first(connect):
    """The active consumer's channel is closed (here by the broker: an unknown delivery tag) while
    it holds unacked messages: they are requeued at the head before the next consumer takes over.
    (pika's own channel.close() sends basic.cancel first, which hands over before the requeue.)"""
    conn, ch, q = _sac_queue(connect)
    got = []
    active = Recorder(conn, q, "active", got, prefetch=3, ack=False)
    Recorder(conn, q, "next", got)
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    assert _pump(conn, lambda: len(got) == 3)
    assert [b for _n, b, _r in got] == [b"0", b"1", b"2"]
    active.ch.basic_ack(active.tags[0])  # "0" is done...
    assert _pump(conn, lambda: len(got) == 4)  # ...so "3" comes in; 1, 2, 3 stay unacked
    active.ch.basic_ack(9999)  # 406 unknown delivery tag: the broker closes the channel
    assert _pump(conn, lambda: len(got) == 4 + 5)
    assert not active.ch.is_open
    assert got[4:] == [("next", b"1", True), ("next", b"2", True), ("next", b"3", True),
                       ("next", b"4", False), ("next", b"5", False)]


def test_connection_loss_hands_over_with_unacked_requeued_first(connect):
    conn, ch, q = _sac_queue(connect)
    got_a, got_b = [], []
    other = connect()
    Recorder(other, q, "a", got_a, prefetch=1, ack=False)
    Recorder(conn, q, "b", got_b)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert _pump(other, lambda: len(got_a) == 1)
    other._impl._transport._sock.shutdown(socket.SHUT_RDWR)  # the consumer's process dies
    assert _pump(conn, lambda: len(got_b) == 3)
    assert got_b == [("b", b"0", True), ("b", b"1", False), ("b", b"2", False)]


def test_pika_channel_close_cancels_then_requeues(connect):
    """pika's BlockingChannel.close() cancels its consumers first: the next consumer takes over
    the ready messages at once; the closed channel's unacked ones follow, redelivered."""
    conn, ch, q = _sac_queue(connect)
    got = []
    active = Recorder(conn, q, "active", got, prefetch=2, ack=False)
    Recorder(conn, q, "next", got)
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    assert _pump(conn, lambda: len(got) == 2)
    active.ch.close()
    assert _pump(conn, lambda: len(got) == 6)
    taken = got[2:]
    assert {n for n, _b, _r in taken} == {"next"}
    assert sorted(b for _n, b, _r in taken) == [b"0", b"1", b"2", b"3"]
    assert all(r for _n, b, r in taken if b in (b"0", b"1"))


def test_cancel_hands_over_new_messages(connect):
    conn, ch, q = _sac_queue(connect)
    got = []
    first = Recorder(conn, q, "first", got)
    Recorder(conn, q, "second", got)
    ch.basic_publish("", q, b"a")
    assert _pump(conn, lambda: len(got) == 1)
    first.ch.basic_cancel(first.tag)
    ch.basic_publish("", q, b"b")
    assert _pump(conn, lambda: len(got) == 2)
    assert [(n, b) for n, b, _r in got] == [("first", b"a"), ("second", b"b")]


def test_messages_wait_for_the_next_consumer(connect):
    conn, ch, q = _sac_queue(connect)
    got = []
    first = Recorder(conn, q, "first", got)
    first.ch.close()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert count(ch, q) == 3
    Recorder(conn, q, "late", got)
    assert _pump(conn, lambda: len(got) == 3)
    assert [b for _n, b, _r in got] == [b"0", b"1", b"2"]


def test_invalid_single_active_consumer_is_406(ch):
    q = uniq("sac")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, arguments={"x-single-active-consumer": 1})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for "
                                    f"queue '{q}' in vhost '/': {{unacceptable_type,signedint}}")


def test_single_active_consumer_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("sac"), arguments=SAC)
            seen: list[tuple[str, bytes, bool]] = []
            ch1 = await conn.channel()
            await ch1.set_qos(prefetch_count=2)
            ch2 = await conn.channel()
            q1, q2 = await ch1.get_queue(q.name), await ch2.get_queue(q.name)

            async def on1(msg):
                seen.append(("one", msg.body, msg.redelivered))  # never acked

            async def on2(msg):
                seen.append(("two", msg.body, msg.redelivered))
                await msg.ack()

            await q1.consume(on1)
            await q2.consume(on2)
            for i in range(4):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            for _ in range(100):
                if len(seen) >= 2:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            assert seen == [("one", b"0", False), ("one", b"1", False)]
            await ch1.close()
            for _ in range(200):
                if len(seen) >= 6:
                    break
                await asyncio.sleep(0.02)
            assert seen[2:] == [("two", b"0", True), ("two", b"1", True), ("two", b"2", False),
                                ("two", b"3", False)]
    asyncio.run(main())
