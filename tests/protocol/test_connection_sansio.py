"""ServerConnection driven with raw bytes only: no socket, no event loop, no clock.

Frames are built with pamqp (``pamqp.frame.marshal``) or by hand with ``struct`` for
the malformed ones; output is parsed back with ``pamqp.frame.unmarshal``.
"""
from __future__ import annotations

import struct

import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import decode as pdecode
from pamqp import encode as pencode
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.core.broker import Broker
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.codec import HEARTBEAT_FRAME
from exchange_broker.protocol.connection import ServerConnection, TooLarge
from exchange_broker.protocol.constants import PROTOCOL_HEADER
from exchange_broker.protocol.errors import AMQPError

EXPECTED_CAPABILITIES = (
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
    "connection.blocked", "consumer_priorities", "authentication_failure_close", "per_consumer_qos",
)


# -- helpers -------------------------------------------------------------------------------------

class Policy:
    """Handshake callables that record what the connection asked."""

    def __init__(self) -> None:
        self.logins: list[tuple[str, bytes]] = []
        self.vhosts: list[tuple[str, str]] = []

    def authenticate(self, mechanism: str, response: bytes) -> str:
        self.logins.append((mechanism, response))
        if mechanism == "PLAIN":
            _, user, password = response.split(b"\x00")
        else:
            fields = pdecode.field_table(len(response).to_bytes(4, "big") + response)[1]
            user, password = fields["LOGIN"].encode(), fields["PASSWORD"].encode()
        if (user, password) != (b"guest", b"guest"):
            raise AMQPError(403, "Login was refused using authentication mechanism PLAIN. For details "
                            "see the broker logfile.", 10, 11, hard=True)
        return user.decode()

    def open_vhost(self, user: str, vhost: str) -> None:
        self.vhosts.append((user, vhost))
        if vhost != "/":
            raise AMQPError(530, f"vhost {vhost} not found", 10, 40, hard=True)


def new_conn(**kw) -> tuple[ServerConnection, Policy]:
    pol = Policy()
    conn = ServerConnection(pol.authenticate, pol.open_vhost, Broker().server_properties(), **kw)
    return conn, pol


def parse(data: bytes) -> list[tuple[int, object]]:
    """Split server output into (channel, pamqp frame); the 0-9-1 header comes back as bytes."""
    out = []
    while data:
        if data.startswith(b"AMQP"):
            out.append((0, data[:8]))
            data = data[8:]
            continue
        try:
            n, ch, frame = pframe.unmarshal(data)
        except pexc.UnmarshalingException:  # pragma: no cover - would be a broker bug
            raise AssertionError(f"unparseable server output {data[:40]!r}")
        out.append((ch, frame))
        data = data[n:]
    return out


def sent(conn: ServerConnection) -> list[tuple[int, object]]:
    return parse(conn.data_to_send())


def m(method, channel: int = 0) -> bytes:
    return pframe.marshal(method, channel)


def raw_frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def start_ok(mechanism: str = "PLAIN", response: str = "\x00guest\x00guest",
             capabilities: dict | None = None) -> bytes:
    caps = {"basic.nack": True} if capabilities is None else capabilities
    return m(commands.Connection.StartOk(client_properties={"product": "test", "capabilities": caps},
                                         mechanism=mechanism, response=response))


FAILURE_CLOSE = {"basic.nack": True, "authentication_failure_close": True}


def amqplain(user: str, password: str) -> str:
    """AMQPLAIN response: a field table without its 4-byte length prefix (ASCII only here)."""
    return pencode.field_table({"LOGIN": user, "PASSWORD": password})[4:].decode("ascii")


