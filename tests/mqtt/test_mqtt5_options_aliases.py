"""MQTT 5 subscription options (no-local, retain-as-published) and topic aliases from the broker
to the client, with paho-mqtt, the npm mqtt client, a raw socket client built on the codec and
mosquitto_sub; the
server's own alias checks (0 or over its maximum: DISCONNECT 0x94)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest
from eb_support import wait_until
from node_support import NODE_DIR, ensure_mqtt_npm
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from paho_support import V5, V311

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p


def props(kind=PacketTypes.PUBLISH, **values) -> Properties:
    pr = Properties(kind)
    for name, value in values.items():
        setattr(pr, name, value)
    return pr


class Raw:
    """An MQTT 5 client on a plain socket: ``send`` packets, ``read`` decoded ones."""

    def __init__(self, port: int, client_id: str, **connect_props) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.parser = codec.Parser(version=p.V5, server=False)
        self.got: list = []
        self.send(p.Connect(p.V5, client_id, True, 0, "guest", b"guest", None, connect_props))
        ack = self.read(p.ConnAck)
        assert ack.code == p.SUCCESS, ack

    def send(self, pkt) -> None:
        self.sock.sendall(codec.encode(pkt, p.V5))

    def read(self, kind=None):
        while True:
            while not self.got:
                data = self.sock.recv(65536)
                if not data:
                    raise EOFError("connection closed")
                self.got += self.parser.feed(data)
            pkt = self.got.pop(0)
            if kind is None or isinstance(pkt, kind):
                return pkt

    def closed(self) -> bool:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.got += self.parser.feed(data)
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(mqtt_broker):
    made = []

    def _make(client_id: str, **connect_props) -> Raw:
        c = Raw(mqtt_broker.mqtt_port, client_id, **connect_props)
        made.append(c)
        return c
    yield _make
    for c in made:
        c.close()


def test_no_local_keeps_a_clients_own_publishes_from_it(paho):
    me = paho("nl-me", version=V5)
    me.subscribe("nl/#", 0, options=SubscribeOptions(qos=1, noLocal=True))
    other = paho("nl-other", version=V5)
    other.subscribe("nl/#", 1)
    me.publish("nl/mine", b"from me", 1)
    paho("nl-third", version=V5).publish("nl/theirs", b"from a third", 1)
    assert [m.payload for m in me.wait_messages(1)] == [b"from a third"]
    assert sorted(m.payload for m in other.wait_messages(2)) == [b"from a third", b"from me"]
    wait_until(lambda: False, 0.3)
    assert [m.payload for m in me.messages] == [b"from a third"]


def test_no_local_filter_does_not_hide_an_overlapping_ordinary_one(paho):
    me = paho("nl-both", version=V5)
    me.subscribe("both/#", 0, options=SubscribeOptions(qos=1, noLocal=True))
    me.subscribe("both/+/x", 1)
    me.publish("both/a/x", b"matches both", 1)
    me.publish("both/a/y", b"only no-local", 1)
    me.publish("both/a/x", b"end", 1)
    assert [m.payload for m in me.wait_messages(2)] == [b"matches both", b"end"]


def test_no_local_survives_a_persistent_session(paho):
    kept = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    me = paho("nl-kept", version=V5, properties=kept)
    me.subscribe("kept/#", 0, options=SubscribeOptions(qos=1, noLocal=True))
    me.close()
    again = paho("nl-kept", version=V5, clean_start=False, properties=kept)
    assert again.connack[0] is True
    again.publish("kept/1", b"own", 1)
    paho("nl-kept-other", version=V5).publish("kept/2", b"other", 1)
    assert [m.payload for m in again.wait_messages(1)] == [b"other"]
    wait_until(lambda: False, 0.3)
    assert len(again.messages) == 1


def test_no_local_on_a_shared_subscription_is_a_protocol_error(raw):
    c = raw("nl-shared")
    c.send(p.Subscribe(1, [p.Subscription("$share/g/t", 1, no_local=True)]))
    d = c.read(p.Disconnect)
    assert d.code == p.PROTOCOL_ERROR
    assert c.closed()


def test_retain_as_published_keeps_the_retain_flag_and_others_lose_it(paho):
    rap = paho("rap-on", version=V5)
    rap.subscribe("rap/#", 0, options=SubscribeOptions(qos=1, retainAsPublished=True))
    plain = paho("rap-off", version=V5)
    plain.subscribe("rap/#", 1)
    old = paho("rap-311", version=V311)
    old.subscribe("rap/#", 1)
    pub = paho("rap-pub", version=V5)
    pub.publish("rap/t", b"retained", 1, retain=True)
    pub.publish("rap/t", b"live", 1)
    assert [(m.payload, m.retain) for m in rap.wait_messages(2)] == [(b"retained", True), (b"live", False)]
    assert [(m.payload, m.retain) for m in plain.wait_messages(2)] == [(b"retained", False), (b"live", False)]
    assert [(m.payload, m.retain) for m in old.wait_messages(2)] == [(b"retained", False), (b"live", False)]
    late = paho("rap-late", version=V5)  # what a new subscription gets is retained, options or not
    late.subscribe("rap/#", 1)
    assert [(m.payload, m.retain) for m in late.wait_messages(1)] == [(b"retained", True)]


def test_retain_handling_1_sends_retained_only_to_a_new_subscription(raw, paho):
    paho("rh1-pub", version=V5).publish("rh1/t", b"kept", 1, retain=True)
    c = raw("rh1")
    c.send(p.Subscribe(1, [p.Subscription("rh1/#", 0, retain_handling=1)]))
    assert c.read(p.SubAck).codes == [0]
    first = c.read(p.Publish)
    assert (first.topic, first.payload, first.retain) == ("rh1/t", b"kept", True)
    c.send(p.Subscribe(2, [p.Subscription("rh1/#", 0, retain_handling=1)]))  # exists: no retained
    c.send(p.PingReq())
    assert c.read(p.SubAck).packet_id == 2
    assert isinstance(c.read(), p.PingResp)


def test_topic_aliases_towards_a_client_that_allows_them(raw, paho):
    c = raw("alias-out", topic_alias_maximum=2)
    c.send(p.Subscribe(1, [p.Subscription("al/#", 0)], {"subscription_identifier": [9]}))
    assert c.read(p.SubAck).codes == [0]
    pub = paho("alias-out-pub", version=V5)
    for topic in ("al/one", "al/one", "al/two", "al/three", "al/two", "al/three"):
        pub.publish(topic, topic.encode(), 1)
    got = [c.read(p.Publish) for _ in range(6)]
    seen = [(x.topic, x.properties.get("topic_alias"), x.payload) for x in got]
    assert seen == [("al/one", 1, b"al/one"), ("", 1, b"al/one"), ("al/two", 2, b"al/two"),
                    ("al/three", None, b"al/three"),  # only 2 aliases allowed: the name itself
                    ("", 2, b"al/two"), ("al/three", None, b"al/three")]
    assert all(x.properties["subscription_identifier"] == [9] for x in got)


def test_no_topic_alias_without_the_clients_maximum(raw, paho):
    c = raw("alias-none")
    c.send(p.Subscribe(1, [p.Subscription("an/#", 0)]))
    c.read(p.SubAck)
    pub = paho("alias-none-pub", version=V5)
    pub.publish("an/t", b"1", 1)
    pub.publish("an/t", b"2", 1)
    got = [c.read(p.Publish) for _ in range(2)]
    assert [(x.topic, "topic_alias" in x.properties) for x in got] == [("an/t", False), ("an/t", False)]


@pytest.mark.parametrize("alias", [0, 17])
def test_an_inbound_alias_of_0_or_over_the_maximum_is_disconnect_0x94(raw, alias):
    c = raw(f"alias-bad-{alias}")
    c.send(p.Publish("t/x", b"x", 1, packet_id=1, properties={"topic_alias": alias}))
    d = c.read(p.Disconnect)
    assert d.code == p.TOPIC_ALIAS_INVALID
    assert c.closed()


def test_npm_mqtt_client_resolves_the_aliases_the_broker_sends(mqtt_broker):
    node = ensure_mqtt_npm()
    proc = subprocess.run([node, "mqtt5_options.js", f"mqtt://127.0.0.1:{mqtt_broker.mqtt_port}"],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc={proc.returncode}): {proc.stderr}"
    out = json.loads(lines[-1])
    assert "error" not in out, out["error"]
    assert out["got"] == [
        {"topic": "na/long/topic/name", "payload": "kept", "retain": True, "alias": 1},
        {"topic": "na/long/topic/name", "payload": "m2", "retain": False, "alias": 1},
        {"topic": "na/long/topic/name", "payload": "m3", "retain": False, "alias": 1},
        {"topic": "na/other", "payload": "m4", "retain": False, "alias": 2}]


def test_mosquitto_sub_gets_no_alias_unless_it_asks(mqtt_broker, paho):
    """libmosquitto 2.0 cannot resolve aliases it receives; it never sets Topic Alias Maximum
    unless told to (-D connect topic-alias-maximum), so it gets whole topic names."""
    if shutil.which("mosquitto_sub") is None:
        pytest.skip("mosquitto-clients is not installed")
    port = str(mqtt_broker.mqtt_port)
    sub = subprocess.Popen(["mosquitto_sub", "-V", "mqttv5", "-h", "127.0.0.1", "-p", port, "-u", "guest",
                            "-P", "guest", "-i", "msub-alias", "-t", "ma/#", "-q", "1", "-C", "3", "-v"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mqtt_broker.call(
            lambda: "mqtt-subscription-msub-aliasqos1" in mqtt_broker.broker.vhosts["/"].queues), 10)
        pub = paho("ma-pub", version=V5)
        for i in (1, 2, 3):
            pub.publish("ma/long/topic", f"m{i}".encode(), 1)
        out, err = sub.communicate(timeout=20)
        assert sub.returncode == 0, err
        assert out.splitlines() == ["ma/long/topic m1", "ma/long/topic m2", "ma/long/topic m3"]
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
