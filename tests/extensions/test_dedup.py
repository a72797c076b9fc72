"""Message deduplication (queue argument x-message-deduplication, as the
rabbitmq-message-deduplication plugin names it): a message whose x-deduplication-header (or, without
it, message_id) was seen within the cache window (x-cache-ttl ms, x-cache-size entries) is dropped,
and the publisher's confirm is still an ack. (The plugin is not on the reference RabbitMQ, so this
follows the issue's description.)"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from eb_support import uniq
from ext_helpers import count, get_all

DEDUP = {"x-message-deduplication": True}


def dd(key):
    return pika.BasicProperties(headers={"x-deduplication-header": key})


def bodies(ch, q):
    return [b for _m, _p, b in get_all(ch, q)]


def test_duplicate_header_is_dropped_and_still_acked(ch):
    q = uniq("dd")
    ch.queue_declare(q, arguments=DEDUP)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first", dd("k1"))
    ch.basic_publish("", q, b"dup", dd("k1"))  # acked: no NackError
    ch.basic_publish("", q, b"other", dd("k2"))
    ch.basic_publish("", q, b"no-key")
    ch.basic_publish("", q, b"no-key-again")  # without a key nothing is deduplicated
    assert bodies(ch, q) == [b"first", b"other", b"no-key", b"no-key-again"]


def test_message_id_is_the_key_without_the_header(ch):
    q = uniq("dd")
    ch.queue_declare(q, arguments=DEDUP)
    ch.basic_publish("", q, b"a", pika.BasicProperties(message_id="m-1"))
    ch.basic_publish("", q, b"b", pika.BasicProperties(message_id="m-1"))
    ch.basic_publish("", q, b"c", pika.BasicProperties(message_id="m-2"))
    assert bodies(ch, q) == [b"a", b"c"]


def test_duplicate_stays_a_duplicate_after_consumption_within_the_window(ch):
    q = uniq("dd")
    ch.queue_declare(q, arguments={**DEDUP, "x-cache-ttl": 60000})
    ch.basic_publish("", q, b"a", dd("k"))
    assert bodies(ch, q) == [b"a"]
    ch.basic_publish("", q, b"a-again", dd("k"))
    assert count(ch, q) == 0


def test_cache_ttl_window(ch):
    q = uniq("dd")
    ch.queue_declare(q, arguments={**DEDUP, "x-cache-ttl": 200})
    ch.basic_publish("", q, b"1", dd("k"))
    ch.basic_publish("", q, b"dup", dd("k"))
    time.sleep(0.3)
    ch.basic_publish("", q, b"2", dd("k"))  # the window passed: accepted again
    assert bodies(ch, q) == [b"1", b"2"]


def test_cache_size_evicts_the_oldest_key(ch):
    q = uniq("dd")
    ch.queue_declare(q, arguments={**DEDUP, "x-cache-size": 2})
    for key in ("a", "b", "c"):  # "a" is evicted by "c"
        ch.basic_publish("", q, key.encode(), dd(key))
    ch.basic_publish("", q, b"c-dup", dd("c"))
    ch.basic_publish("", q, b"a-again", dd("a"))
    assert bodies(ch, q) == [b"a", b"b", b"c", b"a-again"]


def test_without_the_argument_nothing_is_deduplicated(ch):
    q = uniq("dd")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"1", dd("k"))
    ch.basic_publish("", q, b"2", dd("k"))
    assert count(ch, q) == 2


def test_producer_retry_after_lost_confirm_creates_no_duplicate(connect):
    """The producer publishes, its connection drops before the confirm arrives, and it publishes
    the same message again on a new connection: one copy only, and the retry is acked."""
    q = uniq("dd")
    setup = connect().channel()
    setup.queue_declare(q, arguments={**DEDUP, "x-cache-ttl": 60000}, durable=True)
    for i in range(20):
        conn = connect()
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": f"order-{i}"})
        ch.basic_publish("", q, b"order-%d" % i, props)
        if i % 2 == 0:  # "lost" confirm: retry on a fresh connection
            retry = connect().channel()
            retry.confirm_delivery()
            retry.basic_publish("", q, b"order-%d" % i, props)  # acked, not duplicated
        conn.close()
    got = bodies(setup, q)
    assert got == [b"order-%d" % i for i in range(20)]


def test_retry_after_a_nack_is_not_taken_for_a_duplicate(ch):
    """A message refused by reject-publish was never enqueued: its key must not be remembered."""
    q = uniq("dd")
    ch.queue_declare(q, arguments={**DEDUP, "x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"a", dd("a"))
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"b", dd("b"))
    assert bodies(ch, q) == [b"a"]
    ch.basic_publish("", q, b"b", dd("b"))  # the retry gets in
    assert bodies(ch, q) == [b"b"]


def test_dedup_is_per_queue(ch):
    ex = uniq("fan")
    ch.exchange_declare(ex, "fanout")
    q1, q2 = uniq("dd"), uniq("plain")
    ch.queue_declare(q1, arguments=DEDUP)
    ch.queue_declare(q2)
    ch.queue_bind(q1, ex)
    ch.queue_bind(q2, ex)
    ch.basic_publish(ex, "", b"1", dd("k"))
    ch.basic_publish(ex, "", b"2", dd("k"))
    assert count(ch, q1) == 1 and count(ch, q2) == 2


@pytest.mark.parametrize("args", [{"x-message-deduplication": "yes"},
                                  {**DEDUP, "x-cache-size": 0}, {**DEDUP, "x-cache-ttl": -5}])
def test_invalid_dedup_arguments_are_406(ch, args):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uniq("dd"), arguments=args)
    assert exc.value.reply_code == 406


def test_dedup_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(uniq("dd"), arguments=DEDUP)
            for body in (b"x", b"x-dup"):
                confirm = await ch.default_exchange.publish(
                    aio_pika.Message(body, headers={"x-deduplication-header": "same"}),
                    routing_key=q.name)
                assert confirm.name == "Basic.Ack"
            msg = await q.get()
            assert msg.body == b"x"
            await msg.ack()
            assert await q.get(fail=False) is None
    asyncio.run(main())
