"""Limits with clear errors: each offender is closed with RabbitMQ's code and text, and a
well-behaved pika client on the same broker keeps working throughout.

Codes and texts were compared by hand with RabbitMQ 3.10 (raw frames against 127.0.0.1:5672):
* a channel.open beyond the negotiated channel_max -> connection.close 530 NOT_ALLOWED
  "number of channels opened (N) has reached the negotiated channel_max (N)", class/method 0/0;
* a frame larger than the negotiated frame_max -> 501 FRAME_ERROR;
* a message larger than max_message_size -> channel.close 406 PRECONDITION_FAILED
  "message size N is larger than configured max size M" (the connection stays open);
* the node connection limit (RabbitMQ's ``connection_max``, 3.11+): 530 at connection.open,
  "connection refused: node connection limit (N) is reached";
* a socket that does not finish the handshake in time, or stops sending heartbeats, is closed
  without a connection.close (RabbitMQ's handshake_timeout and heartbeat behaviour).
"""

from __future__ import annotations

import socket
import time

import pika
import pytest
from pamqp import commands
from sec_helpers import PROTOCOL_HEADER, Raw, close_quietly, connect, roundtrip, wait_for

from exchange_broker.protocol.constants import MAX_MESSAGE_SIZE_DEFAULT
from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def good(request):
    """A pika connection opened before the offender; checked after it."""
    holder = {}

    def open_for(port):
        conn = connect(port)
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        holder.update(conn=conn, ch=ch, q=q)
        return holder

    yield open_for
    close_quietly(holder.get("conn"))


def still_good(holder) -> None:
    """The good client still works; then it leaves (before the broker stops, so no shutdown wait)."""
    ch, q = holder["ch"], holder["q"]
    ch.basic_publish("", q, b"still here")
    assert wait_for(lambda: ch.queue_declare(q, passive=True).method.message_count == 1)
    assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    holder["conn"].close()


def test_default_max_message_size_is_128_mib():
    assert MAX_MESSAGE_SIZE_DEFAULT == 128 * 1024 * 1024
    from exchange_broker.cli import build_parser
    args = build_parser().parse_args(["serve"])
    assert args.max_message_size == 128 * 1024 * 1024


def test_message_larger_than_max_message_size_closes_the_channel_only(good):
    with ThreadedBroker(limits={"max_message_size": 1000}) as tb:
        h = good(tb.port)
        conn = connect(tb.port)
        ch = conn.channel()
        ch.queue_declare("big")
        ch.basic_publish("", "big", b"x" * 1000)  # exactly the limit: fine
        ch.basic_publish("", "big", b"x" * 1001)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("big", passive=True)
        assert info.value.reply_code == 406
        assert info.value.reply_text == ("PRECONDITION_FAILED - message size 1001 is larger than "
                                         "configured max size 1000")
        ch2 = conn.channel()  # the connection is still open
        assert ch2.queue_declare("big", passive=True).method.message_count == 1
        close_quietly(conn)
        still_good(h)


def test_frame_larger_than_frame_max_is_501(good):
    with ThreadedBroker() as tb:
        h = good(tb.port)
        raw = Raw(tb.port, frame_max=4096)
        assert isinstance(raw.opened[1], commands.Connection.OpenOk)
        raw.send(commands.Channel.Open(), 1)
        raw.expect(commands.Channel.OpenOk)
        raw.send(commands.Queue.Declare(queue="q", arguments={"pad": "x" * 5000}), 1)
        close = raw.expect(commands.Connection.Close)
        assert close.reply_code == 501 and "exceeds frame_max 4096" in close.reply_text
        raw.send(commands.Connection.CloseOk())
        assert raw.closed_by_peer()
        # a frame_max above the server's is refused at tune-ok (RabbitMQ just drops the socket)
        raw2 = Raw(tb.port, frame_max=1 << 20)
        assert raw2.opened is not None and raw2.opened[1].reply_code == 530
        raw2.close()
        still_good(h)