def publish_frames(channel: int, body: bytes, chunks: int = 1, exchange: str = "",
                   routing_key: str = "rk", properties=None) -> bytes:
    props = properties or commands.Basic.Properties()
    data = m(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
    data += m(pheader.ContentHeader(0, len(body), props), channel)
    if body:
        step = -(-len(body) // chunks)
        for i in range(0, len(body), step):
            data += m(pbody.ContentBody(body[i:i + step]), channel)
    return data


def opened(channels=(1,), frame_max: int = 131072, heartbeat: int = 0, **kw) -> ServerConnection:
    """A connection through the whole handshake with the given channels open; output drained."""
    conn, _ = new_conn(**kw)
    events = conn.receive_data(PROTOCOL_HEADER + start_ok())
    events += conn.receive_data(m(commands.Connection.TuneOk(2047, frame_max, heartbeat)) +
                                m(commands.Connection.Open("/")))
    for ch in channels:
        events += conn.receive_data(m(commands.Channel.Open(), ch))
    assert conn.state == "opened"
    assert [type(e) for e in events] == [ev.Opened] + [ev.ChannelOpened] * len(channels)
    out = sent(conn)
    assert [type(f) for _, f in out] == ([commands.Connection.Start, commands.Connection.Tune,
                                          commands.Connection.OpenOk] +
                                         [commands.Channel.OpenOk] * len(channels))
    return conn


def assert_conn_close(conn: ServerConnection, events: list, code: int, text: str,
                      class_id: int | None = None, method_id: int | None = None) -> None:
    """The connection answered a hard error: connection.close sent, Closing event, then close-ok."""
    out = sent(conn)
    closes = [f for ch, f in out if isinstance(f, commands.Connection.Close)]
    assert len(closes) == 1, out
    close = closes[0]
    assert close.reply_code == code, close.reply_text
    assert text in close.reply_text
    if class_id is not None:
        assert (close.class_id, close.method_id) == (class_id, method_id)
    closing = [e for e in events if isinstance(e, ev.Closing)]
    assert closing and closing[0].code == code and closing[0].by_client is False
    assert conn.state == "closing"
    # anything but close / close-ok from the peer is now ignored ...
    assert conn.receive_data(m(commands.Channel.Open(), 7) + m(commands.Basic.Qos(0, 1), 1)) == []
    assert conn.data_to_send() == b""
    # ... and the close-ok finishes the handshake
    assert [type(e) for e in conn.receive_data(m(commands.Connection.CloseOk()))] == [ev.Closed]
    assert conn.state == "closed"
    assert conn.receive_data(b"more bytes") == []


# -- protocol header -------------------------------------------------------------------------------

def test_right_header_gets_connection_start_with_capabilities():
    conn, _ = new_conn()
    assert conn.receive_data(PROTOCOL_HEADER) == []
    [(ch, start)] = sent(conn)
    assert ch == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
    assert start.locales == "en_US"
    props = start.server_properties
    for key in ("product", "version", "platform", "copyright", "information"):
        assert isinstance(props[key], str) and props[key]
    caps = props["capabilities"]
    for cap in EXPECTED_CAPABILITIES:
        assert caps[cap] is True, cap
    assert conn.state == "start"


def test_header_arriving_byte_by_byte():
    conn, _ = new_conn()
    for i in range(7):
        assert conn.receive_data(PROTOCOL_HEADER[i:i + 1]) == []
        assert conn.data_to_send() == b""
    conn.receive_data(PROTOCOL_HEADER[7:] + start_ok()[:5])
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Start]
    conn.receive_data(start_ok()[5:])
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Tune]


