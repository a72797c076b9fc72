"""Queues through real clients: declare rules, exclusivity, auto-delete, server-named queues,
bind/unbind, purge and delete. Reply codes and texts are RabbitMQ 3.10's."""

from __future__ import annotations

import asyncio
import re

import aio_pika
import aiormq.exceptions as amqe
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker

from eb_support import RawClient, uniq, wait_until

GEN_NAME = re.compile(r"^amq\.gen-[A-Za-z0-9_-]{22}$")


def locked_text(name: str) -> str:
    return (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. "
            f"It could be originally declared on another connection or the exclusive property value "
            f"does not match that of the original declaration.")


def queue_state(conn, name: str):
    """(message_count, consumer_count) from a passive declare, or None when the queue is gone."""
    ch = conn.channel()
    try:
        ok = ch.queue_declare(name, passive=True).method
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return None
    ch.close()
    return ok.message_count, ok.consumer_count


# -- declare ------------------------------------------------------------------------------------

def test_declare_ok_reports_name_and_counts(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ok = ch.queue_declare(name).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    for i in range(3):
        ch.basic_publish("", name, b"m%d" % i)
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(name, lambda *a: None)  # takes one message, leaves it unacked
    conn.process_data_events(0.05)
    other = connect().channel()
    ok = other.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 2, 1)  # ready only, not unacked
    ok = other.queue_declare(name).method  # an equivalent redeclare reports the same
    assert (ok.message_count, ok.consumer_count) == (2, 1)
    other.queue_delete(name)


