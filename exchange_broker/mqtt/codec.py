"""Sans-IO MQTT codec: :class:`Parser` turns received bytes into packets (``packets.py``), and
:func:`encode` turns a packet into bytes. 3.1, 3.1.1 and 5.0 (the parser learns the level from
CONNECT; 5.0 adds properties and reason codes). Partial input waits for more; input that breaks
the rules raises :class:`MalformedPacket`, a packet over the size limit :class:`PacketTooLarge`."""

from __future__ import annotations

from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import properties as props
from exchange_broker.mqtt.wire import MalformedPacket, Reader, binary, string, u16, varint

__all__ = ["Parser", "encode", "MalformedPacket", "PacketTooLarge"]

FIXED_FLAGS = {p.PUBREL: 2, p.SUBSCRIBE: 2, p.UNSUBSCRIBE: 2}  # required low nibble (others 0)


class PacketTooLarge(MalformedPacket):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"packet of {size} bytes is over the limit of {limit}", p.PACKET_TOO_LARGE)


class Parser:
    """Feed bytes, get whole packets. ``version`` is set by the CONNECT (or by the caller)."""

    def __init__(self, max_packet_size: int = 268_435_455, version: int = p.V311,
                 server: bool = True) -> None:
        self.buf = bytearray()
        self.max_packet_size = max_packet_size
        self.version = version
        self.server = server  # decode what a client sends (a server decodes CONNECT, not CONNACK)

    def feed(self, data: bytes) -> list:
        self.buf += data
        out = []
        buf = self.buf
        pos = 0
        while True:
            head = self._header(buf, pos)
            if head is None:
                break
            first, length, start = head
            if start + length > len(buf):
                break
            pkt = decode_packet(first, bytes(buf[start:start + length]), self.version, self.server)
            if isinstance(pkt, p.Connect):
                self.version = pkt.version
            out.append(pkt)
            pos = start + length
        del buf[:pos]
        return out

    def _header(self, buf: bytearray, pos: int):
        """(first byte, remaining length, payload start) or None when more bytes are needed."""
        if len(buf) - pos < 2:
            return None
        value, shift, i = 0, 0, pos + 1
        while True:
            if i >= len(buf):
                return None
            b = buf[i]
            value |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            shift += 7
            if shift > 21:
                raise MalformedPacket("remaining length longer than 4 bytes")
        size = value + (i - pos)
        if size > self.max_packet_size:
            raise PacketTooLarge(size, self.max_packet_size)
        return buf[pos], value, i


def decode_packet(first: int, body: bytes, version: int, server: bool = True):
    kind, flags = first >> 4, first & 0x0F
    if kind == p.PUBACK and len(body) == 2 and not flags:  # the hot path: a bare PUBACK
        return p.Ack(p.PUBACK, (body[0] << 8) | body[1])
    if kind != p.PUBLISH and flags != FIXED_FLAGS.get(kind, 0):
        raise MalformedPacket(f"packet type {kind} with flags {flags:#x}")
    r = Reader(body)
    v5 = version == p.V5
    if kind == p.CONNECT:
        pkt = _connect(r)
    elif kind == p.PUBLISH:
        pkt = _publish(r, flags, v5)
    elif kind in (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP):
        pkt = p.Ack(kind, r.u16())
        if v5 and r.left():
            pkt.code = r.byte()
            if r.left():
                pkt.properties = props.decode(r)
    elif kind == p.SUBSCRIBE:
        pkt = _subscribe(r, v5)
    elif kind == p.UNSUBSCRIBE:
        pkt = p.Unsubscribe(r.u16(), [])
        if v5:
            pkt.properties = props.decode(r)
        while r.left():
            pkt.topic_filters.append(r.string())
        if not pkt.topic_filters:
            raise MalformedPacket("UNSUBSCRIBE without a topic filter", p.PROTOCOL_ERROR)
    elif kind == p.PINGREQ:
        pkt = p.PingReq()
    elif kind == p.PINGRESP:
        pkt = p.PingResp()
    elif kind == p.DISCONNECT:
        pkt = p.Disconnect()
        if v5 and r.left():
            pkt.code = r.byte()
            if r.left():
                pkt.properties = props.decode(r)
    elif kind == p.AUTH and v5:
        pkt = p.Auth()
        if r.left():
            pkt.code = r.byte()
            pkt.properties = props.decode(r)
    elif kind == p.CONNACK and not server:
        pkt = p.ConnAck(bool(r.byte() & 1), r.byte())
        if v5:
            pkt.properties = props.decode(r)
    elif kind in (p.SUBACK, p.UNSUBACK) and not server:
        pid = r.u16()
        pr = props.decode(r) if v5 else {}
        codes = list(r.take(r.left()))
        pkt = p.SubAck(pid, codes, pr) if kind == p.SUBACK else p.UnsubAck(pid, codes, pr)
    else:
        raise MalformedPacket(f"unexpected packet type {kind}", p.PROTOCOL_ERROR)
    if r.left():
        raise MalformedPacket(f"{r.left()} bytes after the fields of packet type {kind}")
    return pkt


