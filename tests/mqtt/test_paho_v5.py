"""paho-mqtt speaking MQTT 5.0: CONNACK properties, reason codes, user properties, content type,
correlation data and response topic (request/response with an AMQP service through reply_to),
message expiry, topic aliases, subscription identifiers, receive maximum, session expiry and
shared subscriptions."""

from __future__ import annotations

import socket

import pika
from eb_support import pika_connect, uniq, wait_until
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from paho_support import V5, Paho

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p


def props(kind=PacketTypes.PUBLISH, **values) -> Properties:
    pr = Properties(kind)
    for name, value in values.items():
        setattr(pr, name, value)
    return pr


def test_connack_announces_what_the_broker_offers(paho):
    c = paho("v5-a", version=V5)
    assert c.accepted and c.connack[0] is False
    offered = c.connack_properties
    assert (offered.TopicAliasMaximum, offered.RetainAvailable, offered.SharedSubscriptionAvailable,
            offered.SubscriptionIdentifierAvailable) == (16, 1, 1, 1)
    assigned = paho("", version=V5)
    assert assigned.accepted and assigned.connack_properties.AssignedClientIdentifier.startswith("mqtt-")


def test_properties_travel_mqtt_to_mqtt_and_no_subscriber_is_reason_0x10(paho):
    sub = paho("v5-sub", version=V5)
    sub.subscribe("data/#", 1)
    pub = paho("v5-pub", version=V5)
    info = pub.publish("data/1", b"{}", 1, properties=props(
        ContentType="application/json", CorrelationData=b"c-1", ResponseTopic="replies/v5-pub",
        UserProperty=[("k", "v"), ("k", "w")], MessageExpiryInterval=60))
    assert info.rc == 0
    m = sub.wait_messages(1)[0]
    pr = m.properties
    assert (pr.ContentType, pr.CorrelationData, pr.ResponseTopic) == ("application/json", b"c-1", "replies/v5-pub")
    assert pr.UserProperty == [("k", "v"), ("k", "w")]
    assert 0 < pr.MessageExpiryInterval <= 60
    nobody = pub.publish("nobody/listens", b"x", 1)
    assert wait_until(lambda: nobody.mid in pub.pubacks, 10)
    assert pub.pubacks[nobody.mid].value == 0x10  # no matching subscribers


def test_request_response_with_an_amqp_service(paho, mqtt_broker):
    """The MQTT client asks with a response topic; the AMQP service answers to reply_to."""
    conn = pika_connect(mqtt_broker.port)
    try:
        ch = conn.channel()
        q = uniq("service")
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.topic", "rpc.time")
        client = paho("asker", version=V5)
        client.subscribe("replies/asker", 1)
        client.publish("rpc/time", b"what time?", 1, properties=props(
            ResponseTopic="replies/asker", CorrelationData=b"req-42"))
        method, p_, body = wait_until(lambda: ch.basic_get(q, auto_ack=True), 10)
        assert (body, p_.reply_to, p_.correlation_id) == (b"what time?", "replies.asker", "req-42")
        ch.basic_publish("amq.topic", p_.reply_to, b"noon",
                         pika.BasicProperties(correlation_id=p_.correlation_id, delivery_mode=2))
        m = client.wait_messages(1)[0]
        assert (m.topic, m.payload, m.properties.CorrelationData) == ("replies/asker", b"noon", b"req-42")
    finally:
        conn.close()


def test_expired_messages_are_not_delivered(paho, mqtt_broker):
    parked = paho("parked", version=V5, clean_start=True,
                  properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300))
    parked.subscribe("exp/#", 1)
    parked.close()
    pub = paho("exp-pub", version=V5)
    pub.publish("exp/short", b"gone soon", 1, properties=props(MessageExpiryInterval=1))
    pub.publish("exp/long", b"stays", 1, properties=props(MessageExpiryInterval=600))
    wait_until(lambda: False, 1.5)
    back = paho("parked", version=V5, clean_start=False,
                properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300))
    assert back.connack[0] is True
    got = back.wait_messages(1)
    wait_until(lambda: False, 0.3)
    assert [m.payload for m in got] == [b"stays"]


def test_session_expiry_zero_forgets_the_session(paho, mqtt_broker):
    c = paho("brief", version=V5, clean_start=False)
    c.subscribe("b/1", 1)
    c.close()
    assert wait_until(lambda: mqtt_broker.call(
        lambda: "mqtt-subscription-briefqos1" not in mqtt_broker.broker.vhosts["/"].queues), 5)
    again = paho("brief", version=V5, clean_start=False)
    assert again.connack[0] is False


def test_session_expiry_sets_the_queue_expiry(paho, mqtt_broker):
    c = paho("kept", version=V5, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=120))
    c.subscribe("k/1", 1)
    q = mqtt_broker.call(lambda: mqtt_broker.broker.vhosts["/"].queues["mqtt-subscription-keptqos1"])
    assert q.durable and q.arguments["x-expires"] == 120_000