def test_amqp_0_9_header_is_answered_in_0_9_1():
    # rabbit_reader's version negotiation treats "AMQP 1 1 0 9" as 0-9-1 (aioamqp, Net::AMQP)
    conn, pol = new_conn()
    for i in range(7):
        assert conn.receive_data(b"AMQP\x01\x01\x00\x09"[i:i + 1]) == []
    assert conn.receive_data(b"\x09") == []
    [(ch, start)] = sent(conn)
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    events = conn.receive_data(start_ok() + m(commands.Connection.TuneOk(2047, 131072, 0)) +
                               m(commands.Connection.Open("/")))
    assert [type(e) for e in events] == [ev.Opened] and pol.logins


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",       # AMQP 0-9 (not 0-9-1)
    b"AMQP\x01\x01\x00\x0a",       # AMQP 0-10 style
    b"AMQP\x00\x01\x00\x00",       # AMQP 1.0
    b"HTTP/1.1",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"X",                          # one byte is enough to know
])
def test_wrong_header_gets_091_header_back_and_closes(header):
    conn, pol = new_conn()
    events = conn.receive_data(header)
    assert conn.data_to_send() == PROTOCOL_HEADER
    assert [type(e) for e in events] == [ev.Closing, ev.Closed]
    assert conn.state == "closed"
    assert conn.receive_data(PROTOCOL_HEADER + start_ok()) == []
    assert conn.data_to_send() == b"" and pol.logins == []


# -- start-ok / SASL -------------------------------------------------------------------------------

def test_start_ok_plain():
    conn, pol = new_conn(channel_max=100, frame_max=65536, heartbeat=30)
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    assert conn.receive_data(start_ok("PLAIN", "\x00guest\x00guest")) == []
    assert pol.logins == [("PLAIN", b"\x00guest\x00guest")]
    [(_, tune)] = sent(conn)
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (100, 65536, 30)
    assert conn.state == "tune" and conn.user == "guest"
    assert conn.client_properties["product"] == "test"
    assert conn.capabilities == {"basic.nack": True}


def test_start_ok_amqplain():
    conn, pol = new_conn()
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    response = amqplain("guest", "guest")
    conn.receive_data(start_ok("AMQPLAIN", response))
    assert pol.logins == [("AMQPLAIN", response.encode())]
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Tune]
    assert conn.user == "guest"


@pytest.mark.parametrize("mechanism,response", [
    ("PLAIN", "\x00guest\x00wrong"),
    ("AMQPLAIN", amqplain("guest", "nope")),
])
def test_bad_login_is_403(mechanism, response):
    conn, _ = new_conn()
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    events = conn.receive_data(start_ok(mechanism, response, FAILURE_CLOSE))
    assert_conn_close(conn, events, 403, "ACCESS_REFUSED - Login was refused")


def test_unsupported_mechanism_is_403():
    conn, pol = new_conn()
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    events = conn.receive_data(start_ok("EXTERNAL", "", FAILURE_CLOSE))
    assert pol.logins == []
    assert_conn_close(conn, events, 403, "unsupported authentication mechanism 'EXTERNAL'", 10, 11)


@pytest.mark.parametrize("capabilities", [{"basic.nack": True}, {},
                                          {"authentication_failure_close": False}])
@pytest.mark.parametrize("mechanism,response", [("PLAIN", "\x00guest\x00wrong"), ("EXTERNAL", "")])
def test_refused_login_without_failure_close_capability_just_closes(capabilities, mechanism, response):
    # rabbit_reader: connection.close 403 only when the client announced
    # authentication_failure_close; the others see the socket closed
    conn, _ = new_conn()
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    events = conn.receive_data(start_ok(mechanism, response, capabilities))
    assert conn.data_to_send() == b""
    assert [type(e) for e in events] == [ev.Closing, ev.Closed]
    assert events[0].code == 403 and events[1].abrupt
    assert conn.state == "closed"


# -- tune / tune-ok --------------------------------------------------------------------------------

def _tuned(frame_max: int, channel_max: int = 2047, heartbeat: int = 0, server_frame_max: int = 131072):
    conn, _ = new_conn(frame_max=server_frame_max)
    conn.receive_data(PROTOCOL_HEADER + start_ok())
    sent(conn)
    events = conn.receive_data(m(commands.Connection.TuneOk(channel_max, frame_max, heartbeat)))
    return conn, events


