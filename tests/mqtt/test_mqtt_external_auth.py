"""MQTT logins through the broker's backend chain (Broker.login), as RabbitMQ's MQTT plugin does
them: an OAuth 2.0 token as the password (any user name; keys made here, a JWKS endpoint run
here), its scopes as publish and subscribe permissions, a wrong token refused in the CONNACK, an
expired token closing the connection (MQTT 5: DISCONNECT 0xA0), packets sent while the login
waits on the network held and handled after it; and LDAP users against a real slapd."""

from __future__ import annotations

import socket

import pytest
from eb_support import wait_until
from oauth2_support import RSID, JwksServer, SigningKey, auth_broker
from paho_support import V5
from slapd_support import QUERIES, Slapd

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p

# may subscribe (configure and write on its own subscription queues, read with any topic) and
# publish to amq.topic on sensors.* only; READER has no write on amq.topic at all
PUBSUB = (f"{RSID}.configure:*/mqtt-subscription-*", f"{RSID}.write:*/*/sensors.*", f"{RSID}.read:*/*/*")
READER = (f"{RSID}.configure:*/mqtt-subscription-*", f"{RSID}.write:*/mqtt-subscription-*",
          f"{RSID}.read:*/*/*")


@pytest.fixture(scope="module")
def key():
    return SigningKey("mqtt-k")


@pytest.fixture
def idp(key):
    with JwksServer(key) as server:
        yield server


@pytest.fixture
def tb(idp):
    with auth_broker(auth_oauth2_jwks_url=idp.url, mqtt=True) as b:
        yield b


def test_a_token_is_the_password_with_any_user_name_and_scopes_are_permissions(tb, key, paho_at):
    port = tb.mqtt_port
    sub = paho_at(port, "tok-sub", user="anything", password=key.token(PUBSUB, sub="svc-sensors"))
    assert sub.accepted
    assert tb.call(lambda: sorted(s.user for s in tb.broker.sessions)) == ["svc-sensors"]
    assert sub.subscribe("sensors/#", 1)[0].value == 1
    sub.publish("sensors/1", b"21.5")  # write on amq.topic, routing key sensors.1: allowed
    assert sub.wait_messages(1)[0].payload == b"21.5"
    sub.client.publish("alarms/1", b"no", 1)  # no topic scope for alarms.*: refused, closed
    assert sub.disconnected.wait(10)

    reader = paho_at(port, "tok-reader", user="x", password=key.token(READER, sub="dashboard"))
    assert reader.subscribe("sensors/#", 1)[0].value == 1  # reading is allowed
    reader.client.publish("sensors/2", b"no", 1)  # no write scope on amq.topic: refused, closed
    assert reader.disconnected.wait(10)
    assert paho_at(port, "guest-still").accepted  # the broker's own users log in as before


def test_vhost_in_the_user_name_and_the_token_scopes_decide_the_vhost(tb, key, paho_at):
    tb.call(lambda: tb.broker.add_vhost("plant"))
    plant_only = tuple(s.replace(":*/", ":plant/") for s in PUBSUB)
    c = paho_at(tb.mqtt_port, "tok-plant", user="plant:whoever", password=key.token(plant_only))
    assert c.accepted and c.subscribe("sensors/t", 1)[0].value == 1
    assert "mqtt-subscription-tok-plantqos1" in tb.call(lambda: set(tb.broker.vhosts["plant"].queues))
    refused = paho_at(tb.mqtt_port, "tok-root", user="whoever", password=key.token(plant_only))
    assert refused.connack[1].value == 135  # no scope for the vhost "/": not authorized


def test_a_wrong_token_is_refused_in_the_connack(tb, key, paho_at):
    forged = SigningKey("mqtt-k").token(PUBSUB)  # the right key id, another key
    v311 = paho_at(tb.mqtt_port, "forged-3", user="x", password=forged)
    assert v311.connack[1].value == 134 and v311.connack[1].is_failure  # 3.1.1's 4 (bad credentials)
    v5 = paho_at(tb.mqtt_port, "forged-5", user="x", password=forged, version=V5)
    assert v5.connack[1].value == p.BAD_USER_NAME_OR_PASSWORD
    expired = paho_at(tb.mqtt_port, "expired-5", user="x", password=key.token(PUBSUB, ttl=-5), version=V5)
    assert expired.connack[1].value == p.BAD_USER_NAME_OR_PASSWORD