def _connect(r: Reader) -> p.Connect:
    name = r.string()
    level = r.byte()
    if (name, level) not in (("MQIsdp", p.V31), ("MQTT", p.V311), ("MQTT", p.V5)):
        raise MalformedPacket(f"protocol {name!r} level {level}", p.UNSUPPORTED_PROTOCOL_VERSION)
    flags = r.byte()
    if flags & 1:
        raise MalformedPacket("CONNECT reserved flag set")
    keep_alive = r.u16()
    v5 = level == p.V5
    pr = props.decode(r) if v5 else {}
    client_id = r.string()
    will = None
    will_qos = (flags >> 3) & 3
    if flags & 0x04:
        if will_qos > 2:
            raise MalformedPacket("will QoS 3")
        will_props = props.decode(r) if v5 else {}
        will = p.Will(r.string(), r.binary(), will_qos, bool(flags & 0x20), will_props)
    elif will_qos or flags & 0x20:
        raise MalformedPacket("will QoS or retain without a will")
    username = r.string() if flags & 0x80 else None
    if flags & 0x40 and username is None and level == p.V311:
        raise MalformedPacket("password without a user name")
    password = r.binary() if flags & 0x40 else None
    return p.Connect(level, client_id, bool(flags & 0x02), keep_alive, username, password, will, pr)


def _publish(r: Reader, flags: int, v5: bool) -> p.Publish:
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 8)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH QoS 0 with DUP set")
    topic = r.string()
    packet_id = r.u16() if qos else 0
    if qos and not packet_id:
        raise MalformedPacket("PUBLISH with packet identifier 0")
    pr = props.decode(r) if v5 else {}
    payload = r.take(r.left())
    return p.Publish(topic, payload, qos, bool(flags & 1), dup, packet_id, pr)


def _subscribe(r: Reader, v5: bool) -> p.Subscribe:
    pkt = p.Subscribe(r.u16(), [])
    if v5:
        pkt.properties = props.decode(r)
    while r.left():
        topic = r.string()
        opts = r.byte()
        if opts & 0xC0 or (not v5 and opts & 0xFC) or opts & 3 == 3 or (opts >> 4) & 3 == 3:
            raise MalformedPacket(f"subscription options {opts:#x}")
        pkt.subscriptions.append(p.Subscription(topic, opts & 3, bool(opts & 4), bool(opts & 8),
                                                (opts >> 4) & 3))
    if not pkt.subscriptions:
        raise MalformedPacket("SUBSCRIBE without a topic filter", p.PROTOCOL_ERROR)
    return pkt


# -- encoding -----------------------------------------------------------------------------------