@pytest.mark.parametrize("frame_max,text", [
    (4095, "frame_max=4095 < 4096 min size"),
    (1024, "frame_max=1024 < 4096 min size"),
    (131073, "frame_max=131073 > 131072 max size"),
])
def test_tune_ok_frame_max_out_of_range_is_530(frame_max, text):
    conn, events = _tuned(frame_max)
    assert_conn_close(conn, events, 530, text, 10, 31)


def test_tune_ok_channel_max_above_server_is_530():
    conn, events = _tuned(131072, channel_max=5000)
    assert_conn_close(conn, events, 530, "channel_max=5000 > 2047", 10, 31)


def test_tune_ok_zero_means_server_limits():
    conn, events = _tuned(0, channel_max=0, heartbeat=0)
    assert events == [] and conn.data_to_send() == b""
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (131072, 2047, 0)
    assert conn.state == "open"


def test_tune_ok_lower_limits_are_enforced():
    conn, events = _tuned(4096, channel_max=10, heartbeat=7)
    assert events == []
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (4096, 10, 7)
    events = conn.receive_data(m(commands.Connection.Open("/")) + m(commands.Channel.Open(), 10))
    assert [type(e) for e in events] == [ev.Opened, ev.ChannelOpened]
    sent(conn)
    # a body frame of frame_max bytes of payload (8 over frame_max) is tolerated, as RabbitMQ ...
    body = b"x" * 4096
    events = conn.receive_data(publish_frames(10, body))
    assert [type(e) for e in events] == [ev.Publish] and events[0].body == body
    # ... one byte more is a frame error
    events = conn.receive_data(publish_frames(10, body + b"y"))
    assert_conn_close(conn, events, 501, "frame size 4105 exceeds frame_max 4096")


def test_channel_max_counts_open_channels_not_channel_numbers():
    conn, _ = _tuned(131072, channel_max=2)
    conn.receive_data(m(commands.Connection.Open("/")))
    sent(conn)
    events = conn.receive_data(m(commands.Channel.Open(), 65535) + m(commands.Channel.Open(), 11))
    assert events == [ev.ChannelOpened(65535), ev.ChannelOpened(11)]
    assert [ch for ch, _ in sent(conn)] == [65535, 11]
    events = conn.receive_data(m(commands.Channel.Open(), 12))
    assert_conn_close(conn, events, 530, "number of channels opened (2) has reached the negotiated "
                      "channel_max (2)")


def test_connection_open_unknown_vhost_is_530():
    conn, _ = _tuned(131072)
    events = conn.receive_data(m(commands.Connection.Open("nope")))
    assert_conn_close(conn, events, 530, "NOT_ALLOWED - vhost nope not found", 10, 40)


def test_connection_open_ok():
    conn, pol = new_conn()
    conn.receive_data(PROTOCOL_HEADER + start_ok() + m(commands.Connection.TuneOk(2047, 131072, 0)))
    sent(conn)
    events = conn.receive_data(m(commands.Connection.Open("/")))
    assert events == [ev.Opened("guest", "/", conn.client_properties)]
    assert pol.vhosts == [("guest", "/")]
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.OpenOk]


def test_whole_handshake_in_one_chunk_and_byte_by_byte():
    data = (PROTOCOL_HEADER + start_ok() + m(commands.Connection.TuneOk(2047, 131072, 0)) +
            m(commands.Connection.Open("/")) + m(commands.Channel.Open(), 1) + publish_frames(1, b"hi", 2))
    conn, _ = new_conn()
    whole = conn.receive_data(data)
    conn2, _ = new_conn()
    pieces = []
    for i in range(len(data)):
        pieces += conn2.receive_data(data[i:i + 1])
    assert whole == pieces
    assert [type(e) for e in whole] == [ev.Opened, ev.ChannelOpened, ev.Publish]
    assert whole[-1].body == b"hi"
    assert conn.data_to_send() == conn2.data_to_send()