def test_topic_alias_from_the_client(paho):
    sub = paho("alias-sub", version=V5)
    sub.subscribe("very/long/topic/name", 1)
    pub = paho("alias-pub", version=V5)
    pub.publish("very/long/topic/name", b"1", 1, properties=props(TopicAlias=1))
    pub.publish("", b"2", 1, properties=props(TopicAlias=1))
    got = sub.wait_messages(2)
    assert [(m.topic, m.payload) for m in got] == [("very/long/topic/name", b"1"), ("very/long/topic/name", b"2")]


def test_an_unknown_topic_alias_is_a_protocol_error(paho):
    pub = paho("alias-bad", version=V5)
    pub.client.publish("", b"x", 1, properties=props(TopicAlias=5))
    assert pub.disconnected.wait(10)


def test_subscription_identifiers_come_back_with_deliveries(paho):
    sub = paho("ids", version=V5)
    sub.subscribe("s/+/x", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=17))
    sub.subscribe("s/#", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=4))
    paho("ids-pub", version=V5).publish("s/1/x", b"x", 1)
    m = sub.wait_messages(1)[0]
    ids = m.properties.SubscriptionIdentifier
    assert sorted(ids if isinstance(ids, list) else [ids]) == [4, 17]


def test_receive_maximum_limits_unacknowledged_deliveries(mqtt_broker):
    """A raw v5 client with receive maximum 2 that never acks gets 2 deliveries, then more as it acks."""
    s = socket.create_connection(("127.0.0.1", mqtt_broker.mqtt_port), timeout=10)
    parser = codec.Parser(version=p.V5, server=False)
    got: list = []

    def read_until(n):
        while len(got) < n:
            got.extend(parser.feed(s.recv(65536)))
        return got
    try:
        s.sendall(codec.encode(p.Connect(p.V5, "rm", True, 0, "guest", b"guest", None,
                                         {"receive_maximum": 2}), p.V5))
        s.sendall(codec.encode(p.Subscribe(1, [p.Subscription("rm/t", 1)]), p.V5))
        read_until(2)
        pub = paho_publish_many(mqtt_broker.mqtt_port, "rm/t", 5)
        read_until(4)
        wait_until(lambda: False, 0.5)
        s.setblocking(False)
        try:
            got.extend(parser.feed(s.recv(65536)))
        except BlockingIOError:
            pass
        s.setblocking(True)
        pubs = [x for x in got if isinstance(x, p.Publish)]
        assert len(pubs) == 2
        s.sendall(codec.encode(p.Ack(p.PUBACK, pubs[0].packet_id), p.V5))
        read_until(5)
        assert isinstance(got[4], p.Publish)
        pub.close()
    finally:
        s.close()


def paho_publish_many(port: int, topic: str, n: int):
    pub = Paho(port, uniq("pm"), version=V5)
    for i in range(n):
        pub.publish(topic, str(i).encode(), 1)
    return pub


def test_shared_subscription_spreads_messages_over_the_group(paho, mqtt_broker):
    a = paho("sa", version=V5)
    b = paho("sb", version=V5)
    assert a.subscribe("$share/workers/jobs/#", 1)[0].value == 1
    assert b.subscribe("$share/workers/jobs/#", 1)[0].value == 1
    pub = paho("sp", version=V5)
    for i in range(10):
        pub.publish(f"jobs/{i}", str(i).encode(), 1)
    assert wait_until(lambda: len(a.messages) + len(b.messages) == 10, 10)
    assert a.messages and b.messages  # both members got some, nobody got all
    assert sorted(int(m.payload) for m in a.messages + b.messages) == list(range(10))
    a.unsubscribe("$share/workers/jobs/#")
    pub.publish("jobs/x", b"after", 1)
    assert wait_until(lambda: any(m.payload == b"after" for m in b.messages), 10)


def test_no_retained_when_retain_handling_says_so(paho):
    pub = paho("rh-pub", version=V5)
    pub.publish("rh/t", b"kept", 1, retain=True)
    sub = paho("rh-sub", version=V5)
    sub.subscribe("rh/#", 0, options=SubscribeOptions(qos=1, retainHandling=2))
    pub.publish("rh/t2", b"live", 1)
    assert [m.payload for m in sub.wait_messages(1)] == [b"live"]


def test_wrong_password_is_reason_0x86_and_bad_auth_method_0x8c(paho):
    bad = paho("v5-bad", version=V5, password="nope")
    assert bad.connack[1].value == 0x86
    method = paho("v5-am", version=V5, properties=props(PacketTypes.CONNECT, AuthenticationMethod="SCRAM-SHA-1"))
    assert method.connack[1].value == 0x8C
