"""Sender-selected distribution (CC / BCC headers), direct reply-to (amq.rabbitmq.reply-to) and
the consumer (delivery acknowledgement) timeout. Texts as RabbitMQ 3.10 sends them."""

from __future__ import annotations

import asyncio
import time
import uuid

import aio_pika
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from eb_support import uniq
from ext_helpers import count, get_all

TIMEOUT_TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {ch} timed out. Timeout value "
                "used: {ms} ms. This timeout value can be configured, see consumers doc guide to learn "
                "more")


def _pump(conn, until, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    return until()


# -- CC / BCC ----------------------------------------------------------------------------------------

def test_cc_adds_destinations_and_is_kept(ch):
    ex = uniq("direct")
    ch.exchange_declare(ex, "direct")
    qs = {k: uniq(k) for k in ("main", "cc1", "cc2", "none")}
    for key, q in qs.items():
        ch.queue_declare(q)
        ch.queue_bind(q, ex, key)
    ch.basic_publish(ex, "main", b"x", pika.BasicProperties(headers={"CC": ["cc1", "cc2", "nobody"]}))
    for key in ("main", "cc1", "cc2"):
        [(m, p, body)] = get_all(ch, qs[key])
        assert body == b"x" and m.routing_key == "main"  # delivered with the original routing key
        assert p.headers == {"CC": ["cc1", "cc2", "nobody"]}
    assert count(ch, qs["none"]) == 0


def test_bcc_adds_destinations_and_is_stripped(ch):
    ex = uniq("topic")
    ch.exchange_declare(ex, "topic")
    main, hidden = uniq("main"), uniq("hidden")
    ch.queue_declare(main)
    ch.queue_declare(hidden)
    ch.queue_bind(main, ex, "a.*")
    ch.queue_bind(hidden, ex, "secret.#")
    ch.basic_publish(ex, "a.b", b"x", pika.BasicProperties(headers={"BCC": ["secret.x"], "keep": "me"}))
    for q in (main, hidden):
        [(_m, p, _b)] = get_all(ch, q)
        assert p.headers == {"keep": "me"}


def test_cc_and_bcc_deliver_one_copy_per_queue(ch):
    q = uniq("q")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x", pika.BasicProperties(headers={"CC": [q], "BCC": [q, q]}))
    [(_m, p, _b)] = get_all(ch, q)
    assert p.headers == {"CC": [q]}


def test_cc_with_the_default_exchange_and_non_string_entries(ch):
    a, b = uniq("a"), uniq("b")
    ch.queue_declare(a)
    ch.queue_declare(b)
    ch.confirm_delivery()
    ch.basic_publish("", a, b"x", pika.BasicProperties(headers={"CC": [1, b]}))  # 1 is ignored
    assert count(ch, a) == 1 and count(ch, b) == 1


def test_cc_makes_an_otherwise_unroutable_message_routable(ch):
    q = uniq("q")
    ch.queue_declare(q)
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):  # BCC key not bound either: returned
        ch.basic_publish("amq.direct", "nobody", b"x", pika.BasicProperties(headers={"BCC": [q]}),
                         mandatory=True)
    ch.queue_bind(q, "amq.direct", q)
    ch.basic_publish("amq.direct", "nobody", b"y", pika.BasicProperties(headers={"BCC": [q]}),
                     mandatory=True)  # routed via BCC only: not returned
    assert [b for _m, _p, b in get_all(ch, q)] == [b"y"]


@pytest.mark.parametrize("name", ["CC", "BCC"])
def test_cc_that_is_not_an_array_is_406(connect, name):
    ch = connect().channel()
    q = uniq("q")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x", pika.BasicProperties(headers={name: "other"}))
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, passive=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f'PRECONDITION_FAILED - invalid message: '
                                    f'{{unacceptable_type_in_header,"{name}",longstr}}')


# -- direct reply-to -------------------------------------------------------------------------------

def _rpc_server(conn, queue):
    """A server on its own channel: replies body.upper() to reply_to with the correlation id."""
    sch = conn.channel()
    sch.queue_declare(queue)
    seen_reply_to = []

    def on_request(c, m, p, body):
        seen_reply_to.append(p.reply_to)
        c.basic_publish("", p.reply_to, body.upper(),
                        pika.BasicProperties(correlation_id=p.correlation_id))
        c.basic_ack(m.delivery_tag)

    sch.basic_consume(queue, on_request)
    return seen_reply_to


