"""ClientConnection (the sans-IO client) driven with raw bytes, then against the server's
ServerConnection in memory (client bytes -> server -> client): no socket, no event loop.

Server-side frames are built with pamqp (an independent encoder); the client's output is parsed
back with ``pamqp.frame.unmarshal``.
"""
from __future__ import annotations

import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.protocol import codec, frames
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.client import ClientConnection
from exchange_broker.protocol.connection import ServerConnection
from exchange_broker.protocol.constants import PROTOCOL_HEADER
from exchange_broker.protocol.errors import AMQPError


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    out, pos = [], 0
    while pos < len(data):
        used, channel, f = pframe.unmarshal(data[pos:])
        out.append((channel, f))
        pos += used
    return out


def marshal(channel: int, *fs) -> bytes:
    return b"".join(pframe.marshal(f, channel) for f in fs)


def opened_client(**kw) -> ClientConnection:
    c = ClientConnection("guest", "secret", "/v", **kw)
    assert c.data_to_send() == PROTOCOL_HEADER
    assert c.receive_data(marshal(0, commands.Connection.Start(
        server_properties={"product": "test"}, mechanisms="AMQPLAIN PLAIN"))) == []
    c.receive_data(marshal(0, commands.Connection.Tune(channel_max=100, frame_max=8192, heartbeat=30)))
    events = c.receive_data(marshal(0, commands.Connection.OpenOk()))
    assert events == [ev.Connected({"product": "test"}, 8192, 100, 10 if kw.get("heartbeat") == 10 else 30)]
    c.data_to_send()
    return c


def test_handshake_from_raw_bytes_negotiates_and_logs_in_with_plain():
    c = ClientConnection("guest", "secret", "/v", heartbeat=10, client_properties={"product": "p"})
    assert c.data_to_send() == PROTOCOL_HEADER
    c.receive_data(marshal(0, commands.Connection.Start(mechanisms="PLAIN")))
    (_, start_ok), = unmarshal_all(c.data_to_send())
    assert (start_ok.mechanism, start_ok.response) == ("PLAIN", "\0guest\0secret")
    assert start_ok.client_properties["product"] == "p"
    assert start_ok.client_properties["capabilities"]["publisher_confirms"] is True
    # the tune arrives in two pieces: nothing happens until the frame is whole
    tune = marshal(0, commands.Connection.Tune(channel_max=0, frame_max=1 << 20, heartbeat=60))
    assert c.receive_data(tune[:5]) == [] and c.data_to_send() == b""
    c.receive_data(tune[5:])
    (_, tune_ok), (_, open_) = unmarshal_all(c.data_to_send())
    # frame_max capped at ours, channel_max 0 (no limit) -> ours, heartbeat the smaller
    assert (tune_ok.frame_max, tune_ok.channel_max, tune_ok.heartbeat) == (131072, 2047, 10)
    assert open_.virtual_host == "/v"
    events = c.receive_data(marshal(0, commands.Connection.OpenOk()))
    assert events == [ev.Connected({}, 131072, 2047, 10)] and c.state == "opened"


@pytest.mark.parametrize("mine, theirs, agreed", [(None, 60, 60), (0, 60, 0), (10, 0, 10), (30, 5, 5)])
def test_heartbeat_negotiation(mine, theirs, agreed):
    c = ClientConnection("u", "p", heartbeat=mine)
    c.receive_data(marshal(0, commands.Connection.Start(mechanisms="PLAIN"),
                           commands.Connection.Tune(heartbeat=theirs)))
    assert c.heartbeat == agreed


def test_deliveries_confirms_and_methods_come_up_as_events():
    c = opened_client()
    props = commands.Basic.Properties(message_id="m1", headers={"a": 1})
    body = b"x" * 20000  # over three body frames of frame_max 8192
    data = marshal(1, commands.Basic.Deliver(consumer_tag="ct", delivery_tag=7, redelivered=True,
                                             exchange="ex", routing_key="rk"),
                   pheader.ContentHeader(0, len(body), props))
    data += b"".join(pframe.marshal(pbody.ContentBody(body[i:i + 8184]), 1) for i in range(0, len(body), 8184))
    data += marshal(1, commands.Basic.Ack(delivery_tag=3, multiple=True),
                    commands.Basic.Nack(delivery_tag=4), commands.Basic.QosOk())
    data += marshal(2, commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="q", message_count=5),
                    pheader.ContentHeader(0, 0, commands.Basic.Properties()))
    data += marshal(0, commands.Connection.Blocked(reason="low on memory")) + codec.HEARTBEAT_FRAME
    events = []
    for i in range(0, len(data), 1000):  # any split gives the same events
        events += c.receive_data(data[i:i + 1000])
    d = events[0].delivery
    assert (events[0].channel, d.consumer_tag, d.delivery_tag, d.redelivered, d.exchange, d.routing_key,
            d.body) == (1, "ct", 7, True, "ex", "rk", body)
    parsed = codec.parse_properties(d.properties)  # raw bytes, as the server sent them
    assert (parsed["message_id"], parsed["headers"]) == ("m1", {"a": 1})
    assert events[1:3] == [ev.Confirm(1, 3, True, True), ev.Confirm(1, 4, False, False)]
    assert isinstance(events[3], ev.Method) and isinstance(events[3].method, commands.Basic.QosOk)
    got = events[4].delivery
    assert (events[4].channel, got.message_count, got.routing_key, got.body) == (2, 5, "q", b"")
    assert isinstance(events[5].method, commands.Connection.Blocked)
    assert len(events) == 6


