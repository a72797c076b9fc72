"""Connection-level behaviour over real sockets: pika, aio-pika and a small raw-socket client.

Every test talks to the in-process broker from the ``broker`` fixture (ephemeral port).
"""
from __future__ import annotations

import asyncio
import math
import socket
import struct
import threading
import time

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp import encode as pencode
from pamqp import heartbeat as pheartbeat

from eb_support import RawClient, wait_until
from exchange_broker.testing import ThreadedBroker


# -- helpers -------------------------------------------------------------------------------------

def params(broker, **kw) -> pika.ConnectionParameters:
    kw.setdefault("heartbeat", 0)
    kw.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters("127.0.0.1", broker.port, **kw)


def sessions(broker) -> list:
    return broker.call(lambda: list(broker.broker.sessions))


def n_transports(broker) -> int:
    return broker.call(lambda: len(broker.server.protocols))


class AMQPlainCredentials(pika.PlainCredentials):
    """pika has no AMQPLAIN; the response is a field table without its length prefix."""
    TYPE = "AMQPLAIN"

    def response_for(self, start):
        mechanisms = start.mechanisms
        if isinstance(mechanisms, str):
            mechanisms = mechanisms.encode()
        if b"AMQPLAIN" not in mechanisms.split():
            return None, None
        table = pencode.field_table({"LOGIN": self.username, "PASSWORD": self.password})
        return self.TYPE, table[4:]


# -- logins ----------------------------------------------------------------------------------------

def test_pika_plain_login(broker):
    conn = pika.BlockingConnection(params(broker, credentials=pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        ch.queue_declare("plain-q")
        ch.basic_publish("", "plain-q", b"hello")
        _, _, body = ch.basic_get("plain-q", auto_ack=True)
        assert body == b"hello"
        [sess] = sessions(broker)
        assert sess.user == "guest" and sess.vhost.name == "/"
        assert sess.client_properties["product"] == "Pika Python Client Library"
        assert sess.conn.capabilities.get("consumer_cancel_notify") is True
    finally:
        conn.close()


def test_pika_amqplain_login(broker):
    conn = pika.BlockingConnection(params(broker, credentials=AMQPlainCredentials("guest", "guest")))
    try:
        assert conn.is_open
        ch = conn.channel()
        assert ch.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    finally:
        conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="403.*ACCESS_REFUSED"):
        pika.BlockingConnection(params(broker, credentials=AMQPlainCredentials("guest", "wrong")))


def test_raw_amqplain_login(broker):
    response = pencode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:].decode("ascii")
    raw = RawClient(broker.port, open_channel=1, mechanism="AMQPLAIN", response=response)
    try:
        assert raw.start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
        assert [s.user for s in sessions(broker)] == ["guest"]
    finally:
        raw.close()


def test_aiopika_login_and_roundtrip(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("aio-q")
            await ch.default_exchange.publish(aio_pika.Message(b"hi"), routing_key="aio-q")
            msg = await q.get(timeout=5)
            await msg.ack()
            return msg.body
    assert asyncio.run(main()) == b"hi"
    assert wait_until(lambda: sessions(broker) == [])


@pytest.mark.parametrize("user,password", [("guest", "wrong"), ("nobody", "guest")])
def test_bad_login_is_403(broker, user, password):
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)) as info:
        pika.BlockingConnection(params(broker, credentials=pika.PlainCredentials(user, password)))
    assert "403" in str(info.value) and "ACCESS_REFUSED - Login was refused" in str(info.value)

    async def aio():
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError, match="ACCESS_REFUSED"):
            await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{broker.port}/")
    asyncio.run(aio())
    assert sessions(broker) == []
    assert wait_until(lambda: n_transports(broker) == 0)


def test_unknown_vhost_is_530(broker):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params(broker, virtual_host="no-such-vhost"))
    assert "530" in str(info.value) and "NOT_ALLOWED - vhost no-such-vhost not found" in str(info.value)

    async def aio():
        # aiormq (with RabbitMQ too) reports the close it got instead of open-ok as a frame error
        with pytest.raises(aiormq.exceptions.AMQPError):
            await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/no-such-vhost")
    asyncio.run(aio())
    assert sessions(broker) == []
    assert wait_until(lambda: n_transports(broker) == 0)


# -- frame_max ---------------------------------------------------------------------------------------

def test_frame_max_negotiation_and_large_message(broker):
    conn = pika.BlockingConnection(params(broker, frame_max=4096))
    try:
        [sess] = sessions(broker)
        assert sess.conn.frame_max == 4096
        ch = conn.channel()
        ch.queue_declare("big")
        body = bytes(range(256)) * 400  # 102400 bytes: 25+ body frames each way
        ch.basic_publish("", "big", body, pika.BasicProperties(headers={"k": "v"}))
        got = []
        ch.basic_consume("big", lambda c, m, p, b: got.append((p.headers, b)), auto_ack=True)
        assert wait_until(lambda: (conn.process_data_events(0.05), got)[1], 5)
        assert got == [({"k": "v"}, body)]
    finally:
        conn.close()


