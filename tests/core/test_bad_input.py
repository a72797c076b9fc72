"""Malformed input over real sockets: the offender is closed with the right code, others carry on.

Each case opens a well-behaved pika connection first, then a raw socket that completes the
handshake and misbehaves. Checked every time: the broker answers with connection.close (or
channel.close) carrying the expected code and a reply text naming the problem, the broker then
closes the socket (no hung connection), and the pika connection still publishes and consumes.
Reply codes were compared by hand with RabbitMQ 3.x (see the notes on each case).
"""
from __future__ import annotations

import logging
import socket
import struct
import time

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from eb_support import RawClient
from exchange_broker.protocol.constants import HARD_ERRORS, PROTOCOL_HEADER, REPLY_NAMES
from exchange_broker.testing import ThreadedBroker


# -- raw client ----------------------------------------------------------------------------------------

class Raw(RawClient):
    """A socket that did the AMQP handshake (and opened channel 1) and now sends whatever it likes."""

    def __init__(self, port: int, frame_max: int = 131072) -> None:
        super().__init__(port, open_channel=1, frame_max=frame_max)

    def expect_connection_close(self, code: int, text: str) -> commands.Connection.Close:
        close = self.expect_next(commands.Connection.Close, channel=0)
        assert close.reply_code == code, close.reply_text
        assert close.reply_text.startswith(REPLY_NAMES[code] + " - ")
        assert text in close.reply_text
        try:
            self.send(0, commands.Connection.CloseOk())
        except OSError:
            pass  # a broker that lost frame sync may already have dropped us
        self.assert_closed_by_broker()
        return close

    def assert_closed_by_broker(self, timeout: float = 7.0) -> None:
        """recv() must report the broker's close (EOF or reset) well before ``timeout``."""
        if not self.closed_by_peer(timeout):
            pytest.fail("the broker left the socket open")


def frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def m(method, channel: int = 1) -> bytes:
    return pframe.marshal(method, channel)


PUBLISH = m(commands.Basic.Publish(exchange="", routing_key="good-q"))
HEADER5 = m(pheader.ContentHeader(0, 5, commands.Basic.Properties()))
BODY5 = m(pbody.ContentBody(b"hello"))


# -- the good neighbour ----------------------------------------------------------------------------------

class Good:
    """A pika connection with a consumer, opened before the misbehaving one."""

    def __init__(self, port: int) -> None:
        self.conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        self.ch.queue_declare("good-q")
        self.got: list[bytes] = []
        self.ch.basic_consume("good-q", lambda c, m, p, b: (self.got.append(b),
                                                            c.basic_ack(m.delivery_tag)))
        self.n = 0
        self.check()

    def check(self) -> None:
        """Publish (confirmed) and consume a few messages."""
        sent = []
        for _ in range(3):
            self.n += 1
            body = f"msg-{self.n}".encode()
            self.ch.basic_publish("", "good-q", body)  # raises if not confirmed
            sent.append(body)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.got[-3:] != sent:
            self.conn.process_data_events(0.02)
        assert self.got[-3:] == sent
        assert self.conn.is_open and self.ch.is_open

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def n_sessions(broker) -> int:
    return broker.call(lambda: len(broker.broker.sessions))


