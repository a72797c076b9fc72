"""How MQTT connections end (sans-IO, ManualClock): one whose subscription queue is deleted
under it (the admin API, an AMQP queue.delete) closes, as RabbitMQ's does (MQTT 5: DISCONNECT
0x98 first), instead of staying open without deliveries, and other connections go on; a
DISCONNECT giving a session expiry after a CONNECT that gave none is a protocol error (the will
goes out)."""

from __future__ import annotations

from mqtt_sansio import Peer, make_hub

from exchange_broker.mqtt import packets as p


def test_deleting_the_subscription_queue_closes_the_connection():
    hub = make_hub()
    c = Peer(hub, p.V5)
    c.connect("gone")
    other = Peer(hub, p.V5)
    other.connect("stays")
    assert c.send(p.Subscribe(1, [p.Subscription("g/#", 1)])) == [p.SubAck(1, [1])]
    assert other.send(p.Subscribe(1, [p.Subscription("g/#", 1)])) == [p.SubAck(1, [1])]
    vhost = hub.broker.vhosts["/"]
    vhost.delete_queue("mqtt-subscription-goneqos1")
    hub.broker.clock.advance(0)
    out, c.received = c.received, []
    assert [type(x) for x in out] == [p.Disconnect] and out[0].code == p.ADMINISTRATIVE_ACTION
    assert c.session.closed and c.transport_closed
    got = other.send(p.Publish("g/1", b"x", 0))
    assert [(type(x), x.payload) for x in got] == [(p.Publish, b"x")]


def test_session_expiry_in_disconnect_after_none_in_connect_is_a_protocol_error():
    hub = make_hub()
    watcher = Peer(hub, p.V5)
    watcher.connect("watcher")
    watcher.send(p.Subscribe(1, [p.Subscription("wills/#", 0)]))
    c = Peer(hub, p.V5)
    c.connect("brief", will=p.Will("wills/brief", b"bye", 0, False))
    out = c.send(p.Disconnect(p.SUCCESS, {"session_expiry_interval": 60}))
    assert [(type(x), x.code) for x in out] == [(p.Disconnect, p.PROTOCOL_ERROR)]
    assert c.session.closed
    hub.broker.clock.advance(0)
    assert [(x.topic, x.payload) for x in watcher.received] == [("wills/brief", b"bye")]
    kept = Peer(hub, p.V5)
    kept.connect("kept", props={"session_expiry_interval": 30})
    assert kept.send(p.Disconnect(p.SUCCESS, {"session_expiry_interval": 60})) == []  # allowed
    assert kept.session.closed
