"""MQTT 5.0 properties: identifier -> (name, type); decoded into a dict by name (user
properties as a list of pairs, subscription identifiers as a list)."""

from __future__ import annotations

from exchange_broker.mqtt.wire import MalformedPacket, Reader, binary, string, u16, u32, varint

BYTE, U16, U32, VARINT, UTF8, BIN, PAIR = range(7)

PROPERTIES = {
    0x01: ("payload_format_indicator", BYTE),
    0x02: ("message_expiry_interval", U32),
    0x03: ("content_type", UTF8),
    0x08: ("response_topic", UTF8),
    0x09: ("correlation_data", BIN),
    0x0B: ("subscription_identifier", VARINT),
    0x11: ("session_expiry_interval", U32),
    0x12: ("assigned_client_identifier", UTF8),
    0x13: ("server_keep_alive", U16),
    0x15: ("authentication_method", UTF8),
    0x16: ("authentication_data", BIN),
    0x17: ("request_problem_information", BYTE),
    0x18: ("will_delay_interval", U32),
    0x19: ("request_response_information", BYTE),
    0x1A: ("response_information", UTF8),
    0x1C: ("server_reference", UTF8),
    0x1F: ("reason_string", UTF8),
    0x21: ("receive_maximum", U16),
    0x22: ("topic_alias_maximum", U16),
    0x23: ("topic_alias", U16),
    0x24: ("maximum_qos", BYTE),
    0x25: ("retain_available", BYTE),
    0x26: ("user_property", PAIR),
    0x27: ("maximum_packet_size", U32),
    0x28: ("wildcard_subscription_available", BYTE),
    0x29: ("subscription_identifier_available", BYTE),
    0x2A: ("shared_subscription_available", BYTE),
}
IDS = {name: (ident, kind) for ident, (name, kind) in PROPERTIES.items()}
REPEATABLE = ("user_property", "subscription_identifier")


def decode(r: Reader) -> dict:
    """The property block at the reader's position (its varint length first)."""
    length = r.varint()
    if length > r.left():
        raise MalformedPacket("properties longer than the packet")
    end = r.pos + length
    inner = Reader(r.data, r.pos, end)
    r.pos = end
    out: dict = {}
    while inner.left():
        ident = inner.varint()
        spec = PROPERTIES.get(ident)
        if spec is None:
            raise MalformedPacket(f"unknown property 0x{ident:02x}")
        name, kind = spec
        if kind == BYTE:
            value = inner.byte()
        elif kind == U16:
            value = inner.u16()
        elif kind == U32:
            value = inner.u32()
        elif kind == VARINT:
            value = inner.varint()
        elif kind == UTF8:
            value = inner.string()
        elif kind == BIN:
            value = inner.binary()
        else:
            value = (inner.string(), inner.string())
        if name in REPEATABLE:
            out.setdefault(name, []).append(value)
        elif name in out:  # MQTT-2.2.2-1: a property other than these appears at most once
            raise MalformedPacket(f"property {name} given twice", 0x82)
        else:
            out[name] = value
    return out


def encode(props: dict | None) -> bytes:
    """A property block, its length first (unknown names are a programming error)."""
    body = bytearray()
    for name, value in (props or {}).items():
        ident, kind = IDS[name]
        for v in (value if name in REPEATABLE else (value,)):
            body += varint(ident)
            if kind == BYTE:
                body.append(v)
            elif kind == U16:
                body += u16(v)
            elif kind == U32:
                body += u32(v)
            elif kind == VARINT:
                body += varint(v)
            elif kind == UTF8:
                body += string(v)
            elif kind == BIN:
                body += binary(v)
            else:
                body += string(v[0]) + string(v[1])
    return varint(len(body)) + bytes(body)