def test_passive_declare_of_missing_queue_is_404(channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("no-such-queue", passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, "NOT_FOUND - no queue 'no-such-queue' in vhost '/'")


def test_durable_queue_flags_are_recorded(broker, channel):
    name = uniq("dq")
    channel.queue_declare(name, durable=True, arguments={"x-max-length": 5})
    q = broker.call(lambda: broker.broker.vhosts["/"].queues[name])
    assert (q.durable, q.exclusive, q.auto_delete, q.arguments) == (True, False, False, {"x-max-length": 5})
    channel.queue_delete(name)


def test_server_named_queue(connect):
    conn = connect()
    ch = conn.channel()
    names = {ch.queue_declare("", exclusive=True).method.queue for _ in range(5)}
    assert len(names) == 5 and all(GEN_NAME.match(n) for n in names)
    name = names.pop()
    ok = ch.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    # RabbitMQ: an explicit non-passive declare of an amq.* name is refused even when it exists
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(name, exclusive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare("amq.mine")
    assert ei.value.reply_code == 403


def test_server_named_queue_is_the_channels_default_queue(connect):
    conn = connect()
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind("", "amq.direct", "rk")  # "" means the last queue declared on this channel
    ch.queue_bind("", "amq.direct")         # ... and an empty routing key then means its name
    ch.basic_publish("amq.direct", "rk", b"a")
    ch.basic_publish("amq.direct", name, b"b")
    assert queue_state(conn, name) == (2, 0)
    ch2 = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.queue_bind("", "amq.direct", "x")
    assert ei.value.reply_code == 404


@pytest.mark.parametrize("kwargs,code,text", [
    ({"durable": True}, 406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{n}' in vhost "
                             "'/': received 'true' but current is 'false'"),
    ({"auto_delete": True}, 406, "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{n}' in "
                                 "vhost '/': received 'true' but current is 'false'"),
    ({"exclusive": True}, 405, None),  # RabbitMQ checks exclusivity first, with 405
    ({"arguments": {"x-max-length": 11}}, 406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' "
                                               "for queue '{n}' in vhost '/': received '11' but current is '10'"),
    ({"arguments": {}}, 406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{n}' in "
                             "vhost '/': received none but current is the value '10' of type 'signedint'"),
    ({"arguments": {"x-max-length": 10, "x-dead-letter-exchange": "dlx"}}, 406,
     "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue '{n}' in vhost '/': "
     "received the value 'dlx' of type 'longstr' but current is none"),
])
def test_redeclare_with_other_flags_or_args_fails(connect, kwargs, code, text):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name, arguments={"x-max-length": 10})
    ch.queue_declare(name, arguments={"x-max-length": 10, "x-not-checked": 1})  # fine
    kwargs = {"arguments": {"x-max-length": 10}, **kwargs}
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(name, **kwargs)
    assert ei.value.reply_code == code
    assert ei.value.reply_text == (text.format(n=name) if text else locked_text(name))
    conn.channel().queue_delete(name)


def test_redeclare_mismatch_with_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            name = uniq("q")
            q = await ch.declare_queue(name, durable=True)
            ch2 = await conn.channel()
            with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                await ch2.declare_queue(name, durable=False)
            assert ei.value.args[0] == (f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                                        f"'{name}' in vhost '/': received 'false' but current is 'true'")
            same = await ch.declare_queue(name, durable=True)
            assert same.name == name
            await q.delete()
    asyncio.run(main())


# -- exclusive queues ---------------------------------------------------------------------------

def test_exclusive_queue_is_locked_to_its_connection(connect):
    owner = connect()
    och = owner.channel()
    name = uniq("excl")
    och.queue_declare(name, exclusive=True)
    och.queue_bind(name, "amq.direct", "bound")
    for i in range(2):
        och.basic_publish("", name, b"%d" % i)
    other = connect()
    attempts = {
        "declare": lambda ch: ch.queue_declare(name, exclusive=True),
        "declare-nonexclusive": lambda ch: ch.queue_declare(name),
        "passive": lambda ch: ch.queue_declare(name, passive=True),
        "consume": lambda ch: ch.basic_consume(name, lambda *a: None),
        "get": lambda ch: ch.basic_get(name),
        "bind": lambda ch: ch.queue_bind(name, "amq.direct", "k"),
        "unbind-existing": lambda ch: ch.queue_unbind(name, "amq.direct", "bound"),
        "purge": lambda ch: ch.queue_purge(name),
        "delete": lambda ch: ch.queue_delete(name),
    }
    for what, attempt in attempts.items():
        ch = other.channel()
        with pytest.raises(ChannelClosedByBroker) as ei:
            attempt(ch)
        assert (what, ei.value.reply_code, ei.value.reply_text) == (what, 405, locked_text(name))
    # unbinding a binding that does not exist is a no-op, as in RabbitMQ
    other.channel().queue_unbind(name, "amq.direct", "never-bound")
    # the owner, on any of its channels, has full access
    och2 = owner.channel()
    assert och2.queue_declare(name, exclusive=True).method.message_count == 2
    assert och2.queue_purge(name).method.message_count == 2
    # the owner must declare it exclusive too (strict check, 405)
    with pytest.raises(ChannelClosedByBroker) as ei:
        owner.channel().queue_declare(name)
    assert ei.value.reply_code == 405
    owner.close()
    assert wait_until(lambda: queue_state(other, name) is None)


def test_exclusive_queue_goes_when_connection_closes_aio_pika(broker, connect):
    observer = connect()

    async def main():
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        q = await ch.declare_queue(exclusive=True)
        assert GEN_NAME.match(q.name)
        named = await ch.declare_queue(uniq("excl"), exclusive=True)
        with pytest.raises(ChannelClosedByBroker) as ei:
            observer.channel().queue_declare(named.name, passive=True)
        assert ei.value.reply_code == 405
        await conn.close()
        return q.name, named.name

    names = asyncio.run(main())
    for name in names:
        assert wait_until(lambda: queue_state(observer, name) is None)


def test_exclusive_queue_goes_when_socket_drops(broker, connect):
    raw = RawClient(broker.port)
    name = uniq("excl")
    raw.send(1, commands.Channel.Open())
    raw.expect(commands.Channel.OpenOk)
    raw.send(1, commands.Queue.Declare(queue=name, exclusive=True))
    raw.expect(commands.Queue.DeclareOk)
    observer = connect()
    with pytest.raises(ChannelClosedByBroker) as ei:
        observer.channel().queue_declare(name, passive=True)
    assert ei.value.reply_code == 405
    raw.sock.close()  # no connection.close: the TCP connection just goes away
    assert wait_until(lambda: queue_state(observer, name) is None)


# -- auto-delete ---------------------------------------------------------------------------------

def test_auto_delete_queue_goes_when_last_consumer_cancels(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("ad")
    ch.queue_declare(name, auto_delete=True)
    assert queue_state(conn, name) == (0, 0)  # never consumed from: stays
    t1 = ch.basic_consume(name, lambda *a: None)
    t2 = ch.basic_consume(name, lambda *a: None)
    ch.basic_cancel(t1)
    assert queue_state(conn, name) == (0, 1)
    ch.basic_cancel(t2)
    assert queue_state(conn, name) is None


def test_auto_delete_queue_goes_when_consumer_channel_closes(connect):
    conn = connect()
    name = uniq("ad")
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True)
    ch.basic_consume(name, lambda *a: None)
    ch2 = conn.channel()
    ch2.basic_consume(name, lambda *a: None)
    ch.close()
    assert queue_state(conn, name) == (0, 1)
    ch2.close()
    assert queue_state(conn, name) is None


def test_auto_delete_queue_aio_pika(broker, connect):
    observer = connect()

    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("ad"), auto_delete=True)
            async def ignore(message):
                pass

            tag = await q.consume(ignore)
            assert queue_state(observer, q.name) == (0, 1)
            await q.cancel(tag)
            return q.name

    name = asyncio.run(main())
    assert wait_until(lambda: queue_state(observer, name) is None)