def wait_sessions(broker, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and n_sessions(broker) != n:
        time.sleep(0.02)
    assert n_sessions(broker) == n


@pytest.fixture
def good(broker):
    g = Good(broker.port)
    yield g
    g.close()


# -- connection errors -----------------------------------------------------------------------------------

CASES = {
    # name: (bytes to send, code, text naming the problem, negotiated frame_max)
    # RabbitMQ: 501 "FRAME_ERROR - type 1, all octets = <<...>>: {invalid_frame_end_marker,0}"
    "bad frame-end byte": (PUBLISH[:-1] + b"\x00", 501, "invalid frame end byte 0x00", 131072),
    # RabbitMQ: 501 "... {frame_too_large,200004,131064}"
    "frame beyond default frame_max": (struct.pack(">BHI", 1, 1, 200004) + b"\x00\x3c\x00\x28" + b"\x00" * 96,
                                       501, "frame size 200012 exceeds frame_max 131072", 131072),
    "body frame beyond negotiated frame_max": (
        PUBLISH + m(pheader.ContentHeader(0, 5000, commands.Basic.Properties())) +
        m(pbody.ContentBody(b"z" * 5000)), 501, "frame size 5008 exceeds frame_max 4096", 4096),
    # RabbitMQ drops the socket without a close here; 540 NOT_IMPLEMENTED is the spec's answer
    "unknown method id": (frame(1, 1, struct.pack(">HH", 60, 999)), 540,
                          "unknown method: class 60, method 999", 131072),
    "unknown class id": (frame(1, 1, struct.pack(">HH", 99, 1)), 540, "unknown method: class 99, method 1",
                         131072),
    # RabbitMQ: 501 "FRAME_ERROR - cannot decode <<0,0,5,97,98>>"
    "truncated queue.declare arguments": (frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00\x00\x05ab"), 501,
                                          "cannot decode Queue.Declare arguments", 131072),
    "truncated basic.publish arguments": (frame(1, 1, struct.pack(">HH", 60, 40) + b"\x00\x00\x05ab"), 501,
                                          "cannot decode basic.publish arguments", 131072),
    # RabbitMQ: 505 "expected content header for class 60, got non content header frame instead"
    "content body before header": (PUBLISH + BODY5, 505,
                                   "expected content header for class 60, got content body", 131072),
    # RabbitMQ: 505 "expected method frame, got non method frame instead"
    "content header with no publish": (HEADER5, 505, "expected method frame, got non method frame", 131072),
    "content body with no publish": (BODY5, 505, "expected method frame, got non method frame", 131072),
    "method inside a content sequence": (PUBLISH + HEADER5 + m(commands.Basic.Qos(0, 1)), 505,
                                         "expected content header for class 60, got method frame", 131072),
    # RabbitMQ: 504 "CHANNEL_ERROR - expected 'channel.open'"
    "method on an unopened channel": (m(commands.Queue.Declare(queue="x"), 7), 504,
                                      "expected 'channel.open' on channel 7", 131072),
    # RabbitMQ: 505 "expected method frame, got non method frame instead"
    "content header on an unopened channel": (m(pheader.ContentHeader(0, 5, commands.Basic.Properties()), 7),
                                              505, "on channel 7, which is not open", 131072),
    # RabbitMQ: 501 "... {frame_too_large,539959368,131064}" (b"GET " read as a frame header)
    "garbage: an HTTP request": (b"GET / HTTP/1.1\r\nHost: example\r\n\r\n", 501, "exceeds frame_max", 131072),
    "garbage: zero bytes": (b"\x00" * 64, 501, "invalid frame end byte", 131072),
    # RabbitMQ: 501 "... unknown_frame"
    "garbage: unknown frame type": (frame(9, 0, b"abc"), 501, "unknown frame type 9", 131072),
    # RabbitMQ: 505 "UNEXPECTED_FRAME - type 8 ..."
    "heartbeat on a channel": (frame(8, 1, b""), 505, "heartbeat frame on channel 1", 131072),
    # RabbitMQ: 504 "CHANNEL_ERROR - unexpected method in connection state running"
    "channel method on channel 0": (m(commands.Queue.Declare(queue="x"), 0), 504,
                                    "unexpected method Queue.Declare", 131072),
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_input_closes_only_the_offender(broker, good, name):
    data, code, text, frame_max = CASES[name]
    raw = Raw(broker.port, frame_max=frame_max)
    try:
        assert code in HARD_ERRORS
        wait_sessions(broker, 2)
        raw.send_raw(data)
        raw.expect_connection_close(code, text)
        wait_sessions(broker, 1)
        assert broker.call(lambda: len(broker.server.protocols)) == 1
    finally:
        raw.close()
    good.check()


def test_bad_protocol_header_gets_header_back_and_eof(broker, good):
    for header in (b"AMQP\x00\x00\x09\x00", b"HTTP/1.1"):
        sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        try:
            sock.sendall(header)
            data = b""
            while True:
                chunk = sock.recv(100)
                if not chunk:
                    break
                data += chunk
            assert data == PROTOCOL_HEADER
        finally:
            sock.close()
    good.check()


def test_silent_partial_frame_is_dropped_after_handshake(broker, good):
    """A peer that stops halfway through a frame is not waited for forever when it closes."""
    raw = Raw(broker.port)
    try:
        raw.send_raw(PUBLISH[:5])
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))  # swallowed by the partial frame
        time.sleep(0.2)
        assert n_sessions(broker) == 2
    finally:
        raw.close()
    wait_sessions(broker, 1)
    good.check()