def test_publish_and_ack_frames_decode_with_pamqp():
    c = opened_client()
    c.publish(3, "ex", "key", codec.encode_properties({"delivery_mode": 2}), b"b" * 9000, mandatory=True)
    c.ack(3, 12, multiple=True)
    c.nack(3, 13, requeue=False)
    frames_ = unmarshal_all(c.data_to_send())
    (ch, pub), (_, head), (_, b1), (_, b2), (_, ack), (_, nack) = frames_
    assert (ch, pub.exchange, pub.routing_key, pub.mandatory) == (3, "ex", "key", True)
    assert head.body_size == 9000 and head.properties.delivery_mode == 2
    assert len(b1.value) == 8192 - 8 and b1.value + b2.value == b"b" * 9000
    assert (ack.delivery_tag, ack.multiple) == (12, True)
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (13, False, False)


def test_small_and_empty_publishes_decode_with_pamqp():
    """The usual publish (one body frame) is packed in one piece, the body passed as it is; an
    empty body has no body frame. pamqp reads both as the same frames."""
    c = opened_client()
    props = codec.encode_properties({"delivery_mode": 2, "headers": {"k": "v"}})
    c.publish(5, "", "queue-\u00e9", props, b"hello", mandatory=True)
    c.publish(5, "amq.direct", "k", props, b"", mandatory=False)
    (ch, pub), (_, head), (_, body), (_, pub2), (_, head2) = unmarshal_all(c.data_to_send())
    assert (ch, pub.exchange, pub.routing_key, pub.mandatory) == (5, "", "queue-\u00e9", True)
    assert head.body_size == 5 and head.properties.headers == {"k": "v"} and body.value == b"hello"
    assert (pub2.exchange, pub2.routing_key, pub2.mandatory, head2.body_size) == ("amq.direct", "k", False, 0)


def test_server_close_is_answered_and_reported():
    c = opened_client()
    events = c.receive_data(marshal(0, commands.Connection.Close(320, "CONNECTION_FORCED - bye", 0, 0)))
    assert events == [ev.Closing(320, "CONNECTION_FORCED - bye", False), ev.Closed()]
    assert isinstance(unmarshal_all(c.data_to_send())[0][1], commands.Connection.CloseOk)
    assert c.receive_data(b"anything") == []


def test_own_close_ends_with_close_ok():
    c = opened_client()
    c.close()
    assert isinstance(unmarshal_all(c.data_to_send())[0][1], commands.Connection.Close)
    # a delivery the server sent before it saw the close is dropped quietly
    late = marshal(1, commands.Basic.Deliver(consumer_tag="ct", delivery_tag=9, exchange="", routing_key="q"),
                   pheader.ContentHeader(0, 1, commands.Basic.Properties())) + pframe.marshal(pbody.ContentBody(b"x"), 1)
    assert c.receive_data(late) == []
    assert c.receive_data(marshal(0, commands.Connection.CloseOk())) == [ev.Closed()]


@pytest.mark.parametrize("data, message", [
    (b"AMQP\x00\x00\x09\x00", "refused the protocol header"),
    (marshal(0, commands.Connection.Start(mechanisms="AMQPLAIN")), "no PLAIN"),
    (marshal(0, commands.Connection.Tune()), "expected connection.start"),
    (frames.frame(1, 0, b"\x00\x0a\x00\x0a")[:-1] + b"\x00", "invalid frame end"),
])
def test_bad_input_raises_a_clear_error(data, message):
    c = ClientConnection("u", "p")
    with pytest.raises(AMQPError, match=message):
        c.receive_data(data)
    assert c.state == "closed"