def test_out_of_order_handshake_method():
    conn, _ = new_conn()
    conn.receive_data(PROTOCOL_HEADER)
    sent(conn)
    events = conn.receive_data(m(commands.Connection.Open("/")))
    assert_conn_close(conn, events, 504, "unexpected method Connection.Open in connection state 'start'",
                      10, 40)


# -- content assembly ------------------------------------------------------------------------------

def test_publish_split_over_several_body_frames():
    conn = opened()
    body = bytes(range(256)) * 40
    props = commands.Basic.Properties(content_type="application/octet-stream", delivery_mode=2,
                                      headers={"a": 1})
    data = publish_frames(1, body, chunks=7, exchange="amq.direct", routing_key="key", properties=props)
    events = []
    for i in range(0, len(data), 1000):  # also split across receive_data calls
        events += conn.receive_data(data[i:i + 1000])
    assert len(events) == 1
    pub = events[0]
    assert isinstance(pub, ev.Publish)
    assert (pub.channel, pub.exchange, pub.routing_key, pub.mandatory, pub.immediate) == \
        (1, "amq.direct", "key", False, False)
    assert pub.body == body
    # properties are forwarded as raw bytes: flags + values exactly as the client sent them
    assert pub.properties == m(pheader.ContentHeader(0, len(body), props), 1)[7 + 12:-1]
    assert conn.data_to_send() == b""


def test_zero_byte_body_completes_with_the_header():
    conn = opened()
    data = m(commands.Basic.Publish(exchange="", routing_key="q", mandatory=True), 1)
    data += m(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 1)
    events = conn.receive_data(data)
    assert len(events) == 1 and isinstance(events[0], ev.Publish)
    assert events[0].body == b"" and events[0].mandatory is True
    # the channel is ready for the next method straight away
    events = conn.receive_data(m(commands.Basic.Qos(0, 5), 1))
    assert isinstance(events[0], ev.Method) and isinstance(events[0].method, commands.Basic.Qos)


def test_interleaved_content_on_two_channels():
    conn = opened(channels=(1, 2))
    a = publish_frames(1, b"A" * 30, chunks=3)
    b = publish_frames(2, b"B" * 20, chunks=2)

    def split(data):
        out = []
        while data:
            n, _, _ = pframe.unmarshal(data)
            out.append(data[:n])
            data = data[n:]
        return out
    fa, fb = split(a), split(b)
    order = [fa[0], fb[0], fa[1], fb[1], fa[2], fb[2], fa[3], fb[3], fa[4]]
    events = conn.receive_data(b"".join(order))
    assert [(e.channel, e.body) for e in events] == [(2, b"B" * 20), (1, b"A" * 30)]


def test_acks_and_methods_become_events():
    conn = opened()
    events = conn.receive_data(m(commands.Basic.Ack(5, multiple=True), 1) +
                               m(commands.Basic.Nack(6, multiple=False, requeue=True), 1) +
                               m(commands.Basic.Reject(7, requeue=False), 1) +
                               m(commands.Queue.Declare(queue="q"), 1))
    assert events[:3] == [ev.Ack(1, 0, 5, True, False), ev.Ack(1, 1, 6, False, True),
                          ev.Ack(1, 2, 7, False, False)]
    assert isinstance(events[3], ev.Method) and events[3].method.queue == "q"


