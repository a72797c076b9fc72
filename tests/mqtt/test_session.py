"""The MQTT session without sockets (ManualClock): CONNECT rules, wrong passwords, protocol
violations closing only the offender, keep-alive at 1.5 x, takeover, QoS 1 PUBACK order and
redelivery, and random bytes never raising out of the session (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_sansio import Peer, make_hub

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p


def test_connect_and_wrong_password():
    hub = make_hub()
    assert Peer(hub).connect().code == p.SUCCESS
    bad = Peer(hub)
    ack = bad.connect("c2", password=b"nope")
    assert ack.code == p.CONNACK_BAD_CREDENTIALS and bad.transport_closed
    unknown_vhost = Peer(hub)
    assert unknown_vhost.connect("c3", user="nowhere:guest").code == p.CONNACK_NOT_AUTHORIZED
    v5 = Peer(hub, p.V5)
    assert v5.connect("c4", password=b"nope").code == p.BAD_USER_NAME_OR_PASSWORD


def test_guest_only_over_loopback_and_anonymous_is_guest():
    hub = make_hub()
    assert Peer(hub, peer=("10.1.2.3", 5000)).connect(user="guest").code == p.CONNACK_BAD_CREDENTIALS
    anon = Peer(hub)
    assert anon.connect(user=None, password=None).code == p.SUCCESS
    assert anon.session.user == "guest"
    closed = make_hub(allow_anonymous=False)
    assert Peer(closed).connect(user=None, password=None).code == p.CONNACK_BAD_CREDENTIALS


def test_empty_client_id_needs_a_clean_session_in_311_and_is_assigned_in_5():
    hub = make_hub()
    assert Peer(hub).connect("", clean=False).code == p.CONNACK_ID_REJECTED
    v5 = Peer(hub, p.V5)
    ack = v5.connect("")
    assert ack.code == p.SUCCESS and ack.properties["assigned_client_identifier"].startswith("mqtt-")


def test_packet_before_connect_and_second_connect_close_the_connection():
    hub = make_hub()
    early = Peer(hub)
    assert early.send(p.PingReq()) == [] and early.transport_closed
    twice = Peer(hub)
    twice.connect()
    twice.send(p.Connect(p.V311, "c1", True, 0))
    assert twice.transport_closed and twice.session.closed
    other = Peer(hub)
    other.connect("other")
    assert other.send(p.PingReq()) == [p.PingResp()]


def test_oversized_packet_closes_with_reason_0x95_in_v5():
    hub = make_hub(max_packet_size=200)
    c = Peer(hub, p.V5)
    c.connect()
    out = c.send(p.Publish("t", b"x" * 300))
    assert out == [p.Disconnect(p.PACKET_TOO_LARGE, out[0].properties)]
    assert c.transport_closed


def test_keep_alive_is_one_and_a_half_times_the_interval():
    hub = make_hub()
    c = Peer(hub)
    c.connect(keep_alive=10, will=p.Will("wills/c1", b"gone", 0, True))
    c.clock.advance(14)
    c.session.tick(c.clock.time())
    assert not c.session.closed
    c.clock.advance(1.5)
    c.session.tick(c.clock.time())
    assert c.session.closed
    assert hub.retained.matching("/", "wills/#")[0].payload == b"gone"  # the will went out


def test_takeover_closes_the_first_connection():
    hub = make_hub()
    first, second = Peer(hub, p.V5), Peer(hub, p.V5)
    first.connect("same")
    second.connect("same")
    assert first.session.closed and hub.clients[("/", "same")] is second.session
    assert first.received == [p.Disconnect(p.SESSION_TAKEN_OVER)]


def test_qos1_delivery_is_redelivered_to_the_next_session_until_acked():
    hub = make_hub()
    sub = Peer(hub)
    sub.connect("s", clean=False)
    assert sub.send(p.Subscribe(1, [p.Subscription("a/#", 1)])) == [p.SubAck(1, [1])]
    pub = Peer(hub)
    pub.connect("p")
    assert pub.send(p.Publish("a/b", b"m1", 1, packet_id=7)) == [p.Ack(p.PUBACK, 7)]
    got = sub.send()
    assert [(x.topic, x.payload, x.qos, x.dup) for x in got] == [("a/b", b"m1", 1, False)]
    sub.session.connection_lost()  # no PUBACK: the message goes back to the queue
    again = Peer(hub)
    ack = again.connect("s", clean=False)
    assert ack.session_present
    redelivered = again.after_connect
    assert [(x.payload, x.dup) for x in redelivered] == [(b"m1", True)]
    again.send(p.Ack(p.PUBACK, redelivered[0].packet_id))
    q = hub.broker.vhosts["/"].queues["mqtt-subscription-sqos1"]
    assert q.message_count == 0 and q.unacked == 0


def test_qos2_publish_gets_pubrec_then_pubcomp_and_is_routed_once():
    hub = make_hub()
    sub = Peer(hub)
    sub.connect("s")
    sub.send(p.Subscribe(1, [p.Subscription("t", 2)]))
    pub = Peer(hub)
    pub.connect("p")
    assert pub.send(p.Publish("t", b"x", 2, packet_id=3)) == [p.Ack(p.PUBREC, 3)]
    assert pub.send(p.Publish("t", b"x", 2, dup=True, packet_id=3)) == [p.Ack(p.PUBREC, 3)]
    assert pub.send(p.Ack(p.PUBREL, 3)) == [p.Ack(p.PUBCOMP, 3)]
    assert [x.payload for x in sub.send()] == [b"x"]  # once, delivered as QoS 1
    assert hub.broker.vhosts["/"].queues["mqtt-subscription-sqos1"].unacked == 1


def test_clean_session_queues_go_with_the_connection():
    hub = make_hub()
    c = Peer(hub)
    c.connect("tmp")
    c.send(p.Subscribe(1, [p.Subscription("a", 0), p.Subscription("b", 1)]))
    vh = hub.broker.vhosts["/"]
    assert {"mqtt-subscription-tmpqos0", "mqtt-subscription-tmpqos1"} <= set(vh.queues)
    c.send(p.Disconnect())
    assert not any(n.startswith("mqtt-subscription-tmp") for n in vh.queues)


_settings = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_never_raise_out_of_the_session(data, connected):
    hub = make_hub(max_packet_size=1000)
    c = Peer(hub)
    if connected:
        c.connect()
    c.session.data_received(data)
    c.clock.advance(0)
    survivor = Peer(hub)
    assert survivor.connect("survivor").code == p.SUCCESS


packet = st.one_of(
    st.builds(p.Publish, st.sampled_from(["a", "a/b", "", "+", "x/#"]), st.binary(max_size=20),
              st.integers(0, 2), st.booleans(), st.just(False), st.integers(1, 5)),
    st.builds(p.Ack, st.sampled_from([p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP]), st.integers(1, 5)),
    st.builds(lambda f, q: p.Subscribe(1, [p.Subscription(f, q)]),
              st.sampled_from(["a", "a/+", "#", "a/#/b", "$share/g/a", ""]), st.integers(0, 2)),
    st.builds(lambda f: p.Unsubscribe(2, [f]), st.sampled_from(["a", "#", "zz"])),
    st.just(p.PingReq()), st.just(p.Disconnect()))


@_settings
@given(st.lists(packet, max_size=12), st.sampled_from([p.V311, p.V5]))
def test_random_packet_sequences_never_raise(packets, version):
    hub = make_hub()
    c = Peer(hub, version)
    c.connect(clean=False)
    for x in packets:
        if c.session.closed:
            break
        c.session.data_received(codec.encode(x, version))
        c.clock.advance(0)
    c.session.connection_lost()


def test_v5_refusals_are_reason_codes_and_the_connection_stays():
    hub = make_hub()
    hub.broker.add_user("ro", "pw")
    hub.broker.set_permissions("ro", "/", "^mqtt-subscription-.*", "^mqtt-subscription-.*", "^mqtt-subscription-.*")
    c = Peer(hub, p.V5)
    assert c.connect("ro-1", user="ro", password=b"pw").code == p.SUCCESS
    assert c.send(p.Publish("t", b"x", 1, packet_id=4)) == [p.Ack(p.PUBACK, 4, p.NOT_AUTHORIZED)]
    assert c.send(p.Subscribe(2, [p.Subscription("t", 1)])) == [p.SubAck(2, [p.NOT_AUTHORIZED])]
    assert c.send(p.PingReq()) == [p.PingResp()] and not c.session.closed


def test_v5_will_delay_and_reconnect_before_it_cancels_the_will():
    hub = make_hub()
    will = p.Will("wills/d", b"late", 0, True, {"will_delay_interval": 30})
    c = Peer(hub, p.V5)
    c.connect("d1", will=will)
    c.session.connection_lost()
    c.clock.advance(29)
    assert hub.retained.matching("/", "wills/#") == []
    c.clock.advance(2)
    assert [r.payload for r in hub.retained.matching("/", "wills/#")] == [b"late"]
    again = Peer(hub, p.V5)
    again.connect("d2", will=p.Will("wills/e", b"never", 0, True, {"will_delay_interval": 30}))
    again.session.connection_lost()
    back = Peer(hub, p.V5)
    back.connect("d2")  # within the delay: that will is not sent
    back.clock.advance(60)
    assert [r.topic for r in hub.retained.matching("/", "wills/#")] == ["wills/d"]


def test_v5_disconnect_with_session_expiry_zero_ends_a_persistent_session():
    hub = make_hub()
    c = Peer(hub, p.V5)
    c.connect("e1", clean=False, props={"session_expiry_interval": 600})
    c.send(p.Subscribe(1, [p.Subscription("x", 1)]))
    assert "mqtt-subscription-e1qos1" in hub.broker.vhosts["/"].queues
    c.send(p.Disconnect(p.SUCCESS, {"session_expiry_interval": 0}))
    assert "mqtt-subscription-e1qos1" not in hub.broker.vhosts["/"].queues


def test_packets_before_a_login_are_limited_to_64_kib():
    hub = make_hub()
    big = Peer(hub)
    big.send(p.Connect(p.V311, "b", True, 0, "guest", b"x" * 65_000, p.Will("w", b"y" * 10_000, 0, False)))
    assert big.transport_closed and big.session.state != "open"
    ok = Peer(hub)
    ok.connect("ok")
    ok.send(p.Publish("t", b"y" * 100_000))  # after the login the configured limit holds
    assert not ok.session.closed


def test_closed_by_the_broker_sends_the_will_but_a_shutdown_does_not():
    hub = make_hub()
    forced = Peer(hub, p.V5)
    forced.connect("f", will=p.Will("wills/f", b"forced", 0, True))
    forced.session.server_close(320, "Closed via management plugin")
    assert forced.received[0].code == p.ADMINISTRATIVE_ACTION
    stopping = Peer(hub, p.V5)
    stopping.connect("s", will=p.Will("wills/s", b"stopped", 0, True))
    stopping.session.shutdown()
    stopping.clock.advance(0)
    assert stopping.received == [p.Disconnect(p.SERVER_SHUTTING_DOWN)]
    assert [r.topic for r in hub.retained.matching("/", "wills/#")] == ["wills/f"]