def test_direct_reply_to_rpc_with_pika(connect):
    server_conn, client_conn = connect(), connect()
    rpc_q = uniq("rpc")
    seen = _rpc_server(server_conn, rpc_q)
    cch = client_conn.channel()
    replies = []
    cch.basic_consume("amq.rabbitmq.reply-to",
                      lambda c, m, p, body: replies.append((m, p, body)), auto_ack=True)
    for i in range(3):
        corr = str(uuid.uuid4())
        cch.basic_publish("", rpc_q, b"ping-%d" % i,
                          pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=corr))
        deadline = time.monotonic() + 5
        while len(replies) < i + 1 and time.monotonic() < deadline:
            server_conn.process_data_events(0.01)
            client_conn.process_data_events(0.01)
        m, p, body = replies[i]
        assert body == b"PING-%d" % i and p.correlation_id == corr
        assert m.exchange == "" and m.routing_key.startswith("amq.rabbitmq.reply-to.")
    # the server saw a per-channel address, not the pseudo-queue's name
    assert all(r.startswith("amq.rabbitmq.reply-to.") and r != "amq.rabbitmq.reply-to." for r in seen)
    assert len(set(seen)) == 1


def test_direct_reply_to_rpc_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            sch = await conn.channel()
            rpc_q = await sch.declare_queue(uniq("rpc"))

            async def on_request(msg: aio_pika.abc.AbstractIncomingMessage):
                async with msg.process():
                    await sch.default_exchange.publish(
                        aio_pika.Message(msg.body[::-1], correlation_id=msg.correlation_id),
                        routing_key=msg.reply_to)

            await rpc_q.consume(on_request)
            cch = await conn.channel()
            reply_q = await cch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            futures: dict[str, asyncio.Future] = {}

            async def on_reply(msg):
                futures.pop(msg.correlation_id).set_result(msg.body)

            await reply_q.consume(on_reply, no_ack=True)
            results = []
            for word in (b"abc", b"hello"):
                corr = str(uuid.uuid4())
                fut = futures[corr] = asyncio.get_running_loop().create_future()
                await cch.default_exchange.publish(
                    aio_pika.Message(word, reply_to="amq.rabbitmq.reply-to", correlation_id=corr),
                    routing_key=rpc_q.name)
                results.append(await asyncio.wait_for(fut, 5))
            assert results == [b"cba", b"olleh"]
    asyncio.run(main())


def test_reply_to_without_consuming_is_406(connect):
    ch = connect().channel()
    q = uniq("rpc")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(q, passive=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"


def test_reply_consumer_must_be_no_ack(connect):
    ch = connect().channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"


def test_reply_to_a_gone_requester_is_returned_when_mandatory(connect):
    conn = connect()
    requester = conn.channel()
    requester.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    q = uniq("rpc")
    requester.queue_declare(q)
    requester.basic_publish("", q, b"req", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    _m, p, _b = requester.basic_get(q, auto_ack=True)
    address = p.reply_to
    requester.close()
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", address, b"late reply", mandatory=True)
    ch.basic_publish("", address, b"late reply")  # not mandatory: dropped quietly


def test_reply_to_pseudo_queue_passive_declare(ch):
    assert ch.queue_declare("amq.rabbitmq.reply-to", passive=True).method.queue == "amq.rabbitmq.reply-to"


def test_capability_is_advertised(connect):
    conn = connect()
    assert conn._impl.server_properties["capabilities"]["direct_reply_to"] is True


# -- consumer timeout ------------------------------------------------------------------------------
# (over a real socket: what a client sees; the rule itself, basic.get and the broker default are
# tested sans-IO on a ManualClock in tests/connection/test_consumer_timeout.py)

def test_consumer_timeout_closes_the_channel_and_requeues(connect):
    conn = connect()
    q = uniq("ct")
    setup = conn.channel()
    setup.queue_declare(q, arguments={"x-consumer-timeout": 1000})
    setup.basic_publish("", q, b"slow")
    setup.basic_publish("", q, b"fast")

    closed = []
    slow = conn.channel()
    slow.basic_qos(prefetch_count=1)
    slow._impl.add_on_close_callback(lambda c, reason: closed.append(reason))
    held = []
    slow.basic_consume(q, lambda c, m, p, b: held.append(b))  # never acks
    assert _pump(conn, lambda: held == [b"slow"])

    fast = conn.channel()  # acks promptly: unaffected
    fast_got = []

    def on_fast(c, m, p, b):
        fast_got.append(b)
        c.basic_ack(m.delivery_tag)

    fast.basic_consume(q, on_fast)
    assert _pump(conn, lambda: closed, timeout=4)  # checked once a second
    reason = closed[0]
    assert reason.reply_code == 406
    assert reason.reply_text == TIMEOUT_TEXT.format(ch=slow.channel_number, ms=1000)
    # the held message went back and the other consumer got it, redelivered
    assert _pump(conn, lambda: fast_got == [b"fast", b"slow"])
    assert fast.is_open and conn.is_open


def test_invalid_consumer_timeout_is_406(ch):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uniq("ct"), arguments={"x-consumer-timeout": "soon"})
    assert exc.value.reply_code == 406
