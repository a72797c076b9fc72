"""The sans-IO MQTT codec: every packet a client sends round-trips through encode and Parser
(3.1, 3.1.1, 5.0 with properties), input split anywhere waits for the rest, broken input raises
MalformedPacket (never anything else, also for random bytes), and the size limit holds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt.codec import MalformedPacket, PacketTooLarge, Parser

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

V5_PROPS = {"message_expiry_interval": 60, "content_type": "text/plain", "response_topic": "r/1",
            "correlation_data": b"\x00\x01", "user_property": [("a", "1"), ("a", "2")],
            "subscription_identifier": [7], "topic_alias": 3, "payload_format_indicator": 1}

CLIENT_PACKETS = [
    p.Publish("a/b", b"x", 0),
    p.Publish("a/b", b"", 1, True, True, 65535),
    p.Publish("a/b", b"\x00" * 300, 2, False, False, 9),
    p.Ack(p.PUBACK, 1), p.Ack(p.PUBREC, 2), p.Ack(p.PUBREL, 3), p.Ack(p.PUBCOMP, 4),
    p.Subscribe(5, [p.Subscription("a/+", 1), p.Subscription("#", 0)]),
    p.Unsubscribe(6, ["a/+", "#"]),
    p.PingReq(), p.Disconnect(),
]


def parsed(data: bytes, version: int = p.V311) -> list:
    return Parser(version=version).feed(data)


@pytest.mark.parametrize("version", [p.V31, p.V311, p.V5])
def test_connect_round_trip(version):
    will = p.Will("w/t", b"gone", 1, True, {"will_delay_interval": 5} if version == p.V5 else {})
    c = p.Connect(version, "client-1", False, 30, "vh:user", b"secret", will,
                  {"session_expiry_interval": 3600, "receive_maximum": 5} if version == p.V5 else {})
    parser = Parser()
    assert parser.feed(codec.encode(c, version)) == [c]
    assert parser.version == version


@pytest.mark.parametrize("pkt", CLIENT_PACKETS, ids=lambda x: type(x).__name__)
def test_client_packets_round_trip_311(pkt):
    assert parsed(codec.encode(pkt)) == [pkt]


def test_v5_properties_and_reason_codes_round_trip():
    pub = p.Publish("a/b", b"body", 1, False, False, 3, dict(V5_PROPS))
    sub = p.Subscribe(4, [p.Subscription("x/#", 2, True, True, 2)], {"subscription_identifier": [12]})
    ack = p.Ack(p.PUBACK, 5, p.NO_MATCHING_SUBSCRIBERS, {"reason_string": "nobody"})
    disc = p.Disconnect(p.DISCONNECT_WITH_WILL, {"session_expiry_interval": 0})
    data = b"".join(codec.encode(x, p.V5) for x in (pub, sub, ack, disc))
    assert parsed(data, p.V5) == [pub, sub, ack, disc]


def test_server_packets_decode_on_the_client_side():
    out = [p.ConnAck(True, 0), p.SubAck(1, [0, 1, 0x80]), p.UnsubAck(2), p.PingResp()]
    data = b"".join(codec.encode(x) for x in out)
    assert Parser(server=False).feed(data) == out
    v5 = [p.ConnAck(False, p.SUCCESS, {"assigned_client_identifier": "x", "topic_alias_maximum": 4}),
          p.UnsubAck(3, [0, 0x11])]
    assert Parser(version=p.V5, server=False).feed(b"".join(codec.encode(x, p.V5) for x in v5)) == v5


def test_a_311_connack_carries_the_311_code_of_a_v5_reason():
    assert codec.encode(p.ConnAck(False, p.BAD_USER_NAME_OR_PASSWORD)) == b"\x20\x02\x00\x04"
    assert codec.encode(p.ConnAck(False, p.NOT_AUTHORIZED)) == b"\x20\x02\x00\x05"


def test_input_split_at_every_byte_waits_for_the_rest():
    data = b"".join(codec.encode(x) for x in CLIENT_PACKETS)
    parser = Parser()
    out = []
    for i in range(len(data)):
        out += parser.feed(data[i:i + 1])
    assert out == CLIENT_PACKETS
    assert not parser.buf


@pytest.mark.parametrize("data, why", [
    (b"\x30\x80\x80\x80\x80\x01", "remaining length longer than 4 bytes"),
    (b"\x36\x05\x00\x01a\x00\x01", "QoS 3"),
    (b"\x82\x02\x00\x01", "SUBSCRIBE without a topic filter"),
    (b"\x80\x06\x00\x01\x00\x01a\x01", "flags 0x0"),          # SUBSCRIBE must have flags 0b0010
    (b"\x32\x05\x00\x01a\x00\x00", "packet identifier 0"),
    (b"\x30\x04\x00\x02\xc3\x28", "not UTF-8"),
    (b"\x30\x04\x00\x02a\x00", "holds U.0000"),
    (b"\xc0\x01\x00", "bytes after the fields"),                 # PINGREQ with a body
    (b"\x20\x02\x00\x00", "unexpected packet type 2"),           # CONNACK sent to a server
    (b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00", "level 6"),
    (b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00", "reserved flag"),
    (b"\x10\x0c\x00\x04MQTT\x04\x22\x00\x3c\x00\x00", "retain without a will"),
])
def test_malformed_input_raises_malformed_packet(data, why):
    with pytest.raises(MalformedPacket, match=why):
        parsed(data)


def test_v5_duplicate_and_unknown_properties_are_malformed():
    body = b"\x00\x01a" + b"\x06\x02\x00\x00\x00\x01\x02\x00"  # message expiry given twice (cut)
    with pytest.raises(MalformedPacket):
        parsed(b"\x30" + bytes((len(body),)) + body, p.V5)
    body = b"\x00\x01a\x02\x7f\x00"
    with pytest.raises(MalformedPacket, match="unknown property"):
        parsed(b"\x30" + bytes((len(body),)) + body, p.V5)


def test_max_packet_size_is_checked_before_the_body_arrives():
    parser = Parser(max_packet_size=100)
    assert parser.feed(codec.encode(p.Publish("t", b"x" * 90))) != []
    big = codec.encode(p.Publish("t", b"x" * 200))
    with pytest.raises(PacketTooLarge) as info:
        parser.feed(big[:4])  # the header alone says it is too large
    assert info.value.code == p.PACKET_TOO_LARGE


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([p.V31, p.V311, p.V5]))
def test_random_bytes_give_packets_or_malformed_packet(data, version):
    parser = Parser(max_packet_size=1000, version=version)
    try:
        parser.feed(data)
    except MalformedPacket:
        pass


topic = st.text(st.characters(blacklist_characters="\x00+#", blacklist_categories=("Cs",)),
                min_size=1, max_size=20)


@FUZZ
@given(topic, st.binary(max_size=100), st.integers(0, 2), st.booleans(), st.integers(1, 65535),
       st.dictionaries(st.sampled_from(["content_type", "response_topic"]), topic),
       st.lists(st.tuples(topic, topic), max_size=3))
def test_any_publish_round_trips(name, payload, qos, retain, pid, props, users):
    if users:
        props["user_property"] = users
    pub = p.Publish(name, payload, qos, retain, bool(qos) and retain, pid if qos else 0, props)
    assert parsed(codec.encode(pub, p.V5), p.V5) == [pub]
    pub.properties = {}
    assert parsed(codec.encode(pub)) == [pub]
