"""The MQTT session's login through Broker.login, without sockets (ManualClock): a backend that
asks the network answers later (the offload is driven by the test), packets sent meanwhile are
held and handled after it in order, a refusal is the CONNACK code, the backend's authz decides
publishing, and the credential's expiry closes the connection (MQTT 5: DISCONNECT 0xA0)."""

from __future__ import annotations

from mqtt_sansio import Peer, make_hub

from exchange_broker.core.auth_backends import AuthChain, AuthenticatedUser, BackendRefusal, InternalBackend
from exchange_broker.mqtt import packets as p


class TopicOnly:
    """An external backend's grants: vhost '/', everything but publishing outside 'ok.*'."""

    def vhost_access(self, vhost):
        return vhost == "/"

    def resource_access(self, vhost, kind, name, permission):
        return True

    def topic_access(self, vhost, exchange, routing_key, permission):
        return permission == "read" or routing_key.startswith("ok.")


class RemoteBackend:
    """Needs the network: its answer comes when the test runs the offloaded call."""

    name = "remote"

    def __init__(self, clock, lifetime: float = 60.0) -> None:
        self.clock, self.lifetime = clock, lifetime

    def needs_io(self, username, password):
        return True

    def login(self, username, password, peer_host):
        if password != "token":
            raise BackendRefusal("bad token")
        return AuthenticatedUser("svc", [], self.name, TopicOnly(), self.clock.wall() + self.lifetime)


def remote_hub(lifetime: float = 60.0):
    hub = make_hub()
    broker = hub.broker
    pending: list = []
    broker.auth = AuthChain([InternalBackend(broker), RemoteBackend(broker.clock, lifetime)],
                            offload=lambda fn, done: pending.append((fn, done)))
    return hub, pending


def answer(pending: list) -> None:
    fn, done = pending.pop(0)
    try:
        done(fn())
    except Exception as exc:
        done(exc)


def test_packets_after_connect_wait_for_the_login_and_are_handled_after_it_in_order():
    hub, pending = remote_hub()
    c = Peer(hub)
    out = c.send(p.Connect(p.V311, "held", True, 0, "anyone", b"token"),
                 p.Subscribe(1, [p.Subscription("ok/#", 1)]),
                 p.Publish("ok/1", b"m", 1, packet_id=7))
    assert out == [] and c.session.state == "login" and len(pending) == 1
    assert c.send(p.PingReq()) == []  # more input while waiting: held too
    answer(pending)
    c.clock.advance(0)
    kinds = [type(x).__name__ for x in c.received]
    assert kinds[:2] == ["ConnAck", "SubAck"] and c.received[0].code == p.SUCCESS
    assert sorted(kinds[2:]) == ["Ack", "PingResp", "Publish"]
    assert c.session.user == "svc" and c.session.authz is not None


def test_a_refused_remote_login_is_the_connack_code_and_nothing_held_runs():
    hub, pending = remote_hub()
    c = Peer(hub, p.V5)
    c.send(p.Connect(p.V5, "bad", True, 0, "anyone", b"forged"), p.Subscribe(1, [p.Subscription("ok/#", 1)]))
    answer(pending)
    c.clock.advance(0)
    assert [type(x) for x in c.received] == [p.ConnAck] and c.received[0].code == p.BAD_USER_NAME_OR_PASSWORD
    assert c.transport_closed and "mqtt-subscription-badqos1" not in hub.broker.vhosts["/"].queues


def test_the_backends_authz_decides_publishing_and_expiry_closes_with_0xa0():
    hub, pending = remote_hub(lifetime=30)
    c = Peer(hub, p.V5)
    c.send(p.Connect(p.V5, "exp", True, 0, "anyone", b"token"))
    answer(pending)
    c.clock.advance(0)
    assert c.received[0].code == p.SUCCESS
    c.received = []
    ack = c.send(p.Publish("ok/1", b"m", 1, packet_id=1))
    assert [(a.kind, a.packet_id) for a in ack] == [(p.PUBACK, 1)]
    assert not c.session.closed
    c.clock.advance(29)
    assert not c.session.closed
    c.clock.advance(2)
    assert c.received[-1] == p.Disconnect(0xA0, {"reason_string": "credential expired"}) and c.session.closed
    other = Peer(hub)
    other.send(p.Connect(p.V311, "no", True, 0, "anyone", b"token"))
    answer(pending)
    other.clock.advance(0)
    other.received = []
    other.send(p.Publish("not-ok/1", b"m", 1, packet_id=1))  # no topic access: closed
    assert other.session.closed


def test_mqtt5_token_without_a_user_name_is_tried_as_a_token_not_as_anonymous():
    hub, pending = remote_hub()
    c = Peer(hub, p.V5)
    c.send(p.Connect(p.V5, "nameless", True, 0, None, b"token"))
    answer(pending)
    c.clock.advance(0)
    assert c.received[0].code == p.SUCCESS and c.session.user == "svc"


def test_a_connection_closed_while_its_login_waits_ignores_the_answer():
    hub, pending = remote_hub()
    c = Peer(hub)
    c.send(p.Connect(p.V311, "gone", True, 0, "anyone", b"token"))
    c.session.connection_lost()
    answer(pending)
    c.clock.advance(0)
    assert c.received == [] and not hub.broker.sessions and not hub.clients