def test_channel_max_counts_open_channels(good):
    with ThreadedBroker(limits={"channel_max": 4}) as tb:
        h = good(tb.port)
        raw = Raw(tb.port)
        assert raw.tune.channel_max == 4
        for n in (1, 2, 3, 4):
            raw.send(commands.Channel.Open(), n)
            raw.expect(commands.Channel.OpenOk)
        raw.send(commands.Channel.Open(), 5)
        close = raw.expect(commands.Connection.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
        assert close.reply_text == ("NOT_ALLOWED - number of channels opened (4) has reached the "
                                    "negotiated channel_max (4)")
        raw.close()
        # pika honours the negotiated channel_max itself
        conn = connect(tb.port)
        chans = [conn.channel() for _ in range(4)]
        with pytest.raises(pika.exceptions.NoFreeChannels):
            conn.channel()
        chans[0].close()
        conn.channel()  # a freed number can be used again
        close_quietly(conn)
        still_good(h)


def test_max_channels_per_connection_option_caps_channel_max():
    from exchange_broker.app import limits_from
    from exchange_broker.cli import build_parser
    from exchange_broker.config import Config
    args = Config.from_namespace(build_parser().parse_args(["serve", "--max-channels-per-connection", "16"]))
    assert limits_from(args)["channel_max"] == 16
    args = Config.from_namespace(build_parser().parse_args(["serve", "--channel-max", "8",
                                                            "--max-channels-per-connection", "16"]))
    assert limits_from(args)["channel_max"] == 8


def test_max_connections_refuses_the_extra_connection_with_530():
    with ThreadedBroker() as tb:
        tb.broker.max_connections = 3
        conns = [connect(tb.port) for _ in range(3)]
        raw = Raw(tb.port)
        close = raw.opened[1]
        assert isinstance(close, commands.Connection.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
        assert close.reply_text == "NOT_ALLOWED - connection refused: node connection limit (3) is reached"
        raw.send(commands.Connection.CloseOk())
        assert raw.closed_by_peer()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(tb.port)
        for c in conns:  # the three keep working
            ch = c.channel()
            ch.queue_declare("", exclusive=True)
        conns.pop().close()
        assert wait_for(lambda: len(tb.broker.sessions) == 2)
        roundtrip(tb.port)  # room for one again
        for c in conns:
            c.close()


def test_handshake_timeout_closes_stalled_sockets(good):
    with ThreadedBroker(handshake_timeout=1) as tb:
        h = good(tb.port)
        silent = socket.create_connection(("127.0.0.1", tb.port), timeout=10)
        partial = Raw(tb.port, handshake=False)
        partial.sock.sendall(PROTOCOL_HEADER)
        partial.expect(commands.Connection.Start)  # ... and never answers
        half_header = socket.create_connection(("127.0.0.1", tb.port), timeout=10)
        half_header.sendall(b"AMQ")
        t0 = time.monotonic()
        for s in (silent, partial.sock, half_header):
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
        assert time.monotonic() - t0 < 5
        for s in (silent, partial.sock, half_header):
            s.close()
        assert wait_for(lambda: len(tb.server.protocols) == 1)  # only the good client is left
        still_good(h)


def test_missed_heartbeats_close_the_connection(good):
    with ThreadedBroker(limits={"heartbeat": 1}) as tb:
        h = good(tb.port)
        raw = Raw(tb.port, heartbeat=1)
        assert raw.tune.heartbeat == 1
        t0 = time.monotonic()
        assert raw.closed_by_peer(timeout=8)  # no heartbeats from us: dropped after ~2 intervals
        assert 1.5 < time.monotonic() - t0 < 6
        # a client that does heartbeat (pika) stays connected through the same period
        alive = connect(tb.port, heartbeat=1)
        alive.sleep(2.5)
        assert alive.is_open
        alive.channel().queue_declare("", exclusive=True)
        close_quietly(alive)
        still_good(h)