# -- bind / unbind ------------------------------------------------------------------------------

def test_bind_and_unbind(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name)
    ch.queue_bind(name, "amq.topic", "a.*")
    ch.queue_bind(name, "amq.topic", "a.*")  # idempotent
    ch.queue_bind(name, "amq.topic", "#.z")
    ch.basic_publish("amq.topic", "a.b", b"1")
    ch.basic_publish("amq.topic", "a.z", b"2")  # both bindings match: still one copy
    ch.basic_publish("amq.topic", "b.b", b"3")
    assert queue_state(conn, name) == (2, 0)
    ch.queue_unbind(name, "amq.topic", "a.*")
    ch.basic_publish("amq.topic", "a.b", b"4")
    assert queue_state(conn, name) == (2, 0)
    ch.queue_unbind(name, "amq.topic", "never-bound")  # no-op
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(name, "no-such-exchange", "k")
    assert ei.value.reply_text == "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind("no-such-queue", "amq.topic", "k")
    assert ei.value.reply_text == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"
    conn.channel().queue_delete(name)


def test_bind_unbind_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            ex = await ch.get_exchange("amq.direct")
            await q.bind(ex, "red")
            await ex.publish(aio_pika.Message(b"r1"), routing_key="red")
            await ex.publish(aio_pika.Message(b"b1"), routing_key="blue")
            await q.unbind(ex, "red")
            await ex.publish(aio_pika.Message(b"r2"), routing_key="red")
            msg = await q.get(no_ack=True, timeout=5)
            assert msg.body == b"r1"
            assert await q.get(fail=False) is None
    asyncio.run(main())


# -- purge / delete -------------------------------------------------------------------------

def test_purge_reports_count_and_leaves_unacked_alone(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name)
    for i in range(5):
        ch.basic_publish("", name, b"%d" % i)
    method, _, body = ch.basic_get(name)
    assert body == b"0"
    assert ch.queue_purge(name).method.message_count == 4
    assert ch.queue_purge(name).method.message_count == 0
    ch.basic_nack(method.delivery_tag, requeue=True)  # the unacked one survives the purge
    assert queue_state(conn, name) == (1, 0)
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().queue_purge("no-such-queue")
    assert ei.value.reply_code == 404
    ch.queue_delete(name)