def test_body_frames_never_exceed_negotiated_frame_max_on_the_wire(broker):
    raw = RawClient(broker.port, open_channel=1, frame_max=4096)
    conn = pika.BlockingConnection(params(broker))  # default 128 KiB frames for the publisher
    try:
        ch = conn.channel()
        ch.queue_declare("wire")
        body = b"".join(i.to_bytes(4, "big") for i in range(12500))  # 50000 bytes
        ch.basic_publish("", "wire", body)
        ch.basic_publish("", "wire", body[:4088])  # exactly one full body frame
        raw.send(1, commands.Basic.Consume(queue="wire", no_ack=True))
        raw.expect_next(commands.Basic.ConsumeOk)
        for expected in (body, body[:4088]):
            raw.sizes.clear()
            deliver = raw.expect_next(commands.Basic.Deliver)
            assert deliver.routing_key == "wire"
            _, hdr = raw.read_frame()
            assert hdr.body_size == len(expected)
            parts = []
            while sum(map(len, parts)) < len(expected):
                _, part = raw.read_frame()
                parts.append(part.value)
            assert b"".join(parts) == expected
            body_frames = [size for ftype, size in raw.sizes if ftype == 3]
            assert len(body_frames) == math.ceil(len(expected) / (4096 - 8))
            assert max(size for _, size in raw.sizes) <= 4096
            assert body_frames[0] == 4096
    finally:
        raw.close()
        conn.close()


def test_aiopika_message_larger_than_frame_max(broker):
    body = b"x" * 131072 * 2 + b"tail"

    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
            msg = await q.get(timeout=5, no_ack=True)
            return msg.body
    assert asyncio.run(main()) == body


# -- heartbeats ----------------------------------------------------------------------------------------

def test_heartbeat_client_stays_alive_while_idle(broker):
    conn = pika.BlockingConnection(params(broker, heartbeat=1))
    try:
        [sess] = sessions(broker)
        assert sess.conn.heartbeat == 1
        ch = conn.channel()
        ch.queue_declare("hb")
        conn.sleep(4)  # idle, but pika and the broker exchange heartbeats meanwhile
        assert conn.is_open
        ch.basic_publish("", "hb", b"still here")
        assert ch.basic_get("hb", auto_ack=True)[2] == b"still here"
        assert len(sessions(broker)) == 1
    finally:
        conn.close()


@pytest.mark.realtime  # a real-time budget: run at the normal CPU priority (tests/conftest.py)
def test_silent_client_is_dropped_after_missed_heartbeats(broker):
    raw = RawClient(broker.port, open_channel=1, heartbeat=1)
    try:
        t0 = time.monotonic()
        heartbeats = 0
        while True:
            got = raw.read_frame(timeout=6)
            if got is None:
                break
            assert isinstance(got[1], pheartbeat.Heartbeat), got
            heartbeats += 1
        elapsed = time.monotonic() - t0
        assert heartbeats >= 1  # the broker sends heartbeats while we are silent ...
        assert 1.5 < elapsed < 4.5  # ... and gives up on us after two missed intervals
        assert wait_until(lambda: sessions(broker) == [] and n_transports(broker) == 0)
    finally:
        raw.close()


# -- connection.close ------------------------------------------------------------------------------------

def test_connection_close_by_client(broker):
    conn = pika.BlockingConnection(params(broker))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert len(sessions(broker)) == 1
    conn.close()
    assert conn.is_closed
    assert wait_until(lambda: sessions(broker) == [] and n_transports(broker) == 0)
    assert broker.call(lambda: q not in broker.broker.vhosts["/"].queues)


def test_connection_close_by_server_pika(broker):
    conn = pika.BlockingConnection(params(broker))
    conn.channel()
    broker.call(lambda: [s.server_close(320, "closed by test") for s in list(broker.broker.sessions)])
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(100):
            conn.process_data_events(0.05)
    assert info.value.reply_code == 320
    assert info.value.reply_text == "CONNECTION_FORCED - closed by test"
    assert conn.is_closed
    assert wait_until(lambda: sessions(broker) == [] and n_transports(broker) == 0)


