"""Frame size tolerance, channel_max as a count of open channels, and an oversized frame during the
handshake (issue 12, §1), with raw scripted bytes and with the clients that hit them: amqpstorm
(fills body frames with frame_max bytes of payload) and aio-pika/aiormq (channel 65535)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import aio_pika
import pytest
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

from eb_support import PROTOCOL_HEADER, RawClient, uniq

amqpstorm = pytest.importorskip("amqpstorm")


def body_frame(channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", 3, channel, len(payload)) + payload + b"\xce"


# -- frame_max + 8 --------------------------------------------------------------------------------

@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_body_frames_of_frame_max_payload_are_accepted(broker, frame_max):
    """RabbitMQ accepts frames up to 8 bytes over frame_max (payload == frame_max); one byte
    more is a 501 connection error."""
    client = RawClient(broker.port, open_channel=1, frame_max=frame_max)
    try:
        q = uniq("fm")
        client.send(1, C.Queue.Declare(queue=q, exclusive=True))
        client.expect_next(C.Queue.DeclareOk)
        body = bytes(range(256)) * (2 * frame_max // 256) + b"tail"
        parts = [body[i:i + frame_max] for i in range(0, len(body), frame_max)]
        assert len(parts[0]) == frame_max and len(parts) == 3
        client.send_raw(pframe.marshal(C.Basic.Publish(exchange="", routing_key=q), 1)
                        + pframe.marshal(pheader.ContentHeader(0, len(body), C.Basic.Properties()), 1)
                        + b"".join(body_frame(1, p) for p in parts))
        client.send(1, C.Basic.Get(queue=q, no_ack=True))
        client.expect_next(C.Basic.GetOk)
        assert client.expect_next(pheader.ContentHeader).body_size == len(body)
        got = b""
        while len(got) < len(body):
            got += client.next()[1].value
        assert got == body
        # the broker's own frames stay within frame_max
        assert max(size for _type, size in client.sizes) <= frame_max
        # payload = frame_max + 1: too large
        client.send_raw(pframe.marshal(C.Basic.Publish(exchange="", routing_key=q), 1)
                        + pframe.marshal(pheader.ContentHeader(0, frame_max + 1, C.Basic.Properties()), 1)
                        + body_frame(1, b"x" * (frame_max + 1)))
        close = client.expect_next(C.Connection.Close, channel=0)
        assert close.reply_code == 501
        assert close.reply_text.startswith("FRAME_ERROR - frame size ")
        assert f"exceeds frame_max {frame_max}" in close.reply_text
    finally:
        client.close()


def test_amqpstorm_messages_larger_than_frame_max(broker):
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=broker.port, heartbeat=0, timeout=10)
    try:
        assert conn.max_frame_size == 131072
        ch = conn.channel()
        q = uniq("storm")
        ch.queue.declare(q, exclusive=True)
        ch.confirm_deliveries()
        bodies = [bytes([i]) * size for i, size in enumerate((131072, 131073, 300_000, 1_000_000, 10))]
        for body in bodies:
            assert ch.basic.publish(body, q) is True  # confirmed
        for body in bodies:
            msg = ch.basic.get(q, no_ack=True, auto_decode=False)
            assert msg is not None and msg.body == body
        assert conn.is_open
    finally:
        conn.close()


# -- channel_max counts open channels -----------------------------------------------------------

def test_channel_numbers_above_channel_max_are_fine_the_count_is_not(broker):
    client = RawClient(broker.port, channel_max=3)
    try:
        assert client.tune.channel_max == 2047
        for ch in (65535, 7, 2048):
            client.send(ch, C.Channel.Open())
            client.expect_next(C.Channel.OpenOk, channel=ch)
        client.send(7, C.Channel.Close(200, "", 0, 0))  # a closed channel frees its place
        client.expect_next(C.Channel.CloseOk, channel=7)
        client.send(9, C.Channel.Open())
        client.expect_next(C.Channel.OpenOk, channel=9)
        client.send(65535, C.Basic.Qos(0, 1))
        client.expect_next(C.Basic.QosOk, channel=65535)
        client.send(11, C.Channel.Open())  # a fourth open channel
        close = client.expect_next(C.Connection.Close, channel=0)
        assert (close.reply_code, close.reply_text) == (
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)")
    finally:
        client.close()


def test_aio_pika_channel_65535(broker):
    async def main():
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
        async with conn:
            ch = await conn.channel(channel_number=65535)
            q = await ch.declare_queue(uniq("aio"), exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"on 65535"), routing_key=q.name)
            msg = await q.get(timeout=5)
            await msg.ack()
            other = await conn.channel()  # and an ordinary one next to it
            await other.close()
            return msg.body, ch.number
    assert asyncio.run(main()) == (b"on 65535", 65535)


# -- an oversized frame before the handshake ends -----------------------------------------------

def read_until_eof(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the broker sends until it closes the socket, and how long that took."""
    t0 = time.monotonic()
    data = b""
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionError:
        pass
    return data, time.monotonic() - t0


def frames_of(data: bytes) -> list:
    out = []
    while data:
        n, _ch, frame = pframe.unmarshal(data)
        out.append(frame)
        data = data[n:]
    return out


@pytest.mark.realtime  # a real-time budget: run at the normal CPU priority (tests/conftest.py)
@pytest.mark.parametrize("stage", ["after protocol header", "after start-ok"])
def test_two_gigabyte_frame_header_during_the_handshake_is_closed_at_once(broker, stage):
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    try:
        sock.sendall(PROTOCOL_HEADER)
        start = b""
        while not start.endswith(b"\xce"):
            start += sock.recv(65536)
        assert isinstance(frames_of(start)[0], C.Connection.Start)
        if stage == "after start-ok":
            sock.sendall(pframe.marshal(C.Connection.StartOk(
                client_properties={"product": "test"}, mechanism="PLAIN", response="\0guest\0guest"), 0))
            tune = b""
            while not tune.endswith(b"\xce"):
                tune += sock.recv(65536)
            assert isinstance(frames_of(tune)[0], C.Connection.Tune)
        sock.sendall(struct.pack(">BHI", 1, 0, 0x7FFFFFF0) + b"\x00" * 64)
        data, took = read_until_eof(sock, 5)
        assert took < 1.0, f"socket closed after {took:.2f} s"
        [close] = frames_of(data)
        assert isinstance(close, C.Connection.Close) and close.reply_code == 501
        assert "FRAME_ERROR - frame size 2147483640 exceeds frame_max 4096" in close.reply_text
    finally:
        sock.close()


def test_frame_of_initial_frame_max_is_fine_during_the_handshake(broker):
    """Before tune-ok the limit is RabbitMQ's initial_frame_max (4096): a start-ok just inside it
    is accepted."""
    def start_ok(padding: int) -> bytes:
        return pframe.marshal(C.Connection.StartOk(client_properties={"product": "test", "pad": "p" * padding},
                                                   mechanism="PLAIN", response="\0guest\0guest"), 0)
    frame = start_ok(4104 - len(start_ok(0)))
    assert len(frame) == 4096 + 8  # a payload of initial_frame_max bytes
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    try:
        sock.sendall(PROTOCOL_HEADER)
        time.sleep(0.1)
        sock.recv(65536)
        sock.sendall(frame)
        data = b""
        while not data.endswith(b"\xce"):
            data += sock.recv(65536)
        assert isinstance(frames_of(data)[0], C.Connection.Tune)
    finally:
        sock.close()