def test_delete_if_unused_and_if_empty(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name)
    ch.basic_publish("", name, b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_delete(name, if_empty=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - queue '{name}' in vhost '/' not empty")
    ch = conn.channel()
    tag = ch.basic_consume(name, lambda *a: None, auto_ack=True)
    conn.process_data_events(0.05)
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().queue_delete(name, if_unused=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use")
    ch.basic_cancel(tag)
    assert ch.queue_delete(name, if_unused=True, if_empty=True).method.message_count == 0
    assert queue_state(conn, name) is None


def test_delete_ok_counts_ready_messages_and_missing_delete_is_ok(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name)
    for i in range(4):
        ch.basic_publish("", name, b"%d" % i)
    method, _, _ = ch.basic_get(name)  # one unacked: not counted
    assert ch.queue_delete(name).method.message_count == 3
    assert ch.queue_delete(name).method.message_count == 0  # missing: ok, count 0
    ch.basic_ack(method.delivery_tag)  # acking a message of a deleted queue is fine
    assert queue_state(conn, name) is None


def test_queue_name_reuse_after_delete(connect):
    conn = connect()
    ch = conn.channel()
    name = uniq("q")
    ch.queue_declare(name, durable=True, arguments={"x-max-length": 3})
    ch.queue_bind(name, "amq.fanout")
    ch.basic_publish("", name, b"old")
    ch.queue_delete(name)
    ok = ch.queue_declare(name, auto_delete=True).method  # other flags and args are fine now
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    ch.basic_publish("amq.fanout", "", b"not bound any more")
    ch.basic_publish("", name, b"new")
    assert ch.basic_get(name, auto_ack=True)[2] == b"new"
    assert ch.basic_get(name)[0] is None
    ch.queue_delete(name)


def test_purge_and_delete_aio_pika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("q"))
            for i in range(7):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
            purged = await q.purge()
            assert purged.message_count == 7
            await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=q.name)
            async with await aio_pika.connect(broker.url) as conn2:
                q2 = await (await conn2.channel()).get_queue(q.name)
                with pytest.raises(amqe.ChannelPreconditionFailed):
                    await q2.delete(if_unused=False, if_empty=True)
            deleted = await q.delete(if_unused=False, if_empty=False)
            assert deleted.message_count == 1
    asyncio.run(main())


# -- the same rules through aio-pika ---------------------------------------------------------

def test_exclusive_queue_locked_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as owner, \
                await aio_pika.connect(broker.url) as other:
            q = await (await owner.channel()).declare_queue(uniq("excl"), exclusive=True)
            attempts = (
                lambda ch: ch.declare_queue(q.name, exclusive=True),
                lambda ch: ch.declare_queue(q.name, passive=True),
                lambda ch: _get(ch, q.name),
                lambda ch: _purge(ch, q.name),
            )
            for attempt in attempts:
                ch = await other.channel()
                with pytest.raises(amqe.ChannelLockedResource) as ei:
                    await attempt(ch)
                assert ei.value.args[0] == locked_text(q.name)

    async def _get(ch, name):
        return await (await ch.get_queue(name, ensure=False)).get(fail=False)

    async def _purge(ch, name):
        return await (await ch.get_queue(name, ensure=False)).purge()

    asyncio.run(main())


def test_declare_ok_counts_and_server_names_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            assert GEN_NAME.match(q.name)
            for i in range(4):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)

            async def ignore(message):
                pass

            await ch.set_qos(prefetch_count=1)
            await q.consume(ignore)
            again = await ch.declare_queue(q.name, passive=True)
            result = again.declaration_result
            assert (result.queue, result.message_count, result.consumer_count) == (q.name, 3, 1)
    asyncio.run(main())


def test_amq_prefix_is_reserved_for_queues_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            with pytest.raises(amqe.ChannelAccessRefused) as ei:
                await ch.declare_queue("amq.mine")
            assert ei.value.args[0] == "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'"
    asyncio.run(main())
