"""Exchanges through real clients: declare/delete rules, e2e bindings, alternate exchanges,
auto-delete, internal exchanges, headers matching. Reply codes and texts are RabbitMQ 3.10's."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq.exceptions as amqe
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from eb_support import uniq

BUILTINS = [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
            ("amq.headers", "headers"), ("amq.match", "headers")]


def closed_by(exc_info) -> tuple[int, str]:
    return exc_info.value.reply_code, exc_info.value.reply_text


def drain(ch, queue: str) -> list[bytes]:
    """All ready messages of a queue, via basic.get with no_ack."""
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def sync(ch) -> None:
    """A round trip on the channel so asynchronous channel errors surface."""
    ch.basic_qos(prefetch_count=0)


# -- declare ------------------------------------------------------------------------------------

def test_declare_flags_arguments_and_passive(broker, channel):
    name = uniq("x")
    channel.exchange_declare(name, "topic", durable=True, auto_delete=False,
                             arguments={"alternate-exchange": "ae", "x-custom": 7})
    channel.exchange_declare(name, passive=True)  # any type/flags are ignored when passive
    channel.exchange_declare(name, "topic", durable=True, arguments={"alternate-exchange": "ae"})

    def state():
        ex = broker.broker.vhosts["/"].exchanges[name]
        return ex.type, ex.durable, ex.auto_delete, ex.internal, ex.alternate_exchange, dict(ex.arguments)

    assert broker.call(state) == ("topic", True, False, False, "ae",
                                  {"alternate-exchange": "ae", "x-custom": 7})
    internal = uniq("int")
    channel.exchange_declare(internal, "fanout", internal=True, auto_delete=True)
    channel.exchange_declare(internal, passive=True)
    assert broker.call(lambda: broker.broker.vhosts["/"].exchanges[internal].internal) is True
    channel.exchange_delete(name)
    channel.exchange_delete(internal)
    assert broker.call(lambda: {name, internal} & set(broker.broker.vhosts["/"].exchanges)) == set()


def test_redeclare_identical_is_ok_and_non_equivalence_args_are_ignored(channel):
    name = uniq("x")
    channel.exchange_declare(name, "direct")
    channel.exchange_declare(name, "direct")
    channel.exchange_declare(name, "direct", arguments={"x-anything": "else"})
    channel.exchange_delete(name)


@pytest.mark.parametrize("kwargs,text", [
    ({"exchange_type": "fanout"}, "inequivalent arg 'type' for exchange '{n}' in vhost '/': "
                                  "received 'fanout' but current is 'direct'"),
    ({"durable": True}, "inequivalent arg 'durable' for exchange '{n}' in vhost '/': "
                        "received 'true' but current is 'false'"),
    ({"auto_delete": True}, "inequivalent arg 'auto_delete' for exchange '{n}' in vhost '/': "
                            "received 'true' but current is 'false'"),
    ({"internal": True}, "inequivalent arg 'internal' for exchange '{n}' in vhost '/': "
                         "received 'true' but current is 'false'"),
    ({"arguments": {"alternate-exchange": "foo"}},
     "inequivalent arg 'alternate-exchange' for exchange '{n}' in vhost '/': "
     "received the value 'foo' of type 'longstr' but current is none"),
])
def test_redeclare_with_other_type_or_flags_is_406(connect, kwargs, text):
    conn = connect()
    ch = conn.channel()
    name = uniq("x")
    ch.exchange_declare(name, "direct")
    kwargs = {"exchange_type": "direct", **kwargs}
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(name, **kwargs)
    assert closed_by(ei) == (406, "PRECONDITION_FAILED - " + text.format(n=name))
    conn.channel().exchange_delete(name)


def test_builtin_exchanges_exist_and_are_protected(connect):
    conn = connect()
    ch = conn.channel()
    for name, xtype in BUILTINS:
        ch.exchange_declare(name, passive=True)
        ch.exchange_declare(name, xtype, durable=True)  # an equivalent redeclare is fine
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare("amq.direct", "fanout", durable=True)
    assert ei.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_delete("amq.topic")
    assert closed_by(ei) == (403, "ACCESS_REFUSED - deletion of system exchange 'amq.topic' in "
                                  "vhost '/' not allowed")


def test_default_exchange_routes_by_queue_name_and_refuses_declare_and_delete(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"via default")
    assert drain(ch, q) == [b"via default"]
    # RabbitMQ refuses every exchange operation on "" -- even a passive declare
    for op in (lambda c: c.exchange_declare("", passive=True),
               lambda c: c.exchange_declare("", "direct"),
               lambda c: c.exchange_delete(""),
               lambda c: c.queue_bind(q, "", "k")):
        ch = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as ei:
            op(ch)
        assert closed_by(ei) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_amq_prefix_is_reserved(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare("amq.custom", "direct")
    assert closed_by(ei) == (403, "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved "
                                  "prefix 'amq.*'")


def test_passive_declare_of_missing_exchange_is_404(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare("no-such-exchange", passive=True)
    assert closed_by(ei) == (404, "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'")


def test_unknown_exchange_type_closes_the_connection_503(pika_conn, channel):
    with pytest.raises(ConnectionClosedByBroker) as ei:
        channel.exchange_declare(uniq("x"), "no-such-type")
    assert closed_by(ei) == (503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")
    assert not pika_conn.is_open


# -- delete ------------------------------------------------------------------------------------

def test_delete_if_unused(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("x")
    ch.exchange_declare(name, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_delete(name, if_unused=True)
    assert closed_by(ei) == (406, f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use")
    ch = conn.channel()
    ch.exchange_declare(name, passive=True)  # still there
    ch.queue_unbind(q, name)
    ch.exchange_delete(name, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(name, passive=True)
    assert ei.value.reply_code == 404


def test_delete_used_exchange_drops_its_bindings_and_missing_delete_is_ok(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("x")
    ch.exchange_declare(name, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name)
    ch.exchange_delete(name)
    ch.exchange_delete(name)  # RabbitMQ: deleting a missing exchange succeeds
    ch.exchange_declare(name, "fanout")  # the name is reusable and the old binding is gone
    ch.basic_publish(name, "", b"x")
    assert drain(ch, q) == []
    ch.exchange_delete(name)


# -- exchange-to-exchange bindings ----------------------------------------------------------

def test_exchange_to_exchange_chain_routes_and_unbind_breaks_it(connect):
    conn = connect()
    ch = conn.channel()
    e1, e2, e3 = uniq("e1"), uniq("e2"), uniq("e3")
    ch.exchange_declare(e1, "direct")
    ch.exchange_declare(e2, "topic")
    ch.exchange_declare(e3, "fanout")
    ch.exchange_bind(destination=e2, source=e1, routing_key="a.b")
    ch.exchange_bind(destination=e3, source=e2, routing_key="a.*")
    qa = ch.queue_declare("", exclusive=True).method.queue
    qb = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(qa, e3)
    ch.queue_bind(qb, e2, "#")
    ch.basic_publish(e1, "a.b", b"m1")   # e1 -> e2 -> (e3 -> qa, qb)
    ch.basic_publish(e1, "a.c", b"m2")   # no e1 binding for a.c
    ch.basic_publish(e2, "a.c", b"m3")   # e2 -> e3 -> qa, and qb
    ch.basic_publish(e2, "x.y.z", b"m4")  # e2 -> qb only
    assert drain(ch, qa) == [b"m1", b"m3"]
    assert drain(ch, qb) == [b"m1", b"m3", b"m4"]
    ch.exchange_unbind(destination=e3, source=e2, routing_key="a.*")
    ch.exchange_unbind(destination=e3, source=e2, routing_key="a.*")  # absent binding: still ok
    ch.basic_publish(e1, "a.b", b"m5")
    assert drain(ch, qa) == []
    assert drain(ch, qb) == [b"m5"]
    for e in (e1, e2, e3):
        ch.exchange_delete(e)


def test_exchange_binding_cycle_delivers_each_message_once(connect):
    conn = connect()
    ch = conn.channel()
    e1, e2 = uniq("c1"), uniq("c2")
    ch.exchange_declare(e1, "fanout")
    ch.exchange_declare(e2, "fanout")
    ch.exchange_bind(e2, e1)
    ch.exchange_bind(e1, e2)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, e1)
    ch.queue_bind(q, e2)
    ch.basic_publish(e1, "", b"once")
    ch.basic_publish(e2, "", b"twice?")
    assert drain(ch, q) == [b"once", b"twice?"]
    ch.exchange_delete(e1)
    ch.exchange_delete(e2)


def test_exchange_bind_to_missing_exchange_is_404(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("x")
    ch.exchange_declare(name, "fanout")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_bind(destination=name, source="no-such-src")
    assert closed_by(ei) == (404, "NOT_FOUND - no exchange 'no-such-src' in vhost '/'")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_bind(destination="no-such-dst", source=name)
    assert closed_by(ei) == (404, "NOT_FOUND - no exchange 'no-such-dst' in vhost '/'")
    conn.channel().exchange_delete(name)


def test_exchange_to_exchange_with_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            src = await ch.declare_exchange(uniq("src"), aio_pika.ExchangeType.TOPIC)
            dst = await ch.declare_exchange(uniq("dst"), aio_pika.ExchangeType.DIRECT)
            await dst.bind(src, routing_key="orders.eu")
            q = await ch.declare_queue(exclusive=True)
            await q.bind(dst, routing_key="orders.eu")
            await src.publish(aio_pika.Message(b"routed"), routing_key="orders.eu")
            await src.publish(aio_pika.Message(b"dropped"), routing_key="orders.us")
            msg = await q.get(timeout=5, no_ack=True)
            assert msg.body == b"routed"
            assert await q.get(fail=False) is None
            await dst.unbind(src, routing_key="orders.eu")
            await src.publish(aio_pika.Message(b"after unbind"), routing_key="orders.eu")
            assert await q.get(fail=False) is None
            await src.delete()
            await dst.delete()
    asyncio.run(main())


# -- publishing ------------------------------------------------------------------------------

def test_publish_to_internal_exchange_is_403_but_e2e_routing_reaches_it(connect):
    conn = connect()
    ch = conn.channel()
    front, inner = uniq("front"), uniq("inner")
    ch.exchange_declare(front, "fanout")
    ch.exchange_declare(inner, "fanout", internal=True)
    ch.exchange_bind(destination=inner, source=front)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, inner)
    ch.basic_publish(front, "", b"through front")
    assert drain(ch, q) == [b"through front"]
    ch.basic_publish(inner, "", b"direct to internal")
    with pytest.raises(ChannelClosedByBroker) as ei:
        sync(ch)
    assert closed_by(ei) == (403, f"ACCESS_REFUSED - cannot publish to internal exchange '{inner}' "
                                  f"in vhost '/'")
    ch = conn.channel()
    assert drain(ch, q) == []
    ch.exchange_delete(front)
    ch.exchange_delete(inner)


def test_publish_to_missing_exchange_is_404(channel):
    channel.basic_publish("no-such-exchange", "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        sync(channel)
    assert closed_by(ei) == (404, "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'")


def test_publish_to_missing_exchange_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            with pytest.raises(amqe.ChannelNotFoundEntity) as ei:
                await ch.get_exchange("no-such-exchange", ensure=True)
            assert ei.value.args[0] == "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
            ch = await conn.channel()
            ex = await ch.get_exchange("no-such-exchange", ensure=False)
            with pytest.raises(amqe.ChannelNotFoundEntity):
                await ex.publish(aio_pika.Message(b"x"), routing_key="k")
    asyncio.run(main())


# -- alternate exchanges -------------------------------------------------------------------

def test_alternate_exchange_catches_unroutable_messages(connect):
    conn = connect()
    ch = conn.channel()
    main, ae = uniq("main"), uniq("ae")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    routed = ch.queue_declare("", exclusive=True).method.queue
    caught = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(routed, main, "known")
    ch.queue_bind(caught, ae)
    returns = []
    ch.add_on_return_callback(lambda *args: returns.append(args))
    ch.basic_publish(main, "known", b"ok")
    ch.basic_publish(main, "unknown", b"stray", mandatory=True)  # the AE routes it: no return
    conn.process_data_events(0.1)
    assert drain(ch, routed) == [b"ok"]
    assert drain(ch, caught) == [b"stray"]
    assert returns == []
    ch.exchange_delete(main)
    ch.exchange_delete(ae)


def test_alternate_exchange_that_does_not_route_or_exist_leaves_message_unroutable(connect):
    conn = connect()
    ch = conn.channel()
    main, ae = uniq("main"), uniq("ae")
    ch.exchange_declare(ae, "direct")  # nothing bound
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    missing = uniq("main2")
    ch.exchange_declare(missing, "direct", arguments={"alternate-exchange": "no-such-ae"})
    returns = []
    ch.add_on_return_callback(lambda _c, method, _p, body: returns.append((method.reply_code, body)))
    ch.basic_publish(main, "k", b"one", mandatory=True)
    ch.basic_publish(missing, "k", b"two", mandatory=True)
    deadline = time.monotonic() + 5
    while len(returns) < 2 and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    assert returns == [(312, b"one"), (312, b"two")]
    for e in (main, ae, missing):
        ch.exchange_delete(e)


def test_alternate_exchange_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel(on_return_raises=True)
            ae = await ch.declare_exchange(uniq("ae"), aio_pika.ExchangeType.FANOUT)
            ex = await ch.declare_exchange(uniq("main"), aio_pika.ExchangeType.TOPIC,
                                           arguments={"alternate-exchange": ae.name})
            q = await ch.declare_queue(exclusive=True)
            await q.bind(ae)
            confirm = await ex.publish(aio_pika.Message(b"nobody"), routing_key="a.b", mandatory=True)
            assert confirm.name == "Basic.Ack"
            msg = await q.get(timeout=5, no_ack=True)
            assert msg.body == b"nobody" and msg.exchange == ex.name and msg.routing_key == "a.b"
            await ex.delete()
            await ae.delete()
    asyncio.run(main())


# -- auto-delete ---------------------------------------------------------------------------------

def exists(conn, name: str) -> bool:
    ch = conn.channel()
    try:
        ch.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    ch.close()
    return True


def test_auto_delete_exchange_goes_with_its_last_binding(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("ad")
    ch.exchange_declare(name, "direct", auto_delete=True)
    assert exists(conn, name)  # never bound: stays
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, name, "a")
    ch.queue_bind(q2, name, "b")
    ch.queue_unbind(q1, name, "a")
    assert exists(conn, name)  # one binding left
    ch.queue_unbind(q2, name, "b")
    assert not exists(conn, name)


def test_auto_delete_exchange_goes_when_its_last_bound_queue_is_deleted(connect):
    conn = connect()
    ch = conn.channel()
    name, q = uniq("ad"), uniq("adq")
    ch.exchange_declare(name, "fanout", auto_delete=True)
    ch.queue_declare(q)
    ch.queue_bind(q, name)
    ch.queue_delete(q)
    assert not exists(conn, name)


def test_auto_delete_exchange_as_e2e_source_and_destination(connect):
    conn = connect()
    ch = conn.channel()
    src, other = uniq("ad-src"), uniq("other")
    ch.exchange_declare(src, "fanout", auto_delete=True)
    ch.exchange_declare(other, "fanout")
    ch.exchange_bind(destination=other, source=src)
    ch.exchange_unbind(destination=other, source=src)
    assert not exists(conn, src)  # it was the source of its last binding
    dst = uniq("ad-dst")
    ch.exchange_declare(dst, "fanout", auto_delete=True)
    ch.exchange_bind(destination=dst, source=other)
    ch.exchange_unbind(destination=dst, source=other)
    assert exists(conn, dst)  # only bindings *from* an exchange count, as in RabbitMQ
    ch.exchange_delete(dst)
    ch.exchange_delete(other)


def test_auto_delete_exchange_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(uniq("ad"), aio_pika.ExchangeType.TOPIC, auto_delete=True)
            q = await ch.declare_queue(exclusive=True)
            await q.bind(ex, "a.#")
            await ch.get_exchange(ex.name, ensure=True)
            await q.unbind(ex, "a.#")
            with pytest.raises(amqe.ChannelNotFoundEntity):
                await ch.get_exchange(ex.name, ensure=True)
    asyncio.run(main())


# -- headers exchange ---------------------------------------------------------------------------

def test_headers_exchange_all_and_any_with_pika(connect):
    conn = connect()
    ch = conn.channel()
    q_all = ch.queue_declare("", exclusive=True).method.queue
    q_any = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_all, "amq.headers", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, "amq.headers", arguments={"x-match": "any", "format": "zip", "type": "log"})

    def pub(body: bytes, headers: dict | None) -> None:
        ch.basic_publish("amq.headers", "ignored", body, pika.BasicProperties(headers=headers))

    pub(b"both", {"format": "pdf", "type": "report"})
    pub(b"extra", {"format": "pdf", "type": "report", "x": 1})
    pub(b"half", {"format": "pdf", "type": "log"})
    pub(b"zip", {"format": "zip"})
    pub(b"none", {"other": "x"})
    pub(b"noheaders", None)
    assert drain(ch, q_all) == [b"both", b"extra"]
    assert drain(ch, q_any) == [b"half", b"zip"]
    ch.queue_unbind(q_all, "amq.headers", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    pub(b"again", {"format": "pdf", "type": "report"})
    assert drain(ch, q_all) == []


def test_headers_exchange_all_and_any_with_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(uniq("hdr"), aio_pika.ExchangeType.HEADERS)
            q_all = await ch.declare_queue(exclusive=True)
            q_any = await ch.declare_queue(exclusive=True)
            await q_all.bind(ex, arguments={"x-match": "all", "level": "error", "app": "web"})
            await q_any.bind(ex, arguments={"x-match": "any", "level": "error", "app": "web"})
            for body, headers in ((b"e-web", {"level": "error", "app": "web"}),
                                  (b"e-db", {"level": "error", "app": "db"}),
                                  (b"i-web", {"level": "info", "app": "web"}),
                                  (b"i-db", {"level": "info", "app": "db"})):
                await ex.publish(aio_pika.Message(body, headers=headers), routing_key="")

            async def bodies(q):
                out = []
                while (m := await q.get(fail=False, no_ack=True)) is not None:
                    out.append(m.body)
                return out

            assert await bodies(q_all) == [b"e-web"]
            assert await bodies(q_any) == [b"e-web", b"e-db", b"i-web"]
            await ex.delete()
    asyncio.run(main())


def test_builtin_exchanges_in_a_second_vhost(broker, connect):
    broker.call(lambda: broker.broker.add_vhost("xv2"))
    broker.call(lambda: broker.broker.set_permissions("guest", "xv2", ".*", ".*", ".*"))
    conn = connect("xv2")
    ch = conn.channel()
    for name, _ in BUILTINS:
        ch.exchange_declare(name, passive=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.fanout")
    ch.basic_publish("amq.fanout", "", b"in xv2")
    assert drain(ch, q) == [b"in xv2"]


# -- the same rules through aio-pika ---------------------------------------------------------

def test_passive_and_redeclare_mismatch_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            name = uniq("x")
            ex = await ch.declare_exchange(name, aio_pika.ExchangeType.DIRECT, durable=True)
            same = await ch.declare_exchange(name, passive=True)
            assert same.name == name
            with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                await (await conn.channel()).declare_exchange(name, aio_pika.ExchangeType.TOPIC,
                                                              durable=True)
            assert ei.value.args[0] == (f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange "
                                        f"'{name}' in vhost '/': received 'topic' but current is 'direct'")
            with pytest.raises(amqe.ChannelNotFoundEntity):
                await (await conn.channel()).declare_exchange("no-such-exchange", passive=True)
            await ex.delete()
    asyncio.run(main())


def test_reserved_and_builtin_exchanges_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            for name, _ in BUILTINS:
                await ch.get_exchange(name, ensure=True)
            with pytest.raises(amqe.ChannelAccessRefused) as ei:
                await ch.declare_exchange("amq.mine", aio_pika.ExchangeType.FANOUT)
            assert ei.value.args[0] == "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'"
            ch = await conn.channel()
            with pytest.raises(amqe.ChannelAccessRefused):
                await (await ch.get_exchange("amq.fanout")).delete()
    asyncio.run(main())


def test_delete_if_unused_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(uniq("x"), aio_pika.ExchangeType.FANOUT)
            q = await ch.declare_queue(exclusive=True)
            await q.bind(ex)
            with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                await (await (await conn.channel()).get_exchange(ex.name)).delete(if_unused=True)
            assert ei.value.args[0] == f"PRECONDITION_FAILED - exchange '{ex.name}' in vhost '/' in use"
            await q.unbind(ex)
            await ex.delete(if_unused=True)
            with pytest.raises(amqe.ChannelNotFoundEntity):
                await (await conn.channel()).get_exchange(ex.name, ensure=True)
    asyncio.run(main())


def test_publish_to_internal_exchange_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(uniq("int"), aio_pika.ExchangeType.FANOUT, internal=True)
            underlay = await ch.get_underlay_channel()  # aio-pika itself refuses internal exchanges
            with pytest.raises(amqe.ChannelAccessRefused) as ei:
                await underlay.basic_publish(b"x", exchange=ex.name, routing_key="")
            assert ei.value.args[0] == (f"ACCESS_REFUSED - cannot publish to internal exchange "
                                        f"'{ex.name}' in vhost '/'")
            await (await (await conn.channel()).get_exchange(ex.name)).delete()
    asyncio.run(main())


def test_unknown_exchange_type_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        try:
            ch = await conn.channel()
            with pytest.raises(amqe.ConnectionCommandInvalid) as ei:
                await ch.declare_exchange(uniq("x"), "no-such-type")
            assert ei.value.args[0] == "COMMAND_INVALID - unknown exchange type 'no-such-type'"
        finally:
            await conn.close()
    asyncio.run(main())