def test_connection_close_by_server_aiopika(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        closed = asyncio.get_running_loop().create_future()
        conn.close_callbacks.add(lambda _sender, exc: closed.done() or closed.set_result(exc))
        await conn.channel()
        await asyncio.get_running_loop().run_in_executor(None, lambda: broker.call(
            lambda: [s.server_close(320, "closed by test") for s in list(broker.broker.sessions)]))
        exc = await asyncio.wait_for(closed, 5)
        await conn.close()
        return exc
    exc = asyncio.run(main())
    assert isinstance(exc, aiormq.exceptions.ConnectionClosed)
    assert exc.args == (320, "CONNECTION_FORCED - closed by test")
    assert wait_until(lambda: sessions(broker) == [] and n_transports(broker) == 0)


# -- channels ----------------------------------------------------------------------------------------------

def test_fifty_channels_with_their_own_state(broker):
    conn = pika.BlockingConnection(params(broker))
    try:
        chans = [conn.channel() for _ in range(50)]
        for i, ch in enumerate(chans):
            ch.basic_qos(prefetch_count=i + 1)
            if i % 2:
                ch.confirm_delivery()
            ch.queue_declare(f"chq-{i}", exclusive=True)
            ch.basic_publish("", f"chq-{i}", str(i).encode())
        [sess] = sessions(broker)
        state = broker.call(lambda: {n: (c.prefetch, c.confirm) for n, c in sess.channels.items()})
        assert state == {ch.channel_number: (i + 1, bool(i % 2)) for i, ch in enumerate(chans)}
        for i, ch in enumerate(chans):
            assert ch.basic_get(f"chq-{i}", auto_ack=True)[2] == str(i).encode()

        # an error on one channel closes only that channel
        bad = chans[25]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            bad.queue_declare("does-not-exist", passive=True)
        assert info.value.reply_code == 404
        assert "NOT_FOUND - no queue 'does-not-exist'" in info.value.reply_text
        assert bad.is_closed and conn.is_open
        assert wait_until(lambda: broker.call(lambda: len(sess.channels)) == 49)
        state2 = broker.call(lambda: {n: (c.prefetch, c.confirm) for n, c in sess.channels.items()})
        assert state2 == {k: v for k, v in state.items() if k != bad.channel_number}
        for i, ch in enumerate(chans):
            if ch is bad:
                continue
            ch.basic_publish("", f"chq-{i}", b"again")
            assert ch.basic_get(f"chq-{i}", auto_ack=True)[2] == b"again"
        # the channel number can be opened again, fresh
        again = conn.channel(bad.channel_number)
        assert broker.call(lambda: sess.channels[bad.channel_number].prefetch) == 0
        again.close()
    finally:
        conn.close()


def test_channel_close_by_server_on_soft_error(broker):
    conn = pika.BlockingConnection(params(broker))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_consume("missing-q", lambda *a: None)
        assert info.value.reply_code == 404
        assert info.value.reply_text == "NOT_FOUND - no queue 'missing-q' in vhost '/'"
        assert ch.is_closed and conn.is_open
        [sess] = sessions(broker)
        assert wait_until(lambda: broker.call(lambda: ch.channel_number not in sess.channels))
        ch2 = conn.channel()
        ch2.queue_declare("ok-q")
        assert ch2.queue_declare("ok-q", passive=True).method.message_count == 0
    finally:
        conn.close()


def test_channel_close_by_client(broker):
    conn = pika.BlockingConnection(params(broker))
    try:
        ch, other = conn.channel(), conn.channel()
        ch.queue_declare("cq")
        ch.basic_consume("cq", lambda *a: None)
        assert other.queue_declare("cq", passive=True).method.consumer_count == 1
        [sess] = sessions(broker)
        ch.close()
        assert ch.is_closed and conn.is_open
        assert broker.call(lambda: sorted(sess.channels)) == [other.channel_number]
        assert other.queue_declare("cq", passive=True).method.consumer_count == 0
    finally:
        conn.close()


# -- shutdown ----------------------------------------------------------------------------------------------

def test_graceful_shutdown_sends_320_to_clients():
    tb = ThreadedBroker().start()
    aio_result: dict = {}
    aio_ready = threading.Event()

    def aio_client():
        async def main():
            conn = await aio_pika.connect(tb.url)
            closed = asyncio.get_running_loop().create_future()
            conn.close_callbacks.add(lambda _s, exc: closed.done() or closed.set_result(exc))
            await conn.channel()
            aio_ready.set()
            aio_result["exc"] = await asyncio.wait_for(closed, 10)
        asyncio.run(main())

    aio_thread = threading.Thread(target=aio_client, daemon=True)
    aio_thread.start()
    stopper = threading.Thread(target=tb.stop, daemon=True)
    conn = None
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port, heartbeat=0))
        conn.channel().queue_declare("shutdown-q")
        assert aio_ready.wait(5)
        stopper.start()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            for _ in range(200):
                conn.process_data_events(0.05)
        assert info.value.reply_code == 320
        assert info.value.reply_text.startswith("CONNECTION_FORCED")
        aio_thread.join(10)
        exc = aio_result.get("exc")
        assert isinstance(exc, aiormq.exceptions.ConnectionClosed) and exc.args[0] == 320
        stopper.join(15)
        assert not stopper.is_alive()
        # nothing listens any more
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", tb.port), timeout=1).close()
    finally:
        if conn is not None and conn.is_open:
            conn.close()
        tb.stop()