def test_message_larger_than_max_message_size_is_a_channel_error():
    conn = opened(channels=(1, 2), max_message_size=1024)
    events = conn.receive_data(publish_frames(1, b"x" * 1025, chunks=3))
    # the session turns this pseudo-method into a 406 channel close
    assert len(events) == 1 and isinstance(events[0].method, TooLarge)
    err = events[0].method.error()
    assert (err.code, err.hard, err.class_id, err.method_id) == (406, False, 60, 40)
    assert "message size 1025 is larger than configured max size 1024" in err.reply_text
    conn.close_channel(1, err)
    [(ch, close)] = sent(conn)
    assert ch == 1 and isinstance(close, commands.Channel.Close) and close.reply_code == 406
    # frames still in flight for the closing channel are dropped, other channels go on
    events = conn.receive_data(publish_frames(1, b"late", 1) + publish_frames(2, b"fine", 1))
    assert [(e.channel, e.body) for e in events] == [(2, b"fine")]
    events = conn.receive_data(m(commands.Channel.CloseOk(), 1))
    assert events == [ev.ChannelClosed(1)]
    events = conn.receive_data(m(commands.Channel.Open(), 1))
    assert events == [ev.ChannelOpened(1)]
    # exactly the limit is fine
    sent(conn)
    events = conn.receive_data(publish_frames(1, b"x" * 1024, chunks=2))
    assert isinstance(events[0], ev.Publish) and len(events[0].body) == 1024


def test_repeated_publishes_decoded_once_and_checked_each_time():
    """A publisher repeats the same basic.publish payload and content-header frame: the
    connection decodes them once (the messages share one properties object), yet each publish
    is still checked: the same header on another channel, a body that does not match the
    header's size, a message over the limit, a header split from its body."""
    conn = opened(channels=(1, 2), max_message_size=1024)
    props = commands.Basic.Properties(delivery_mode=2, content_type="text/plain")
    one = publish_frames(1, b"a" * 10, properties=props, routing_key="k")
    events = conn.receive_data(one * 3)
    [run] = events
    assert type(run) is ev.Publishes and [p.body for p in run.items] == [b"a" * 10] * 3
    assert [(p.routing_key, p.quick[0]) for p in run.items] == [("k", 2)] * 3
    assert run.items[0].properties is run.items[2].properties
    # the same header frame bytes, but on channel 2: decoded for channel 2
    events = conn.receive_data(publish_frames(2, b"b" * 10, properties=props, routing_key="k"))
    assert [(e.channel, e.body) for e in events] == [(2, b"b" * 10)]
    # a body split in two after the same header: frame by frame, the same message
    events = conn.receive_data(publish_frames(1, b"c" * 10, chunks=2, properties=props, routing_key="k"))
    assert [(e.channel, e.body, e.quick[0]) for e in events] == [(1, b"c" * 10, 2)]
    # input cut inside the body frame: nothing yet, then the whole publish
    data = publish_frames(1, b"d" * 10, properties=props, routing_key="k")
    assert conn.receive_data(data[:-5]) == []
    events = conn.receive_data(data[-5:])
    assert [(e.channel, e.body) for e in events] == [(1, b"d" * 10)]
    # over the limit: refused although the publish payload was seen before
    events = conn.receive_data(publish_frames(1, b"x" * 1025, properties=props, routing_key="k"))
    assert len(events) == 1 and isinstance(events[0].method, TooLarge)
    # a body frame longer than the (cached) header announced is a frame error
    bad = m(commands.Basic.Publish(exchange="", routing_key="k"), 2) + \
        m(pheader.ContentHeader(0, 10, props), 2) + raw_frame(3, 2, b"e" * 11)
    events = conn.receive_data(bad)
    assert events == [ev.Closing(501, "content body of 11 bytes exceeds the declared size 10", False)]


# -- channels and closing --------------------------------------------------------------------------

def test_channel_close_by_client():
    conn = opened(channels=(1, 2))
    events = conn.receive_data(m(commands.Channel.Close(200, "bye", 0, 0), 1))
    assert events == [ev.ChannelClosed(1)]
    [(ch, ok)] = sent(conn)
    assert ch == 1 and isinstance(ok, commands.Channel.CloseOk)
    assert 1 not in conn.channels and 2 in conn.channels
    # channel.close crossing our own channel.close is answered with close-ok
    conn.close_channel(2, AMQPError(404, "no queue 'x'", 50, 10, hard=False))
    events = conn.receive_data(m(commands.Channel.Close(200, "bye", 0, 0), 2))
    assert events == []
    out = sent(conn)
    assert [type(f) for _, f in out] == [commands.Channel.Close, commands.Channel.CloseOk]
    assert out[0][1].reply_text == "NOT_FOUND - no queue 'x'"


