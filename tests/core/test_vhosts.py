"""Virtual hosts and the default user: connection.open rules and isolation between vhosts.
Reply codes and texts are RabbitMQ 3.10's."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions as amqe
import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError, ProbableAuthenticationError

from eb_support import RawClient


def params(broker, vhost: str = "/", user: str = "guest", password: str = "guest"):
    return pika.ConnectionParameters("127.0.0.1", broker.port, virtual_host=vhost, heartbeat=0,
                                     credentials=pika.PlainCredentials(user, password),
                                     connection_attempts=1)


@pytest.fixture
def v2(broker):
    """A second vhost 'v2' with full permissions for guest."""
    broker.call(lambda: broker.broker.add_vhost("v2"))
    broker.call(lambda: broker.broker.set_permissions("guest", "v2", ".*", ".*", ".*"))
    return "v2"


def open_raw(port: int, vhost: str, user: str = "guest", password: str = "guest"):
    """Handshake over a plain socket; returns the frame answering connection.open (or the
    connection.close that refused the login)."""
    raw = RawClient(port, handshake=False)
    try:
        reply = raw.handshake(vhost=vhost, user=user, password=password)
        if raw.tune is None:  # login refused: nothing more to say
            return reply
        if isinstance(reply, commands.Connection.Close):
            raw.send(0, commands.Connection.CloseOk())
        else:
            raw.close_connection()
        return reply
    finally:
        raw.close()


# -- connection.open ---------------------------------------------------------------------------

def test_unknown_vhost_is_530_not_allowed(broker):
    reply = open_raw(broker.port, "no-such-vhost")
    assert isinstance(reply, commands.Connection.Close)
    assert (reply.reply_code, reply.reply_text, reply.class_id, reply.method_id) == (
        530, "NOT_ALLOWED - vhost no-such-vhost not found", 10, 40)
    with pytest.raises(ProbableAccessDeniedError) as ei:
        pika.BlockingConnection(params(broker, "no-such-vhost"))
    assert "(530) 'NOT_ALLOWED - vhost no-such-vhost not found'" in str(ei.value)


def test_unknown_vhost_aio_pika(broker):
    async def main():
        with pytest.raises(Exception) as ei:
            await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/no-such-vhost")
        assert isinstance(ei.value, (amqe.AMQPError, ConnectionError))
    asyncio.run(main())


def test_vhost_without_permissions_is_530(broker):
    broker.call(lambda: broker.broker.add_vhost("locked"))
    reply = open_raw(broker.port, "locked")
    assert (reply.reply_code, reply.reply_text) == (
        530, "NOT_ALLOWED - access to vhost 'locked' refused for user 'guest'")


def test_default_vhost_and_guest_user_exist(broker, connect):
    def state():
        b = broker.broker
        return ("/" in b.vhosts, "guest" in b.users, "administrator" in b.users["guest"].tags,
                b.permissions[("guest", "/")])

    assert broker.call(state) == (True, True, True, (".*", ".*", ".*"))
    assert isinstance(open_raw(broker.port, "/"), commands.Connection.OpenOk)
    conn = connect()  # pika defaults: guest/guest on "/"
    assert conn.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_wrong_password_or_unknown_user_is_403(broker):
    for user, password in (("guest", "wrong"), ("nobody", "guest")):
        reply = open_raw(broker.port, "/", user, password)
        assert (reply.reply_code, reply.reply_text) == (
            403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                 "For details see the broker logfile.")
    with pytest.raises(ProbableAuthenticationError):
        pika.BlockingConnection(params(broker, "/", "guest", "wrong"))


def test_default_vhost_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"hi"), routing_key=q.name)
            assert (await q.get(no_ack=True)).body == b"hi"
    asyncio.run(main())


# -- isolation ---------------------------------------------------------------------------------

def test_second_vhost_isolates_queues(broker, connect, v2):
    root, other = connect("/"), connect(v2)
    rch, och = root.channel(), other.channel()
    rch.queue_declare("shared", durable=True)
    och.queue_declare("shared", auto_delete=True, arguments={"x-max-length": 9})  # no clash
    rch.basic_publish("", "shared", b"root")
    for body in (b"v2-a", b"v2-b"):
        och.basic_publish("", "shared", body)
    assert rch.queue_declare("shared", passive=True).method.message_count == 1
    assert och.queue_declare("shared", passive=True).method.message_count == 2
    assert rch.basic_get("shared", auto_ack=True)[2] == b"root"
    assert och.basic_get("shared", auto_ack=True)[2] == b"v2-a"
    och.queue_declare("only-in-v2")
    with pytest.raises(ChannelClosedByBroker) as ei:
        rch.queue_declare("only-in-v2", passive=True)
    assert ei.value.reply_text == "NOT_FOUND - no queue 'only-in-v2' in vhost '/'"
    with pytest.raises(ChannelClosedByBroker) as ei:
        och.queue_declare("nope", passive=True)
    assert ei.value.reply_text == "NOT_FOUND - no queue 'nope' in vhost 'v2'"
    och = other.channel()
    rch = root.channel()
    och.queue_delete("shared")
    assert rch.queue_declare("shared", passive=True).method.message_count == 0  # "/" one untouched
    rch.queue_delete("shared")
    och.queue_delete("only-in-v2")
    assert broker.call(lambda: (sorted(broker.broker.vhosts["/"].queues),
                                sorted(broker.broker.vhosts["v2"].queues))) == ([], [])


def test_second_vhost_isolates_exchanges_and_bindings(broker, connect, v2):
    root, other = connect("/"), connect(v2)
    rch, och = root.channel(), other.channel()
    och.exchange_declare("events", "fanout")
    with pytest.raises(ChannelClosedByBroker) as ei:
        rch.exchange_declare("events", passive=True)
    assert ei.value.reply_text == "NOT_FOUND - no exchange 'events' in vhost '/'"
    rch = root.channel()
    rch.exchange_declare("events", "topic")  # same name, other type: a different exchange
    rq = rch.queue_declare("", exclusive=True).method.queue
    oq = och.queue_declare("", exclusive=True).method.queue
    rch.queue_bind(rq, "amq.fanout")
    och.queue_bind(oq, "amq.fanout")
    och.queue_bind(oq, "events")
    rch.basic_publish("amq.fanout", "", b"root fanout")
    och.basic_publish("events", "", b"v2 events")
    assert rch.basic_get(rq, auto_ack=True)[2] == b"root fanout"
    assert rch.basic_get(rq)[0] is None
    assert och.basic_get(oq, auto_ack=True)[2] == b"v2 events"
    assert och.basic_get(oq)[0] is None
    och.exchange_delete("events")
    rch.exchange_declare("events", passive=True)  # the "/" one survives
    rch.exchange_delete("events")


def test_exclusive_queue_in_one_vhost_does_not_lock_the_other(broker, connect, v2):
    root, other = connect("/"), connect(v2)
    other.channel().queue_declare("mine", exclusive=True)
    rch = root.channel()
    rch.queue_declare("mine")  # a different queue: no 405
    rch.queue_delete("mine")


def test_second_vhost_with_aio_pika(broker, v2):
    async def main():
        root = await aio_pika.connect(broker.url)
        other = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/{v2}")
        async with root, other:
            rch, och = await root.channel(), await other.channel()
            oq = await och.declare_queue("jobs")
            await och.default_exchange.publish(aio_pika.Message(b"v2 job"), routing_key="jobs")
            with pytest.raises(amqe.ChannelNotFoundEntity) as ei:
                await rch.declare_queue("jobs", passive=True)
            assert ei.value.args[0] == "NOT_FOUND - no queue 'jobs' in vhost '/'"
            rch = await root.channel()
            rq = await rch.declare_queue("jobs")
            assert rq.declaration_result.message_count == 0
            m = await oq.get(no_ack=True)
            assert m.body == b"v2 job"
            await rq.delete()
            await oq.delete()
    asyncio.run(main())


def test_second_vhost_isolates_exchanges_aio_pika(broker, v2):
    async def main():
        root = await aio_pika.connect(broker.url)
        other = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/{v2}")
        async with root, other:
            rch, och = await root.channel(), await other.channel()
            oex = await och.declare_exchange("logs", aio_pika.ExchangeType.FANOUT)
            with pytest.raises(amqe.ChannelNotFoundEntity) as ei:
                await rch.get_exchange("logs", ensure=True)
            assert ei.value.args[0] == "NOT_FOUND - no exchange 'logs' in vhost '/'"
            rch = await root.channel()
            rq = await rch.declare_queue(exclusive=True)
            oq = await och.declare_queue(exclusive=True)
            await rq.bind("amq.topic", "#")
            await oq.bind(oex)
            await oex.publish(aio_pika.Message(b"only v2"), routing_key="a.b")
            await (await och.get_exchange("amq.topic")).publish(aio_pika.Message(b"v2 topic"),
                                                               routing_key="a.b")
            assert (await oq.get(no_ack=True)).body == b"only v2"
            assert await oq.get(fail=False) is None
            assert await rq.get(fail=False) is None
            await oex.delete()
    asyncio.run(main())