def test_content_out_of_order_is_a_protocol_error():
    c = opened_client()
    with pytest.raises(AMQPError, match="unexpected content body"):
        c.receive_data(pframe.marshal(pbody.ContentBody(b"x"), 1))


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_a_truncated_deliver_is_a_protocol_error(cut):
    c = opened_client()
    whole = marshal(1, commands.Basic.Deliver(consumer_tag="ct", delivery_tag=1, exchange="ex", routing_key="rk"))
    payload = whole[7:-1][:-cut]
    with pytest.raises(AMQPError, match="cannot decode a content method"):
        c.receive_data(frames.frame(1, 1, payload))


# -- against the server's connection, in memory ------------------------------------------------

def pump(client: ClientConnection, server: ServerConnection) -> tuple[list, list]:
    """Move bytes both ways until neither side has anything to say."""
    server_events, client_events = [], []
    while True:
        data = client.data_to_send()
        if data:
            server_events += server.receive_data(data)
        back = server.data_to_send()
        if back:
            client_events += client.receive_data(back)
        if not data and not back:
            return server_events, client_events


def login(mechanism: str, response: bytes) -> str:
    _, user, password = response.split(b"\0")
    if password != b"pw":
        raise AMQPError(403, "ACCESS_REFUSED - Login was refused", 10, 11, hard=True)
    return user.decode()


def test_client_against_the_server_connection():
    server = ServerConnection(login, lambda user, vhost: None, {"product": "exchange-broker"},
                              frame_max=4096, heartbeat=0)
    client = ClientConnection("alice", "pw", "/", heartbeat=15)
    server_events, client_events = pump(client, server)
    assert server_events == [ev.Opened("alice", "/", client.client_properties)]
    assert client_events == [ev.Connected({"product": "exchange-broker"}, 4096, 2047, 15)]
    assert (server.frame_max, server.heartbeat) == (4096, 15)

    client.send_method(1, commands.Channel.Open())
    server_events, client_events = pump(client, server)
    assert server_events == [ev.ChannelOpened(1)]
    assert isinstance(client_events[0].method, commands.Channel.OpenOk)

    props = codec.encode_properties({"content_type": "text/plain", "headers": {"k": "v"}})
    body = bytes(range(256)) * 40  # 10240 bytes: three body frames at frame_max 4096
    client.publish(1, "amq.direct", "rk", props, body)
    client.publish(1, "", "q", b"\x00\x00", b"")
    server_events, _ = pump(client, server)
    (pubs,) = server_events
    assert [(p.exchange, p.routing_key, p.properties, p.body) for p in pubs.items] == \
        [("amq.direct", "rk", props, body), ("", "q", b"\x00\x00", b"")]

    # the server's deliveries and confirms, encoded by its fast paths, read by the client
    server.send_parts(codec.deliver_frames(1, codec.short_str("ctag"), 1, False, codec.short_str("amq.direct"),
                                           codec.short_str("rk"), props, body, server.frame_max))
    server.send_raw(codec.ack_frame(1, 2, True))
    _, client_events = pump(client, server)
    delivered, confirm = client_events
    assert (delivered.delivery.consumer_tag, delivered.delivery.body, delivered.delivery.properties) == \
        ("ctag", body, props)
    assert confirm == ev.Confirm(1, 2, True, True)

    # a small body takes the server's one-pack fast path
    server.send_parts(codec.deliver_frames(1, codec.short_str("ctag"), 2, True, codec.short_str(""),
                                           codec.short_str("q"), b"\x00\x00", b"small", server.frame_max))
    _, (small,) = pump(client, server)
    assert (small.delivery.delivery_tag, small.delivery.redelivered, small.delivery.exchange,
            small.delivery.routing_key, small.delivery.properties, small.delivery.body) == \
        (2, True, "", "q", b"\x00\x00", b"small")

    client.ack(1, 1)
    server_events, _ = pump(client, server)
    assert server_events == [ev.Ack(1, 0, 1, False, False)]

    client.close()
    server_events, client_events = pump(client, server)
    assert [type(e) for e in server_events] == [ev.Closing, ev.Closed]
    assert client_events == [ev.Closed()] and client.state == "closed"


def test_a_refused_login_reaches_the_client_as_a_close():
    server = ServerConnection(login, lambda user, vhost: None, {})
    client = ClientConnection("alice", "wrong")
    server_events, client_events = pump(client, server)
    assert [type(e) for e in server_events] == [ev.Closing, ev.Closed]  # the client's close-ok
    assert client_events[0].code == 403 and type(client_events[1]) is ev.Closed