def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def encode(pkt, version: int = p.V311) -> bytes:
    v5 = version == p.V5
    t = type(pkt)
    if t is p.Publish:
        flags = (8 if pkt.dup else 0) | (pkt.qos << 1) | (1 if pkt.retain else 0)
        body = string(pkt.topic) + (u16(pkt.packet_id) if pkt.qos else b"")
        if v5:
            body += props.encode(pkt.properties)
        return _packet((p.PUBLISH << 4) | flags, body + pkt.payload)
    if t is p.Ack:
        body = u16(pkt.packet_id)
        if v5 and (pkt.code or pkt.properties):
            body += bytes((pkt.code,)) + (props.encode(pkt.properties) if pkt.properties else b"")
        return _packet((pkt.kind << 4) | FIXED_FLAGS.get(pkt.kind, 0), body)
    if t is p.ConnAck:
        code = pkt.code if v5 else p.CONNACK_V3.get(pkt.code, pkt.code)
        body = bytes((1 if pkt.session_present else 0, code))
        return _packet(p.CONNACK << 4, body + (props.encode(pkt.properties) if v5 else b""))
    if t is p.SubAck:
        body = u16(pkt.packet_id) + (props.encode(pkt.properties) if v5 else b"")
        return _packet(p.SUBACK << 4, body + bytes(pkt.codes))
    if t is p.UnsubAck:
        body = u16(pkt.packet_id)
        if v5:
            body += props.encode(pkt.properties) + bytes(pkt.codes)
        return _packet(p.UNSUBACK << 4, body)
    if t is p.PingResp:
        return bytes((p.PINGRESP << 4, 0))
    if t is p.PingReq:
        return bytes((p.PINGREQ << 4, 0))
    if t is p.Disconnect:
        body = bytes((pkt.code,)) + props.encode(pkt.properties) if v5 and (pkt.code or pkt.properties) else b""
        return _packet(p.DISCONNECT << 4, body)
    if t is p.Auth:  # (the server never sends one: for tests and fuzzers)
        body = bytes((pkt.code,)) + props.encode(pkt.properties) if pkt.code or pkt.properties else b""
        return _packet(p.AUTH << 4, body)
    if t is p.Connect:
        return _packet(p.CONNECT << 4, _connect_body(pkt))
    if t is p.Subscribe:
        body = u16(pkt.packet_id) + (props.encode(pkt.properties) if v5 else b"")
        for s in pkt.subscriptions:
            opts = s.qos | (4 if s.no_local else 0) | (8 if s.retain_as_published else 0) | (s.retain_handling << 4)
            body += string(s.topic_filter) + bytes((opts,))
        return _packet((p.SUBSCRIBE << 4) | 2, body)
    if t is p.Unsubscribe:
        body = u16(pkt.packet_id) + (props.encode(pkt.properties) if v5 else b"")
        return _packet((p.UNSUBSCRIBE << 4) | 2, body + b"".join(string(f) for f in pkt.topic_filters))
    raise TypeError(f"cannot encode {t.__name__}")


def _connect_body(c: p.Connect) -> bytes:
    """A client's CONNECT (tests and the fuzzers build their input with it)."""
    flags = (0x02 if c.clean_start else 0) | (0x80 if c.username is not None else 0) | \
        (0x40 if c.password is not None else 0)
    if c.will is not None:
        flags |= 0x04 | (c.will.qos << 3) | (0x20 if c.will.retain else 0)
    v5 = c.version == p.V5
    body = string(p.PROTOCOL_NAMES[c.version]) + bytes((c.version, flags)) + u16(c.keep_alive)
    body += (props.encode(c.properties) if v5 else b"") + string(c.client_id)
    if c.will is not None:
        body += (props.encode(c.will.properties) if v5 else b"") + string(c.will.topic) + binary(c.will.payload)
    if c.username is not None:
        body += string(c.username)
    if c.password is not None:
        body += binary(c.password)
    return body
