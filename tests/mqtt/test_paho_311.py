"""paho-mqtt (MQTT 3.1.1) against the broker's MQTT listener: QoS 0/1 round trips, wildcards,
retained messages, the last will, takeover, users and permissions, malformed and oversized
packets closing only their connection."""

from __future__ import annotations

import logging
import socket

from eb_support import uniq, wait_until

from exchange_broker.core import permissions as perms
from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p


def test_qos0_and_qos1_round_trips(paho):
    sub = paho("sub")
    assert sub.subscribe("sensors/+/temp", 1)[0].value == 1
    assert sub.subscribe("alerts/#", 0)[0].value == 0
    pub = paho("pub")
    pub.publish("sensors/7/temp", b"21.5", qos=1)
    pub.publish("sensors/8/temp", b"19.0", qos=0)
    pub.publish("alerts/fire/now", b"!", qos=1)   # delivered at the subscription's QoS 0
    pub.publish("sensors/7/humidity", b"no", qos=1)  # matches nothing
    got = sub.wait_messages(3)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        ("alerts/fire/now", b"!", 0), ("sensors/7/temp", b"21.5", 1), ("sensors/8/temp", b"19.0", 0)]


def test_wildcards_match_as_mqtt_says(paho):
    sub = paho("w")
    sub.subscribe("a/+", 1)
    sub.subscribe("b/#", 1)
    pub = paho("wp")
    for t in ("a/1", "a/1/2", "b", "b/x/y", "c/a/1"):
        pub.publish(t, t.encode())
    sub.wait_messages(3)
    wait_until(lambda: False, 0.3)
    assert sorted(m.topic for m in sub.messages) == ["a/1", "b", "b/x/y"]


def test_unsubscribe_stops_deliveries(paho):
    sub = paho("u")
    sub.subscribe("t/1", 1)
    sub.unsubscribe("t/1")
    pub = paho("up")
    pub.publish("t/1", b"x")
    sub.subscribe("t/2", 1)
    pub.publish("t/2", b"y")
    assert [m.payload for m in sub.wait_messages(1)] == [b"y"]


def test_retained_message_goes_to_new_subscribers_and_empty_clears_it(paho):
    pub = paho("rp")
    pub.publish("home/door", b"open", qos=1, retain=True)
    first = paho("r1")
    first.subscribe("home/#", 1)
    m = first.wait_messages(1)[0]
    assert (m.topic, m.payload, m.retain) == ("home/door", b"open", True)
    pub.publish("home/door", b"", qos=1, retain=True)
    later = paho("r2")
    later.subscribe("home/#", 1)
    pub.publish("home/light", b"on", qos=1)
    assert [(m.payload, m.retain) for m in later.wait_messages(1)] == [(b"on", False)]


def test_last_will_on_abrupt_disconnect_but_not_on_disconnect(paho):
    watcher = paho("watch")
    watcher.subscribe("wills/#", 1)
    polite = paho("polite", will=("wills/polite", b"polite gone", 1, False))
    polite.close()
    rude = paho("rude", will=("wills/rude", b"rude gone", 1, False))
    rude.drop()
    got = watcher.wait_messages(1)
    wait_until(lambda: False, 0.3)
    assert [(m.topic, m.payload) for m in got] == [("wills/rude", b"rude gone")]


def test_takeover_closes_the_older_connection(paho, mqtt_broker):
    first = paho("dev-1")
    second = paho("dev-1")
    assert first.disconnected.wait(10)
    assert second.accepted and not second.disconnected.is_set()
    second.subscribe("x", 1)
    paho("other").publish("x", b"still works")
    assert second.wait_messages(1)[0].payload == b"still works"


def test_wrong_password_gets_connack_4(paho, mqtt_broker, caplog):
    caplog.set_level(logging.INFO, logger="exchange_broker")
    bad = paho("bad", password="wrong")
    assert bad.connack[1].value == 134 and bad.connack[1].is_failure  # paho maps 3.1.1's 4 to 134
    assert "login refused on connection" in caplog.text and "'guest'" in caplog.text
    unknown = paho("nouser", user="nobody", password="x")
    assert not unknown.accepted


def _user(tb, name: str, configure=".*", write=".*", read=".*", vhost="/"):
    def setup():
        b = tb.broker
        b.add_vhost(vhost)
        b.add_user(name, "pw")
        b.set_permissions(name, vhost, configure, write, read)
    tb.call(setup)


def test_vhost_in_the_user_name(paho, mqtt_broker):
    _user(mqtt_broker, "dev", vhost="plant")
    c = paho("v", user="plant:dev", password="pw")
    assert c.accepted
    c.subscribe("t", 1)
    assert "mqtt-subscription-vqos1" in mqtt_broker.call(lambda: set(mqtt_broker.broker.vhosts["plant"].queues))
    refused = paho("v2", user="dev", password="pw")  # no permission in the default vhost "/"
    assert refused.connack[1].value == 135  # 3.1.1's 5, not authorized


def test_write_permission_refused_closes_the_publisher(paho, mqtt_broker):
    _user(mqtt_broker, "reader", write="^mqtt-subscription-.*")  # may bind, not publish to amq.topic
    sub = paho("s1", user="reader", password="pw")
    sub.subscribe("t", 1)
    pub = paho("p1", user="reader", password="pw")
    pub.client.publish("t", b"x", 1)
    assert pub.disconnected.wait(10)
    assert sub.accepted and not sub.disconnected.is_set()


def test_read_permission_refused_fails_the_subscription(paho, mqtt_broker):
    _user(mqtt_broker, "writer", read="^$")
    c = paho("s2", user="writer", password="pw")
    assert c.subscribe("t", 1)[0].value == 0x80
    assert not c.disconnected.is_set()


def test_topic_permissions_apply_to_publish_and_subscribe(paho, mqtt_broker):
    _user(mqtt_broker, "t")
    mqtt_broker.call(lambda: perms.set_topic_permission(mqtt_broker.broker, "t", "/", "amq.topic",
                                                        "^devices\\.{username}\\.", "^devices\\."))
    c = paho("tp", user="t", password="pw")
    assert c.subscribe("devices/#", 1)[0].value == 1
    assert c.subscribe("other/#", 1)[0].value == 0x80
    c.publish("devices/t/temp", b"ok")
    assert c.wait_messages(1)[0].payload == b"ok"
    c.client.publish("devices/other/temp", b"no", 1)
    assert c.disconnected.wait(10)


def _raw(port: int, data: bytes, client_id: str = "raw") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(codec.encode(p.Connect(p.V311, client_id, True, 0, "guest", b"guest")))
    assert s.recv(4) == b"\x20\x02\x00\x00"
    s.sendall(data)
    return s


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def test_malformed_and_oversized_packets_close_only_their_connection(paho, mqtt_broker):
    ok = paho("ok")
    ok.subscribe("k", 1)
    garbage = _raw(mqtt_broker.mqtt_port, b"\xf0\x00", uniq("g"))            # a reserved type
    second = _raw(mqtt_broker.mqtt_port, codec.encode(p.Connect(p.V311, "x", True, 0)), uniq("s"))
    huge = _raw(mqtt_broker.mqtt_port, b"\x30\xff\xff\xff\x7f", uniq("h"))   # 256 MB announced
    for s in (garbage, second, huge):
        assert _closed(s)
        s.close()
    before = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=10)
    before.sendall(codec.encode(p.PingReq()))  # before CONNECT
    assert _closed(before)
    before.close()
    paho("okp").publish("k", b"fine")
    assert ok.wait_messages(1)[0].payload == b"fine"
    assert not ok.disconnected.is_set()