def test_an_expired_token_closes_the_connection_mqtt5_with_disconnect_0xa0(tb, key, paho_at):
    v5 = paho_at(tb.mqtt_port, "short-5", user="x", password=key.token(PUBSUB, ttl=2), version=V5)
    v311 = paho_at(tb.mqtt_port, "short-3", user="x", password=key.token(PUBSUB, ttl=2))
    assert v5.accepted and v311.accepted
    assert v5.disconnected.wait(15) and v311.disconnected.wait(15)
    assert v5.disconnect_reason.value == 0xA0  # maximum connect time, as RabbitMQ's MQTT reader
    assert wait_until(lambda: tb.call(lambda: len(tb.broker.sessions)) == 0, 10)


def _read_packets(s: socket.socket, n: int) -> list:
    parser, got = codec.Parser(server=False), []
    while len(got) < n:
        data = s.recv(65536)
        assert data, f"closed after {got}"
        got += parser.feed(data)
    return got


def test_packets_sent_while_the_login_waits_on_the_network_are_handled_after_it(tb, key, idp):
    """CONNECT, SUBSCRIBE and a QoS 1 PUBLISH in one write: the token's key is not known yet, so
    the login fetches the JWKS off the event loop; what followed the CONNECT waits, in order."""
    s = socket.create_connection(("127.0.0.1", tb.mqtt_port), timeout=10)
    try:
        s.sendall(codec.encode(p.Connect(p.V311, "held", True, 0, "x", key.token(PUBSUB).encode()))
                  + codec.encode(p.Subscribe(1, [p.Subscription("sensors/#", 1)]))
                  + codec.encode(p.Publish("sensors/held", b"after login", 1, packet_id=2)))
        got = _read_packets(s, 4)
    finally:
        s.close()
    assert idp.fetches == 1  # the login asked the network
    kinds = [type(x).__name__ for x in got]
    assert kinds[:2] == ["ConnAck", "SubAck"] and got[0].code == 0, kinds
    assert sorted(kinds[2:]) == ["Ack", "Publish"]
    delivered = next(x for x in got if isinstance(x, p.Publish))
    assert (delivered.topic, delivered.payload) == ("sensors/held", b"after login")


# -- LDAP ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slapd():
    with Slapd() as server:
        yield server


def test_ldap_users_log_in_over_mqtt_with_their_queries_as_permissions(slapd, paho_at):
    with auth_broker(auth_backends="internal,ldap", auth_ldap_servers="127.0.0.1",
                     auth_ldap_port=slapd.port, mqtt=True, **QUERIES) as b:
        b.call(lambda: b.broker.add_vhost("prod"))
        port = b.mqtt_port
        watcher = paho_at(port, "guest-watch")  # guest: the internal backend, first in the chain
        watcher.subscribe("bob/#", 1)
        bob = paho_at(port, "ldap-bob", user="bob", password="bob-pw")
        assert bob.accepted and b.call(lambda: {s.user for s in b.broker.sessions}) == {"guest", "bob"}
        # the resource query allows configure on bob-* only: not on its subscription queue
        assert bob.subscribe("bob/#", 1)[0].value == 0x80
        bob.publish("bob/orders", b"from ldap")  # the topic query: bob.* only
        assert watcher.wait_messages(1)[0].payload == b"from ldap"
        bob.client.publish("alice/orders", b"no", 1)
        assert bob.disconnected.wait(10)
        assert paho_at(port, "ldap-bob-prod", user="prod:bob", password="bob-pw").accepted
        carol = paho_at(port, "ldap-carol-prod", user="prod:carol", password="carol-pw")
        assert carol.connack[1].value == 135  # not in the vhost-prod group
        wrong = paho_at(port, "ldap-wrong", user="bob", password="wrong")
        assert wrong.connack[1].value == 134
