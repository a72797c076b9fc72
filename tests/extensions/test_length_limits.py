"""Queue length limits: x-max-length, x-max-length-bytes and the x-overflow modes
drop-head (default), reject-publish and reject-publish-dlx. Checked against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aio_pika.exceptions
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from eb_support import uniq, wait_until
from ext_helpers import count, get_all


def bodies(ch, q):
    return [b for _m, _p, b in get_all(ch, q)]


def test_max_length_drop_head_keeps_the_newest(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 3})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    assert count(ch, q) == 3
    assert bodies(ch, q) == [b"7", b"8", b"9"]


def test_max_length_counts_ready_messages_only(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 2})
    ch.confirm_delivery()  # (RabbitMQ enqueues asynchronously: count confirmed messages only)
    for i in range(2):
        ch.basic_publish("", q, b"%d" % i)
    held = ch.basic_get(q)[0]  # unacked: no longer counts
    ch.basic_publish("", q, b"2")
    ch.basic_publish("", q, b"3")
    assert count(ch, q) == 2
    ch.basic_ack(held.delivery_tag)
    assert bodies(ch, q) == [b"2", b"3"]


def test_max_length_zero_drops_everything(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 0})
    ch.basic_publish("", q, b"x")
    assert count(ch, q) == 0


def test_max_length_bytes_drop_head(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):  # 12 bytes > 10: the head goes
        ch.basic_publish("", q, body)
    assert bodies(ch, q) == [b"bbbb", b"cccc"]
    ch.basic_publish("", q, b"x" * 11)  # larger than the limit on its own: nothing stays
    assert count(ch, q) == 0


def test_drop_head_dead_letters_with_reason_maxlen(ch):
    q, dlq = uniq("len"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": dlq})
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert wait_until(lambda: count(ch, dlq) == 2)
    dropped = get_all(ch, dlq)
    assert [b for _m, _p, b in dropped] == [b"0", b"1"]
    for _m, p, _b in dropped:
        [death] = p.headers["x-death"]
        assert (death["reason"], death["queue"], death["count"]) == ("maxlen", q, 1)
    assert bodies(ch, q) == [b"2"]


def test_reject_publish_nacks_the_publisher(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"0")
    ch.basic_publish("", q, b"1")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"2")
    assert bodies(ch, q) == [b"0", b"1"]  # the old ones stay; the new one was refused
    ch.basic_publish("", q, b"3")  # room again: acked
    assert bodies(ch, q) == [b"3"]


def test_reject_publish_by_bytes(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length-bytes": 6, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"abcd")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"efg")
    ch.basic_publish("", q, b"ef")
    assert bodies(ch, q) == [b"abcd", b"ef"]


def test_reject_publish_without_confirms_drops_silently(ch):
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert bodies(ch, q) == [b"0"]


def test_reject_publish_does_not_dead_letter(ch):
    q, dlq = uniq("len"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish",
                                   "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"0")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"1")
    time.sleep(0.05)
    assert count(ch, dlq) == 0


def test_reject_publish_dlx_nacks_and_dead_letters(ch):
    q, dlq = uniq("len"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                   "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"0")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"1", pika.BasicProperties(headers={"h": 1}))
    assert wait_until(lambda: count(ch, dlq) == 1)
    [(_m, p, body)] = get_all(ch, dlq)
    assert body == b"1" and p.headers["h"] == 1
    [death] = p.headers["x-death"]
    assert (death["reason"], death["queue"], death["exchange"], death["routing-keys"]) == \
        ("maxlen", q, "", [q])
    assert bodies(ch, q) == [b"0"]


def test_nack_when_one_of_several_queues_rejects(ch):
    full, roomy = uniq("full"), uniq("roomy")
    ex = uniq("fan")
    ch.exchange_declare(ex, "fanout")
    ch.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.queue_declare(roomy)
    ch.queue_bind(full, ex)
    ch.queue_bind(roomy, ex)
    ch.confirm_delivery()
    with pytest.raises(NackError):
        ch.basic_publish(ex, "", b"x")
    assert count(ch, roomy) == 1  # the queue with room still got it (RabbitMQ does the same)


def test_confirm_stream_stays_ordered_with_nacks(connect):
    """Acks and nacks interleaved: every publish is answered once, in order."""
    conn = connect()
    ch = conn.channel()
    q = uniq("len")
    ch.queue_declare(q, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    outcomes = []
    for i in range(6):
        try:
            ch.basic_publish("", q, b"%d" % i)
            outcomes.append("ack")
        except NackError:
            outcomes.append("nack")
    assert outcomes == ["ack"] * 3 + ["nack"] * 3


@pytest.mark.parametrize("args", [{"x-overflow": "bogus"}, {"x-max-length": -1},
                                  {"x-max-length-bytes": "1"}])
def test_invalid_length_arguments_are_406(ch, args):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uniq("len"), arguments=args)
    assert exc.value.reply_code == 406


def test_reject_publish_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(uniq("len"), arguments={"x-max-length": 1,
                                                               "x-overflow": "reject-publish"})
            await ch.default_exchange.publish(aio_pika.Message(b"0"), routing_key=q.name)
            with pytest.raises(aio_pika.exceptions.DeliveryError):
                await ch.default_exchange.publish(aio_pika.Message(b"1"), routing_key=q.name)
            msg = await q.get()
            assert msg.body == b"0"
            await msg.ack()
            await ch.default_exchange.publish(aio_pika.Message(b"2"), routing_key=q.name)
    asyncio.run(main())
