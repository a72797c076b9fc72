"""Quorum queues as RabbitMQ 4.x: 32 message priorities without x-max-priority (4.3), a delivery
limit of 20 by default that a policy changes or lifts (-1), and a consumer timeout that cancels the
consumer (basic.cancel) instead of closing the channel for clients announcing
consumer_cancel_notify (4.3). Real sockets: pika, raw frames for a client without the capability."""
from __future__ import annotations

import time

import pika
import pytest
import requests
from pamqp import commands

from eb_support import RawClient, uniq
from exchange_broker.testing import ThreadedBroker

QUORUM = {"x-queue-type": "quorum"}


def _quorum(ch, name=None, **args):
    name = name or uniq("qq")
    ch.queue_declare(name, durable=True, arguments={**QUORUM, **args})
    return name


def _pump(conn, until, timeout=8.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)
        if until():
            return True
    return False


# ---- priorities -------------------------------------------------------------------------------------
def test_priorities_without_x_max_priority(connect):
    ch = connect().channel()
    q = _quorum(ch)
    ch.confirm_delivery()
    for body, prio in (("a", None), ("b", 0), ("c", 9), ("d", 5), ("e", 255), ("f", None), ("g", 4),
                       ("h", 31)):
        ch.basic_publish("", q, body.encode(), pika.BasicProperties(priority=prio))
    got = []
    while True:
        m, _, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        got.append(body.decode())
    # 255 is 31 (the highest), no priority is 4 (rabbit_fifo's default), FIFO within a priority
    assert got == ["e", "h", "c", "d", "a", "f", "g", "b"]


def test_x_max_priority_is_still_refused_for_quorum(connect):
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        _quorum(ch, **{"x-max-priority": 10})
    assert err.value.reply_code == 406


# ---- delivery limit ---------------------------------------------------------------------------------
def _returns_until_gone(ch, q, dlq=None, most=40):
    """Reject with requeue until the message leaves ``q``; the x-delivery-count values seen."""
    counts = []
    for _ in range(most):
        m, props, _ = ch.basic_get(q)
        if m is None:
            break
        counts.append((props.headers or {}).get("x-delivery-count", 0))
        ch.basic_reject(m.delivery_tag, requeue=True)
    return counts


def test_delivery_limit_defaults_to_20(connect):
    ch = connect().channel()
    dlq = uniq("dlq")
    ch.queue_declare(dlq)
    q = _quorum(ch, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"poison")
    counts = _returns_until_gone(ch, q)
    assert counts == list(range(21))          # delivered 21 times, returned 20
    m, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"poison" and props.headers["x-death"][0]["reason"] == "delivery_limit"


def test_negative_x_delivery_limit_lifts_it(connect):
    ch = connect().channel()
    q = _quorum(ch, **{"x-delivery-limit": -1})
    ch.basic_publish("", q, b"m")
    assert len(_returns_until_gone(ch, q, most=30)) == 30   # still there after 29 returns


def test_delivery_limit_policy():
    with ThreadedBroker(admin=True) as tb:
        for name, pattern, limit in (("unlimited", "^unlimited", -1), ("three", "^three", 3)):
            r = requests.put(f"{tb.admin_url}/api/policies/%2F/{name}", auth=("guest", "guest"), timeout=15,
                             json={"pattern": pattern, "apply-to": "quorum_queues",
                                   "definition": {"delivery-limit": limit}})
            assert r.status_code in (201, 204), r.text
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port))
        try:
            ch = conn.channel()
            for name, args, expected in (("unlimited-1", {}, 30), ("three-1", {}, 4),
                                         ("three-2", {"x-delivery-limit": 10}, 4),       # lower wins
                                         ("unlimited-2", {"x-delivery-limit": 2}, 3)):  # -1 vs 2: 2
                _quorum(ch, name, **args)
                ch.basic_publish("", name, b"m")
                assert len(_returns_until_gone(ch, name, most=30)) == expected, name
        finally:
            conn.close()


# ---- consumer timeout -------------------------------------------------------------------------------
def test_consumer_timeout_cancels_the_consumer_and_keeps_the_channel(connect):
    conn = connect()
    ch = conn.channel()
    q = _quorum(ch, **{"x-consumer-timeout": 1000})
    ch.basic_publish("", q, b"slow")
    cancelled, got = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    assert _pump(conn, lambda: got)
    assert _pump(conn, lambda: cancelled, timeout=6)     # checked once a second
    assert cancelled == [tag] and ch.is_open
    # the message went back to the queue (redelivered), and a late ack is ignored, not a 406
    other = connect().channel()
    m, props, body = other.basic_get(q, auto_ack=True)
    assert body == b"slow" and m.redelivered
    ch.basic_ack(got[0])
    ch.queue_declare(q, passive=True, durable=True, arguments=QUORUM)
    assert ch.is_open


def test_consumer_timeout_without_cancel_notify_closes_the_channel(broker):
    setup = RawClient(broker.port, open_channel=1)
    q = uniq("qq")
    setup.send(1, commands.Queue.Declare(queue=q, durable=True,
                                         arguments={**QUORUM, "x-consumer-timeout": 1000}))
    setup.expect_next(commands.Queue.DeclareOk, channel=1)
    setup.publish(1, "", q, b"slow")
    client = RawClient(broker.port, open_channel=0, handshake=False)
    client.handshake(client_properties={"product": "old client", "capabilities": {}})
    client.send(1, commands.Channel.Open())
    client.expect_next(commands.Channel.OpenOk, channel=1)
    client.send(1, commands.Basic.Qos(prefetch_count=1),
                commands.Basic.Consume(queue=q, consumer_tag="c1"))
    client.expect_next(commands.Basic.QosOk, channel=1, timeout=5)
    client.expect_next(commands.Basic.ConsumeOk, channel=1, timeout=5)
    client.expect_next(commands.Basic.Deliver, channel=1, timeout=5)
    client.next(5)   # its content header
    client.next(5)   # and body
    close = client.expect_next(commands.Channel.Close, channel=1, timeout=8)
    assert close.reply_code == 406 and "delivery acknowledgement on channel 1 timed out" in close.reply_text
    client.close()
    setup.close()


# (classic queues keep 3.13's channel close: tests/extensions/test_cc_reply_to_timeout.py)