# -- channel error: message larger than max_message_size -----------------------------------------------

@pytest.fixture
def small_broker():
    with ThreadedBroker(limits={"max_message_size": 1024}) as tb:
        yield tb


@pytest.mark.parametrize("in_one_write", [True, False])
def test_message_above_max_message_size_is_406_channel_error(small_broker, in_one_write):
    good = Good(small_broker.port)
    raw = Raw(small_broker.port)
    try:
        body = b"x" * 1500
        frames = [PUBLISH, m(pheader.ContentHeader(0, len(body), commands.Basic.Properties())),
                  m(pbody.ContentBody(body[:700])), m(pbody.ContentBody(body[700:]))]
        if in_one_write:  # all frames reach the broker in one read
            raw.send_raw(b"".join(frames))
        else:
            for f in frames:
                raw.send_raw(f)
                time.sleep(0.05)
        close = raw.expect_next(commands.Channel.Close, channel=1)
        assert close.reply_code == 406
        assert close.reply_text == ("PRECONDITION_FAILED - message size 1500 is larger than configured "
                                    "max size 1024")
        assert (close.class_id, close.method_id) == (60, 40)
        raw.send(1, commands.Channel.CloseOk())
        # the connection lives on: reopen the channel and publish something small
        raw.send(1, commands.Channel.Open())
        raw.expect_next(commands.Channel.OpenOk, channel=1)
        raw.send_raw(PUBLISH + HEADER5 + BODY5)
        raw.send(1, commands.Basic.Get(queue="good-q", no_ack=True))
        # the good consumer may win the race for the message: either answer is fine
        reply = raw.read_frame()
        assert reply is not None and isinstance(reply[1], (commands.Basic.GetOk, commands.Basic.GetEmpty))
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
        while True:
            got = raw.read_frame()
            assert got is not None, "closed without close-ok"
            if isinstance(got[1], commands.Connection.CloseOk):
                break
        raw.assert_closed_by_broker()
        good.check()
        assert small_broker.call(lambda: len(small_broker.broker.sessions)) in (1, 2)
    finally:
        raw.close()
        good.close()


# -- random bytes ---------------------------------------------------------------------------------------

_METHOD_IDS = sorted(commands.INDEX_MAPPING)

random_frames = st.one_of(
    st.binary(min_size=1, max_size=200),
    # well-framed frames with random payloads: these reach the method decoders and the session
    st.builds(lambda ftype, ch, payload: frame(ftype, ch, payload),
              st.sampled_from([1, 2, 3, 8, 4]), st.sampled_from([0, 1, 2]), st.binary(max_size=60)),
    st.builds(lambda mid, ch, args: frame(1, ch, struct.pack(">I", mid) + args),
              st.sampled_from(_METHOD_IDS), st.sampled_from([0, 1]), st.binary(max_size=40)),
)


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chunks=st.lists(random_frames, min_size=1, max_size=4))
def test_random_bytes_after_handshake_do_not_hurt_the_broker(broker, good, caplog, chunks):
    caplog.set_level(logging.WARNING)
    raw = Raw(broker.port)
    try:
        for chunk in chunks:
            raw.send_raw(chunk)
        # Read what comes back for a moment: a connection.close must carry a known code
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            try:
                got = raw.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            except socket.timeout:
                break
            if got is None:
                break
            if isinstance(got[1], commands.Connection.Close):
                assert got[1].reply_code in REPLY_NAMES and got[1].reply_code != 541, got[1].reply_text
                raw.send_raw(m(commands.Connection.CloseOk(), 0))
                raw.assert_closed_by_broker()
                break
    finally:
        raw.close()
    wait_sessions(broker, 1)
    good.check()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR
              and r.name.startswith(("exchange_broker", "asyncio"))]
    assert errors == [], [r.getMessage() for r in errors]