def test_connection_close_by_client():
    conn = opened()
    events = conn.receive_data(m(commands.Connection.Close(200, "Normal shutdown", 0, 0)))
    assert events == [ev.Closing(200, "Normal shutdown", True), ev.Closed()]
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.CloseOk]
    assert conn.state == "closed"


def test_connection_close_by_server():
    conn = opened()
    event = conn.close(320, "broker shutdown")
    assert event == ev.Closing(320, "broker shutdown", False)
    [(_, close)] = sent(conn)
    assert close.reply_code == 320 and close.reply_text == "CONNECTION_FORCED - broker shutdown"
    # a client close crossing ours is answered, then its close-ok ends the connection
    assert conn.receive_data(m(commands.Connection.Close(200, "x", 0, 0))) == []
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.CloseOk]
    assert conn.receive_data(m(commands.Connection.CloseOk())) == [ev.Closed()]


def test_garbage_after_server_close_gives_up_on_peer():
    conn = opened()
    conn.close(320, "bye")
    sent(conn)
    assert conn.receive_data(b"\xff" * 20) == [ev.Closed()]
    assert conn.state == "closed"


def test_heartbeats():
    conn = opened(heartbeat=5)
    assert conn.receive_data(HEARTBEAT_FRAME * 3) == []
    assert conn.data_to_send() == b""
    conn.send_heartbeat()
    assert conn.data_to_send() == b"\x08\x00\x00\x00\x00\x00\x00\xce"


# -- malformed input at the byte level -------------------------------------------------------------

PUB = m(commands.Basic.Publish(exchange="", routing_key="x"), 1)
HDR5 = m(pheader.ContentHeader(0, 5, commands.Basic.Properties()), 1)
BODY5 = m(pbody.ContentBody(b"hello"), 1)

