"""The asyncio AMQP client (exchange_broker/client/): what a node uses to forward publishes to and
relay deliveries from the queues another node leads (and shovels / federation next). Real broker (in
process, ephemeral port), real sockets; pika on the other side where a second client helps."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from eb_support import pika_connect, uniq, wait_until
from exchange_broker.client import ClientError, Connection
from exchange_broker.protocol import codec

PERSISTENT = codec.encode_properties({"delivery_mode": 2, "headers": {"k": "v", "n": 7}})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def confirming_channel(port: int, queue: str, **declare):
    """A link to the broker and a channel in confirm mode on which ``queue`` was declared."""
    link = await Connection.open("127.0.0.1", port, "guest", "guest", name="test link")
    ch = await link.channel()
    await ch.call(commands.Queue.Declare(queue=queue, **declare), commands.Queue.DeclareOk)
    await ch.confirm_select()
    return link, ch


def test_publish_with_confirms_then_consume_prefetch_and_ack(broker):
    queue = uniq("link")

    async def scenario():
        link, ch = await confirming_channel(broker.port, queue, durable=True)
        futs = [ch.publish("", queue, PERSISTENT, b"m%d" % i) for i in range(150)]
        confirmed: list = []

        def on_confirm(ok: bool, count: int) -> None:  # called for a run of publishes at a time
            confirmed.extend([ok] * count)
        for i in range(150, 300):  # confirms as callbacks (no future): what a forwarder uses
            assert ch.publish("", queue, PERSISTENT, b"m%d" % i, on_confirm=on_confirm) is None
        assert await asyncio.gather(*futs) == [True] * 150
        while len(confirmed) < 150:
            await asyncio.sleep(0.01)
        assert confirmed == [True] * 150
        got: list = []
        done = asyncio.get_running_loop().create_future()

        def on_delivery(d):
            got.append(d)
            if len(got) == 300 and not done.done():
                done.set_result(None)
        cons = await link.channel()
        tag = await cons.consume(queue, on_delivery, prefetch=50)
        await asyncio.sleep(0.2)
        assert len(got) == 50  # prefetch holds the rest back until acks come
        acked = 0
        while acked < 300:
            if got[-1].delivery_tag > acked:
                acked = got[-1].delivery_tag
                cons.ack(acked, multiple=True)
            await asyncio.sleep(0.02)
        await done
        assert [d.body for d in got] == [b"m%d" % i for i in range(300)]
        first = got[0]
        assert (first.consumer_tag, first.exchange, first.routing_key, first.redelivered) == \
            (tag, "", queue, False)
        assert codec.parse_properties(first.properties)["headers"] == {"k": "v", "n": 7}
        await cons.cancel(tag)
        ok = await ch.call(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == 0
        await ch.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        await link.close()
        assert link.error is not None
    run(scenario())


def test_publishes_given_one_on_confirm_are_one_run_settled_by_count(broker):
    """Publishes in a row with one ``on_confirm`` are tracked as one run: a multiple ack settles
    what it covers in one call; single acks, in any order, split the run. (The broker's own
    confirms come in order; the out-of-order ones are fed to the channel before they arrive, and
    the broker's later ones for the same tags then find nothing left.)"""
    queue = uniq("runs")

    async def scenario():
        link, ch = await confirming_channel(broker.port, queue, auto_delete=True)
        got: list = []

        def on_confirm(ok: bool, count: int) -> None:
            got.append((ok, count))
        for _ in range(10):  # tags 1..10: one run
            assert ch.publish("", queue, b"\x00\x00", b"x", on_confirm=on_confirm) is None
        fut = ch.publish("", queue, b"\x00\x00", b"y")  # tag 11: a future of its own
        ch._confirm(5, False, True)    # inside the run: split into 1..4 and 6..10
        ch._confirm(1, False, False)   # the first of a run
        ch._confirm(10, False, True)   # the last of a run
        ch._confirm(3, True, True)     # multiple: 2 and 3 (1 went already), 4 stays
        assert got == [(True, 1), (False, 1), (True, 1), (True, 2)]
        ch._confirm(11, True, True)    # the rest: 4, then 6..9, then the future
        assert got[4:] == [(True, 1), (True, 4)]
        assert fut.done() and fut.result() is True
        assert not ch._unconfirmed
        await ch.call(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        assert len(got) == 6  # the broker's own confirms of tags 1..11 settled nothing twice
        await link.close()

    run(scenario())


def test_publish_tracked_is_a_mandatory_confirmed_run_and_after_read_runs_once_per_read(broker):
    """``publish_tracked`` (what a forwarder calls per message): mandatory (a missing queue
    returns it), confirms counted on the one run; the deliveries of one read come before that
    read's ``after_read`` callbacks, each called once."""
    queue = uniq("tracked")

    async def scenario():
        link, ch = await confirming_channel(broker.port, queue, auto_delete=True)
        returned: list = []
        ch.on_return = returned.append
        confirmed: list = []

        def on_confirm(ok: bool, count: int) -> None:
            confirmed.extend([ok] * count)
        ex, key = codec.short_str(""), codec.short_str(queue)
        for i in range(200):
            ch.publish_tracked(ex, key, PERSISTENT, b"t%d" % i, on_confirm)
        assert len(ch._unconfirmed) == 1  # one run of 200
        ch.publish_tracked(ex, codec.short_str(uniq("nowhere")), PERSISTENT, b"lost", on_confirm)
        while len(confirmed) < 201:
            await asyncio.sleep(0.01)
        assert confirmed == [True] * 201  # (the broker acks a returned message after its return)
        assert [d.body for d in returned] == [b"lost"] and returned[0].reply_code == 312
        events: list = []

        def after() -> None:
            events.append("after")

        def on_delivery(d) -> None:
            if not events or events[-1] == "after":
                link.after_read.append(after)
            events.append(d.body)
        cons = await link.channel()
        await cons.consume(queue, on_delivery, no_ack=True)
        while sum(1 for e in events if e != "after") < 200:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert events[-1] == "after" and events[0] != "after"
        assert [e for e in events if e != "after"] == [b"t%d" % i for i in range(200)]
        assert "after" not in [events[i] for i in range(len(events) - 1) if events[i + 1] == "after"]
        assert not link.after_read
        await link.close()

    run(scenario())


def test_get_nack_requeue_reject_and_large_bodies(broker):
    queue = uniq("link")
    big = bytes(range(256)) * 2000  # 512,000 bytes: several body frames each way

    async def scenario():
        link = await Connection.open("127.0.0.1", broker.port, "guest", "guest")
        ch = await link.channel()
        await ch.call(commands.Queue.Declare(queue=queue, auto_delete=False), commands.Queue.DeclareOk)
        await ch.confirm_select()
        assert await ch.publish("", queue, b"\x00\x00", big) is True
        assert await ch.publish("", queue, b"\x00\x00", b"") is True
        d = await ch.get(queue)
        assert d.body == big and d.message_count == 1 and not d.redelivered
        ch.nack(d.delivery_tag, requeue=True)
        again = await ch.get(queue)
        assert again.body == big and again.redelivered
        ch.reject(again.delivery_tag, requeue=False)  # dropped (no dead-letter exchange)
        empty = await ch.get(queue, no_ack=True)
        assert empty.body == b"" and empty.message_count == 0
        assert await ch.get(queue) is None
        await ch.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        await link.close()
    run(scenario())


def test_channel_error_fails_that_channel_only_and_returns_reach_on_return(broker):
    async def scenario():
        link = await Connection.open("127.0.0.1", broker.port, "guest", "guest")
        bad = await link.channel()
        good = await link.channel()
        await good.confirm_select()
        returned = []
        good.on_return = returned.append
        assert await good.publish("amq.direct", "nowhere", b"\x00\x00", b"r", mandatory=True) is True
        assert [(d.reply_code, d.reply_text, d.body) for d in returned] == [(312, "NO_ROUTE", b"r")]
        await bad.confirm_select()
        fut = bad.publish("no-such-exchange", "k", b"\x00\x00", b"x")
        outcomes: list = []
        assert bad.publish("no-such-exchange", "k", b"\x00\x00", b"y",
                           on_confirm=lambda ok, count: outcomes.extend([ok] * count)) is None
        with pytest.raises(ClientError) as err:
            await fut
        assert err.value.code == 404
        assert outcomes == [False]  # the callback form: called once, False when the channel closed
        with pytest.raises(ClientError):
            bad.publish("", "k", b"\x00\x00", b"x")
        # the link and its other channels go on
        assert await good.publish("amq.direct", "nowhere", b"\x00\x00", b"s") is True
        again = await link.channel()
        await again.call(commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
        await link.close()
    run(scenario())


def test_node_cancel_notify_and_lost_link_fail_everything_waiting(broker):
    queue = uniq("link")

    async def scenario():
        link = await Connection.open("127.0.0.1", broker.port, "guest", "guest", name="doomed")
        ch = await link.channel()
        await ch.call(commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        cancels = []
        await ch.consume(queue, lambda d: None, on_cancel=lambda tag, err: cancels.append((tag, err)),
                         tag="relay-1")
        other = pika_connect(broker.port)
        try:
            other.channel().queue_delete(queue)  # the node cancels our consumer (cancel notify)
            for _ in range(100):
                if cancels:
                    break
                await asyncio.sleep(0.05)
            assert cancels == [("relay-1", None)]
            # the node closes the connection (as a dying node would): every waiter fails
            lost = []
            link.on_lost.append(lost.append)
            await ch.confirm_select()
            waiting = [ch.publish("", "nobody-home", b"\x00\x00", b"x") for _ in range(3)]
            for c in other_connections(broker, "doomed"):
                c.close("test: node going away")
            errors = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(e, (ClientError, bool)) for e in errors)
            await asyncio.wait_for(link.closed, 10)
            assert len(lost) == 1 and "320" in str(lost[0])
            with pytest.raises(ClientError):
                await link.channel()
            with pytest.raises(ClientError):
                ch.publish("", queue, b"\x00\x00", b"late")
        finally:
            other.close()
    run(scenario())


def other_connections(broker, name: str) -> list:
    """The broker's server-side connections of the link named ``name``."""
    found = [_Closer(broker, sess) for sess in list(broker.broker.sessions)
             if sess.client_properties.get("connection_name") in (name, name.encode())]
    assert found, "the link's connection is not known to the broker"
    return found


class _Closer:
    def __init__(self, broker, session) -> None:
        self.broker, self.session = broker, session

    def close(self, reason: str) -> None:  # as the management API's close does
        self.broker.loop.call_soon_threadsafe(self.session.server_close, 320, reason)


def test_a_silent_node_is_lost_after_two_heartbeat_intervals(spawn_broker):
    """SIGSTOP of the node: its socket stays open but nothing comes back; with 1 s heartbeats
    the link gives up within a few seconds and fails what waits on it."""
    import os
    import signal
    proc = spawn_broker("--in-memory")

    async def scenario():
        link = await Connection.open("127.0.0.1", proc.port, "guest", "guest", heartbeat=1)
        assert link.heartbeat == 1
        ch = await link.channel()
        await ch.confirm_select()
        assert await ch.publish("amq.direct", "k", b"\x00\x00", b"before") is True
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            waiting = ch.publish("amq.direct", "k", b"\x00\x00", b"during")
            error = await asyncio.wait_for(link.closed, 10)
            assert "heartbeats" in str(error)
            with pytest.raises(ClientError):
                await waiting
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    run(scenario())


def test_bad_login_and_refused_port_are_clear_errors(broker):
    from eb_support import free_port

    async def scenario():
        with pytest.raises(ClientError):
            await Connection.open("127.0.0.1", broker.port, "guest", "wrong", timeout=5)
        with pytest.raises(ClientError) as err:
            await Connection.open("127.0.0.1", free_port(), "guest", "guest", timeout=5)
        assert "127.0.0.1" in str(err.value)
    run(scenario())


def test_nothing_goes_out_on_a_channel_once_its_close_is_sent(broker):
    """An ack or nack made while channel.close waits for close-ok would reach a broker that forgot
    the channel, and it closes the whole connection (504): the client drops them (the broker
    requeues what was unacked on the closed channel)."""
    queue = uniq("closing")

    async def scenario():
        link = await Connection.open("127.0.0.1", broker.port, "guest", "guest", name="test link")
        ch = await link.channel()
        await ch.call(commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        for i in range(3):
            ch.publish("", queue, PERSISTENT, b"m%d" % i)
        got: list = []
        cons = await link.channel()
        await cons.consume(queue, got.append, prefetch=3)
        while len(got) < 3:
            await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(cons.close())
        await asyncio.sleep(0)  # channel.close is on the wire
        cons.ack(got[0].delivery_tag)
        cons.nack(got[1].delivery_tag)
        cons.reject(got[2].delivery_tag)
        with pytest.raises(ClientError):
            cons.publish("", queue, PERSISTENT, b"late")
        await closing
        await asyncio.sleep(0.2)
        assert link.error is None  # the connection lives on
        ok = await ch.call(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == 3  # all three back: nothing was settled after the close
        await ch.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        await link.close()
    run(scenario())


def test_open_cancelled_in_the_turn_its_handshake_completes_raises_and_leaves_no_connection(broker):
    """A task cancelled in the same event-loop turn as its connection's handshake completes:
    open() raises CancelledError and closes its socket. (asyncio.wait_for of Python 3.11 returns
    the inner result then, swallowing the cancel: a shovel replaced while it connected went on
    moving messages beside the one that replaced it.)"""
    seen: list[Connection] = []
    task: asyncio.Task | None = None

    class CancelledAsItOpens(Connection):
        def _connected(self, e) -> None:
            super()._connected(e)
            seen.append(self)
            task.cancel()

    async def scenario():
        nonlocal task
        task = asyncio.ensure_future(CancelledAsItOpens.open("127.0.0.1", broker.port, "guest", "guest"))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen and (seen[0].transport is None or seen[0].transport.is_closing())

    run(scenario())
    assert wait_until(lambda: broker.call(lambda: len(broker.broker.sessions)) == 0)
