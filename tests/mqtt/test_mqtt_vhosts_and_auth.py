"""Which vhost an MQTT client gets (``vhost:user``, the port-to-vhost mapping, ``mqtt.vhost``,
``mqtt.ignore_colons_in_username``) and MQTT 5 enhanced authentication, which the broker does
not offer (as RabbitMQ): CONNACK 0x8C for an Authentication Method, DISCONNECT 0x82 for an AUTH
packet, nothing else disturbed."""

from __future__ import annotations

import json
import socket

import pytest
from eb_support import pika_connect, steady_port, wait_until
from paho_support import V5, V311, Paho

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt.vhost_choice import parse_port_mapping


def _raw(port: int, first: bytes, version: int = p.V5):
    """A socket that sent ``first``; returns (socket, parser)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(first)
    return s, codec.Parser(version=version, server=False)


def _read_all(s: socket.socket, parser) -> list:
    """Every packet until the broker closes the connection."""
    got = []
    while True:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        got += parser.feed(data)
    s.close()
    return got


def _connect(version=p.V5, client_id="a", **props) -> bytes:
    return codec.encode(p.Connect(version, client_id, True, 0, "guest", b"guest", None, props), version)


# -- enhanced authentication ---------------------------------------------------------------------

def test_an_authentication_method_is_connack_0x8c(mqtt_broker):
    s, parser = _raw(mqtt_broker.mqtt_port, _connect(client_id="am", authentication_method="SCRAM-SHA-256",
                                                     authentication_data=b"n,,n=guest"))
    got = _read_all(s, parser)
    assert [type(x) for x in got] == [p.ConnAck]
    assert got[0].code == p.BAD_AUTHENTICATION_METHOD
    assert "not supported" in got[0].properties["reason_string"]


def test_authentication_data_without_a_method_is_connack_0x82(mqtt_broker):
    s, parser = _raw(mqtt_broker.mqtt_port, _connect(client_id="ad", authentication_data=b"x"))
    got = _read_all(s, parser)
    assert [(type(x), x.code) for x in got] == [(p.ConnAck, p.PROTOCOL_ERROR)]


@pytest.mark.parametrize("auth, code", [
    (codec.encode(p.Auth(0x18, {"authentication_method": "SCRAM-SHA-1"}), p.V5), p.PROTOCOL_ERROR),
    (codec.encode(p.Auth(0x19), p.V5), p.PROTOCOL_ERROR),   # re-authenticate, properties empty
    (codec.encode(p.Auth(), p.V5), p.PROTOCOL_ERROR),       # the short form
    (b"\xf0\x01\x18", p.MALFORMED_PACKET),                   # a reason code, then nothing
    (b"\xf0\x03\x18\x05\x15", p.MALFORMED_PACKET),           # properties longer than the packet
])
def test_an_auth_packet_is_a_disconnect_with_its_reason_and_nothing_else_breaks(mqtt_broker, auth, code):
    s, parser = _raw(mqtt_broker.mqtt_port, _connect(client_id="auth-pkt"))
    got = []
    while not got:
        got += parser.feed(s.recv(65536))
    assert got[0].code == p.SUCCESS
    s.sendall(auth)
    got = _read_all(s, parser)
    assert [(type(x), x.code) for x in got] == [(p.Disconnect, code)]
    if code == p.PROTOCOL_ERROR:
        assert "AUTH" in got[0].properties["reason_string"]
    other = Paho(mqtt_broker.mqtt_port, "after-auth", version=V5)
    try:
        other.subscribe("after/auth", 1)
        other.publish("after/auth", b"still fine", 1)
        assert [m.payload for m in other.wait_messages(1)] == [b"still fine"]
    finally:
        other.close()


@pytest.mark.parametrize("version", [p.V311, p.V5])
def test_auth_before_connect_or_in_311_closes_without_a_reply(mqtt_broker, version):
    auth = b"\xf0\x00"
    first = auth if version == p.V5 else _connect(p.V311, "auth-311")
    s, parser = _raw(mqtt_broker.mqtt_port, first, version)
    if version == p.V311:
        got = []
        while not got:
            got += parser.feed(s.recv(65536))
        assert got[0].code == p.SUCCESS
        s.sendall(auth)
    assert _read_all(s, parser) == []


# -- the vhost of a connection -----------------------------------------------------------------------

def _vhost_of(tb, client_id: str) -> str:
    return tb.call(lambda: tb.mqtt.hub.clients and next(
        vh for (vh, cid) in tb.mqtt.hub.clients if cid == client_id))


@pytest.fixture
def two_vhosts(mqtt_broker):
    def setup():
        b = mqtt_broker.broker
        for name in ("v-port", "a:b"):
            b.add_vhost(name)
            b.set_permissions("guest", name, ".*", ".*", ".*")
        b.add_user("team:alice", "pw", ["management"])
        b.set_permissions("team:alice", "/", ".*", ".*", ".*")
    mqtt_broker.call(setup)
    return mqtt_broker


def test_the_port_mapping_gives_the_vhost_unless_the_user_names_one(two_vhosts, paho):
    tb = two_vhosts
    settings = tb.mqtt.hub.settings
    tb.call(lambda: settings.port_vhosts.update({tb.mqtt_port: "v-port"}))
    mapped = paho("by-port")
    assert mapped.accepted and _vhost_of(tb, "by-port") == "v-port"
    named = paho("by-name", user="/:guest")
    assert named.accepted and _vhost_of(tb, "by-name") == "/"
    mapped.subscribe("iso/t", 1)
    named.subscribe("iso/t", 1)
    paho("by-port-pub").publish("iso/t", b"in v-port", 1)
    assert [m.payload for m in mapped.wait_messages(1)] == [b"in v-port"]
    wait_until(lambda: False, 0.3)
    assert named.messages == []  # another vhost, another amq.topic
    tb.call(lambda: settings.port_vhosts.update({tb.mqtt_port: "missing"}))
    refused = Paho(tb.mqtt_port, "to-missing", version=V311)
    try:
        assert str(refused.connack[1]) == "Not authorized"  # 3.1.1's code 5
    finally:
        refused.close()


def test_the_last_colon_splits_and_colons_can_be_part_of_the_name(two_vhosts, paho):
    tb = two_vhosts
    c = paho("colon", user="a:b:guest")
    assert c.accepted and _vhost_of(tb, "colon") == "a:b"
    split = paho("alice-split", user="team:alice", password="pw")  # user "alice" in vhost "team"
    assert str(split.connack[1]) == "Bad user name or password"
    tb.call(lambda: setattr(tb.mqtt.hub.settings, "ignore_colons_in_username", True))
    alice = paho("alice", user="team:alice", password="pw")
    assert alice.accepted and _vhost_of(tb, "alice") == "/"


def test_port_mapping_text_is_checked():
    assert parse_port_mapping('{"1883": "v1", "8883": "v2"}') == {1883: "v1", 8883: "v2"}
    assert parse_port_mapping(None) == {} and parse_port_mapping("") == {}
    for bad in ("{", '["1883"]', '{"a": "v"}', '{"0": "v"}', '{"70000": "v"}', '{"1883": 5}', '{"1883": ""}'):
        with pytest.raises(ValueError):
            parse_port_mapping(bad)


@pytest.mark.slow  # a broker process: a few seconds on the loaded machine
def test_serve_flag_maps_each_listener_to_its_vhost(spawn_broker, tmp_path):
    tcp, ws = steady_port(), steady_port()
    defs = tmp_path / "defs.json"
    defs.write_text(json.dumps({
        "vhosts": [{"name": "/"}, {"name": "devices"}, {"name": "browsers"}],
        "permissions": [{"user": "guest", "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
                        for v in ("/", "devices", "browsers")]}))
    mapping = json.dumps({str(tcp): "devices", str(ws): "browsers"})
    broker = spawn_broker("--mqtt-port", str(tcp), "--mqtt-ws-port", str(ws), "--load-definitions", str(defs),
                          "--mqtt-port-to-vhost-mapping", mapping)
    conn = pika_connect(broker.port, vhost="devices")
    device = browser = None
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "plant.*.temp")
        device = Paho(tcp, "dev-1")
        browser = Paho(ws, "web-1", websocket=True)
        browser.subscribe("plant/+/temp", 1)
        device.publish("plant/7/temp", b"21.5", 1)
        assert wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 1, 10)
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert (method.routing_key, body) == ("plant.7.temp", b"21.5")
        wait_until(lambda: False, 0.3)
        assert browser.messages == []  # the WebSocket listener's vhost is another
    finally:
        for c in (device, browser):
            if c is not None:
                c.close()
        if conn.is_open:
            conn.close()
