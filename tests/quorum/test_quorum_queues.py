"""Quorum queues (x-queue-type: quorum) with real clients: RabbitMQ's declaration rules and texts,
every message stored, x-delivery-limit with x-delivery-count, dead-letter strategies, length limits,
TTL, single active consumer, consumer priorities, and the admin API's type."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aio_pika
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import pika_connect, uniq
from exchange_broker.testing import ThreadedBroker

Q = {"x-queue-type": "quorum"}


def refused(channel_factory, name, **kw) -> str:
    ch = channel_factory()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(name, **kw)
    assert exc.value.reply_code == 406
    return exc.value.reply_text


def test_declaration_rules_and_texts(pika_conn):
    new = pika_conn.channel
    name = uniq("qq")
    assert refused(new, name, durable=False, arguments=Q) == \
        f"PRECONDITION_FAILED - invalid property 'non-durable' for queue '{name}' in vhost '/'"
    assert refused(new, name, durable=True, exclusive=True, arguments=Q) == \
        f"PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{name}' in vhost '/'"
    assert refused(new, name, durable=True, auto_delete=True, arguments=Q) == \
        f"PRECONDITION_FAILED - invalid property 'auto-delete' for queue '{name}' in vhost '/'"
    assert refused(new, "", durable=True, arguments=Q) == \
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    for arg, value in (("x-max-priority", 10), ("x-queue-mode", "lazy"), ("x-max-age", "1D"),
                       ("x-stream-max-segment-size-bytes", 100)):
        assert refused(new, name, durable=True, arguments={**Q, arg: value}) == \
            f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/' of queue " \
            f"type rabbit_quorum_queue"
    assert refused(new, name, durable=True, arguments={**Q, "x-dead-letter-strategy": "bogus"}) == \
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{name}' in vhost '/': " \
        f"invalid_dlx_strategy"
    ch = new()
    ok = ch.queue_declare(name, durable=True, arguments={**Q, "x-delivery-limit": 3,
                                                          "x-single-active-consumer": True,
                                                          "x-quorum-initial-group-size": 3})
    assert ok.method.queue == name
    # redeclaring it as a classic queue is inequivalent
    text = refused(new, name, durable=True)
    assert "inequivalent arg 'x-queue-type'" in text


def test_transient_messages_survive_a_restart(spawn_broker, workdir):
    data = ("--data-dir", str(workdir / "data"))
    broker = spawn_broker(*data)
    conn = pika_connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qq-keep", durable=True, arguments=Q)
    for i in range(20):
        ch.basic_publish("", "qq-keep", f"m{i}".encode(), pika.BasicProperties(delivery_mode=1))
    conn.close()
    broker.kill()
    broker = spawn_broker(*data)
    conn = pika_connect(broker.port)
    ch = conn.channel()
    got = []
    for _ in range(20):
        method, _props, body = ch.basic_get("qq-keep", auto_ack=True)
        got.append(body)
    assert got == [f"m{i}".encode() for i in range(20)]
    assert ch.basic_get("qq-keep")[0] is None
    conn.close()


def test_delivery_limit_counts_returns_then_dead_letters(pika_conn):
    ch = pika_conn.channel()
    dlq, name = uniq("dlq"), uniq("qq")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(name, durable=True, arguments={**Q, "x-delivery-limit": 2,
                                                    "x-dead-letter-exchange": "",
                                                    "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", name, b"poison", pika.BasicProperties(headers={"k": "v"}))
    counts = []
    for _ in range(3):
        method, props, _body = _get(ch, name)
        counts.append(((props.headers or {}).get("x-delivery-count"), method.redelivered))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [(None, False), (1, True), (2, True)]
    method, props, body = _get(ch, dlq, auto_ack=True)
    assert body == b"poison"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert props.headers["x-death"][0]["queue"] == name
    assert props.headers["k"] == "v" and "x-delivery-count" not in props.headers
    assert ch.basic_get(name)[0] is None


def test_at_least_once_and_reject_dead_letter(pika_conn):
    ch = pika_conn.channel()
    dlq, name = uniq("dlq"), uniq("qq")
    ch.queue_declare(dlq, durable=True, arguments=Q)
    ch.queue_declare(name, durable=True, arguments={**Q, "x-dead-letter-exchange": "",
                                                    "x-dead-letter-routing-key": dlq,
                                                    "x-dead-letter-strategy": "at-least-once",
                                                    "x-overflow": "reject-publish"})
    ch.basic_publish("", name, b"bad")
    method, _props, _body = _get(ch, name)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = _get(ch, dlq, auto_ack=True)
    assert body == b"bad" and props.headers["x-death"][0]["reason"] == "rejected"


def test_length_limits(pika_conn):
    ch = pika_conn.channel()
    ch.confirm_delivery()
    capped, dropping = uniq("qq"), uniq("qq")
    ch.queue_declare(capped, durable=True, arguments={**Q, "x-max-length": 2, "x-overflow": "reject-publish"})
    ch.queue_declare(dropping, durable=True, arguments={**Q, "x-max-length": 2})
    nacked = 0
    for i in range(3):
        try:
            ch.basic_publish("", capped, b"%d" % i, mandatory=True)
        except pika.exceptions.NackError:
            nacked += 1
        ch.basic_publish("", dropping, b"%d" % i)
    assert nacked == 1
    assert [_get(ch, dropping, auto_ack=True)[2] for _ in range(2)] == [b"1", b"2"]
    # (the TTL and the delivery limit's returns: tests/queue_types/test_quorum_rules.py)


def test_single_active_consumer_and_priorities(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=10)
            sac = await ch.declare_queue(uniq("qq"), durable=True,
                                         arguments={**Q, "x-single-active-consumer": True})
            prio = await ch.declare_queue(uniq("qq"), durable=True, arguments=Q)
            got = {"a": [], "b": [], "low": [], "high": []}

            def into(key):
                async def cb(msg):
                    got[key].append(msg.body)
                    await msg.ack()
                return cb
            await sac.consume(into("a"))
            await sac.consume(into("b"))
            await prio.consume(into("low"), arguments={"x-priority": 1})
            await prio.consume(into("high"), arguments={"x-priority": 5})
            for i in range(5):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), sac.name)
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), prio.name)
            for _ in range(100):
                if len(got["a"]) + len(got["b"]) == 5 and len(got["low"]) + len(got["high"]) == 5:
                    break
                await asyncio.sleep(0.05)
            return got
    got = asyncio.run(main())
    assert got["a"] == [b"0", b"1", b"2", b"3", b"4"] and got["b"] == []
    assert len(got["high"]) == 5 and got["low"] == []


def test_admin_api_shows_the_type():
    with ThreadedBroker(admin=True) as tb:
        conn = pika_connect(tb.port)
        conn.channel().queue_declare("qq-api", durable=True, arguments=Q)
        conn.close()
        pw = urllib.request.HTTPPasswordMgrWithDefaultRealm()
        pw.add_password(None, tb.admin_url, "guest", "guest")
        opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(pw))
        with opener.open(tb.admin_url + "/api/queues/%2F/qq-api", timeout=10) as resp:
            info = json.loads(resp.read())
        assert info["type"] == "quorum" and info["durable"] is True
        assert info["arguments"]["x-queue-type"] == "quorum"


def _get(ch, queue, auto_ack=False, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, props, body
        time.sleep(0.02)
    raise AssertionError(f"nothing arrived on {queue}")


def test_global_qos_is_refused_as_rabbitmq_does(broker):
    conn = pika_connect(broker.port)
    ch = conn.channel()
    name = uniq("qq")
    ch.queue_declare(name, durable=True, arguments=Q)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
        ch.basic_consume(name, lambda *a: None)
        conn.process_data_events(1.0)
    assert exc.value.reply_code == 540
    assert exc.value.reply_text == f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos"
