"""Item 1: queue.declare with x-queue-type (replies and texts as RabbitMQ 3.10 gives them)."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions as amqe
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq
from stream_helpers import STREAM


def _declare_error(conn, name, **kw) -> tuple[int, str]:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(name, **kw)
    return exc.value.reply_code, exc.value.reply_text


def test_stream_declare_ok_and_counts(conn):
    ch = conn.channel()
    name = uniq()
    ok = ch.queue_declare(name, durable=True, arguments=STREAM).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, b"m%d" % i)
    # redeclare (same arguments) and passive declare both report the log's length
    assert ch.queue_declare(name, durable=True, arguments=STREAM).method.message_count == 3
    assert ch.queue_declare(name, passive=True).method.message_count == 3


@pytest.mark.parametrize("kw, prop", [
    ({"durable": False}, "non-durable"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": True, "auto_delete": True}, "auto-delete"),
])
def test_stream_declare_bad_properties_pika(conn, kw, prop):
    name = uniq()
    code, text = _declare_error(conn, name, arguments=STREAM, **kw)
    assert code == 406
    assert text == f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'"


def test_unknown_queue_type_pika(conn):
    name = uniq()
    code, text = _declare_error(conn, name, durable=True, arguments={"x-queue-type": "bogus"})
    assert code == 406
    assert text == (f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{name}' in "
                    f"vhost '/': \"unsupported queue type 'bogus'\"")


def test_classic_type_and_absent_are_ordinary_queues(conn):
    ch = conn.channel()
    a, b = uniq("classic"), uniq("plain")
    ch.queue_declare(a, arguments={"x-queue-type": "classic"})   # non-durable is fine for classic
    ch.queue_declare(b, exclusive=True)
    ch.confirm_delivery()
    ch.basic_publish("", a, b"x")
    method, props, body = ch.basic_get(a, auto_ack=True)          # basic.get works on classic
    assert body == b"x" and not (props.headers or {}).get("x-stream-offset")
    # classic and absent are the same type: redeclaring without x-queue-type is equivalent
    ch.queue_declare(a)
    assert ch.queue_declare(a, passive=True).method.message_count == 0


def test_redeclare_type_mismatch(conn):
    name = uniq()
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    code, text = _declare_error(conn, name, durable=True)
    assert code == 406
    assert text == (f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{name}' in "
                    f"vhost '/': received none but current is the value 'stream' of type 'longstr'")


@pytest.mark.parametrize("arg, value, why", [
    ("x-max-length", 7, None),
    ("x-message-ttl", 7, None),
    ("x-max-priority", 7, None),
    ("x-dead-letter-exchange", "dlx", None),
    ("x-expires", 1000, None),
    ("x-single-active-consumer", True, None),
    ("x-overflow", "drop-head", None),
    ("x-max-age", "7X", "invalid_max_age"),
    ("x-max-age", "0s", "invalid_max_age"),
    ("x-max-age", 7, "{unacceptable_type,signedint}"),
    ("x-max-length-bytes", "10", '"expected integer, got longstr"'),
    ("x-max-length-bytes", -5, "{value_negative,-5}"),
    ("x-stream-max-segment-size-bytes", "1000", '"expected integer, got longstr"'),
])
def test_stream_argument_validation(conn, arg, value, why):
    name = uniq()
    code, text = _declare_error(conn, name, durable=True, arguments={**STREAM, arg: value})
    assert code == 406
    tail = f": {why}" if why else " of queue type rabbit_stream_queue"
    assert text == f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/'{tail}"


def test_stream_supported_arguments_accepted(conn):
    ch = conn.channel()
    for age in ("7D", "12h", "30m", "1Y", "5M", "10s"):
        ch.queue_declare(uniq(), durable=True, arguments={
            **STREAM, "x-max-age": age, "x-max-length-bytes": 10_000_000,
            "x-stream-max-segment-size-bytes": 1_000_000, "x-initial-cluster-size": 1,
            "x-queue-leader-locator": "balanced", "x-custom-thing": 1})


def test_stream_declare_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            name = uniq()
            q = await ch.declare_queue(name, durable=True, arguments=STREAM)
            assert q.declaration_result.message_count == 0
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await (await conn.channel()).declare_queue(uniq(), durable=False, arguments=STREAM)
            assert "invalid property 'non-durable'" in str(exc.value)
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await (await conn.channel()).declare_queue(uniq(), durable=True, exclusive=True,
                                                           arguments=STREAM)
            assert "invalid property 'exclusive-owner'" in str(exc.value)
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await (await conn.channel()).declare_queue(uniq(), durable=True, auto_delete=True,
                                                           arguments=STREAM)
            assert "invalid property 'auto-delete'" in str(exc.value)
            with pytest.raises(amqe.ChannelPreconditionFailed) as exc:
                await (await conn.channel()).declare_queue(uniq(), durable=True,
                                                           arguments={"x-queue-type": "quorum2"})
            assert "unsupported queue type 'quorum2'" in str(exc.value)
            classic = await (await conn.channel()).declare_queue(
                uniq(), arguments={"x-queue-type": "classic"})
            assert classic.declaration_result.message_count == 0
    asyncio.run(main())


def test_stream_delete(conn):
    ch = conn.channel()
    name = uniq()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.queue_delete(name)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(name, passive=True)
    assert exc.value.reply_code == 404
    # same name, now a classic queue: nothing of the stream is left
    ch = conn.channel()
    ch.queue_declare(name)
    assert ch.queue_declare(name, passive=True).method.message_count == 0