MALFORMED = {
    # name: (bytes, code, text in reply, class_id, method_id)
    "bad frame-end byte": (PUB[:-1] + b"\x00", 501, "invalid frame end byte 0x00", 0, 0),
    "frame larger than frame_max": (raw_frame(1, 1, b"\x00\x3c\x00\x28" + b"\x00" * 140000), 501,
                                    "exceeds frame_max 131072", 0, 0),
    "frame header alone larger than frame_max": (struct.pack(">BHI", 3, 1, 10 ** 9), 501,
                                                 "exceeds frame_max", 0, 0),
    "unknown method id": (raw_frame(1, 1, struct.pack(">HH", 60, 999)), 540,
                          "unknown method: class 60, method 999", 60, 999),
    "unknown class id": (raw_frame(1, 1, struct.pack(">HH", 99, 1)), 540,
                         "unknown method: class 99, method 1", 99, 1),
    "truncated queue.declare": (raw_frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00\x00\x05ab"), 501,
                                "cannot decode Queue.Declare", 50, 10),
    "truncated basic.publish": (raw_frame(1, 1, struct.pack(">HH", 60, 40) + b"\x00\x00\x05ab"), 501,
                                "cannot decode basic.publish", 60, 40),
    "truncated basic.ack": (raw_frame(1, 1, struct.pack(">HHI", 60, 80, 1)), 501,
                            "cannot decode acknowledgement", None, None),
    "method frame shorter than its ids": (raw_frame(1, 1, b"\x00"), 501, "too short", 0, 0),
    "content body before header": (PUB + BODY5, 505, "expected content header for class 60, got "
                                   "content body", 60, 40),
    "content body with no publish": (BODY5, 505, "expected method frame, got non method frame", 0, 0),
    "content header with no publish": (HDR5, 505, "expected method frame, got non method frame", 0, 0),
    "method inside a content sequence": (PUB + m(commands.Basic.Qos(0, 1), 1), 505,
                                         "expected content header for class 60, got method frame",
                                         60, 10),
    "method between header and body": (PUB + HDR5 + m(commands.Basic.Qos(0, 1), 1), 505,
                                       "expected content header for class 60, got method frame",
                                       60, 10),
    "second content header": (PUB + HDR5 + HDR5, 505, "expected content body, got content header",
                              60, 40),
    "content header for another class": (
        PUB + raw_frame(2, 1, struct.pack(">HHQ", 50, 0, 5) + b"\x00\x00"), 505,
        "expected content header for class 60, got one for class 50 instead", 60, 40),
    "content header too short": (PUB + raw_frame(2, 1, b"\x00\x3c"), 501, "content header frame too short",
                                 60, 40),
    "body longer than declared": (PUB + m(pheader.ContentHeader(0, 2, commands.Basic.Properties()), 1) +
                                  BODY5, 501, "exceeds the declared size 2", 60, 40),
    "truncated content properties": (PUB + raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 5) + b"\x80\x00\x10ab"),
                                     502, "malformed content header properties", 60, 40),
    "method on unopened channel": (m(commands.Queue.Declare(queue="q"), 5), 504,
                                   "expected 'channel.open' on channel 5", 50, 10),
    "content header on unopened channel": (m(pheader.ContentHeader(0, 5, commands.Basic.Properties()), 5),
                                           505, "on channel 5, which is not open", 0, 0),
    "second channel.open": (m(commands.Channel.Open(), 1), 504, "second 'channel.open' seen on channel 1",
                            20, 10),
    "unknown frame type": (raw_frame(9, 0, b""), 501, "unknown frame type 9", 0, 0),
    "heartbeat on a channel": (raw_frame(8, 1, b""), 505, "heartbeat frame on channel 1", 0, 0),
    "queue method on channel 0": (m(commands.Queue.Declare(queue="q"), 0), 504,
                                  "unexpected method Queue.Declare in connection state 'opened'", 50, 10),
    "connection.open again": (m(commands.Connection.Open("/"), 0), 504,
                              "unexpected method Connection.Open", 10, 40),
    "connection.close-ok out of the blue": (m(commands.Connection.CloseOk(), 0), 504,
                                            "unexpected connection.close-ok", 10, 51),
    "garbage (HTTP request)": (b"GET / HTTP/1.1\r\nHost: example\r\n\r\n", 501, "exceeds frame_max", 0, 0),
    "garbage (zeros)": (b"\x00" * 16, 501, "invalid frame end byte", 0, 0),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_input(name):
    data, code, text, class_id, method_id = MALFORMED[name]
    conn = opened()
    events = conn.receive_data(data)
    assert_conn_close(conn, events, code, text, class_id, method_id)
    assert conn.channels == {}


@pytest.mark.parametrize("name", ["bad frame-end byte", "content body before header",
                                  "method on unopened channel", "unknown method id"])
def test_malformed_input_byte_by_byte(name):
    """The same verdict whatever the TCP segmentation."""
    data, code, text, class_id, method_id = MALFORMED[name]
    conn = opened()
    events = []
    for i in range(len(data)):
        events += conn.receive_data(data[i:i + 1])
    assert_conn_close(conn, events, code, text, class_id, method_id)


def test_channel_frame_before_connection_open():
    conn, _ = _tuned(131072)
    events = conn.receive_data(m(commands.Channel.Open(), 1))
    assert_conn_close(conn, events, 505, "channel frame before connection.open")


def test_frames_after_an_error_in_the_same_chunk_are_not_processed():
    conn = opened()
    events = conn.receive_data(m(commands.Queue.Declare(queue="q"), 9) + m(commands.Queue.Declare(queue="r"), 1))
    assert not any(isinstance(e, ev.Method) for e in events)
    assert_conn_close(conn, events, 504, "expected 'channel.open' on channel 9")
