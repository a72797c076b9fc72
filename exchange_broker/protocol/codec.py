"""Frame encoding and the hot-path decoders.

pamqp handles every method; the per-message path (basic.publish in,
basic.deliver/basic.ack out, content headers passed through as raw bytes)
is built with ``struct`` because pamqp costs ~15 µs a message each way.
"""

from __future__ import annotations

import struct
from decimal import Decimal

from pamqp import commands, frame as pframe

from exchange_broker.protocol.constants import (FRAME_BODY, FRAME_END, FRAME_END_BYTE, FRAME_ERROR, FRAME_HEADER,
                                                FRAME_METHOD, SYNTAX_ERROR)
from exchange_broker.protocol.errors import AMQPError
# the frame layer's fast paths, here too for the server's modules that import them from codec
from exchange_broker.protocol.frames import (HEARTBEAT_FRAME, METHOD_ID as _METHOD_ID, ack_frame,  # noqa: F401
                                             content_frames, nack_frame)

_DELIVER_HEAD = struct.Struct(">BHIHH")  # frame type, channel, size, class, method
_QB = struct.Struct(">QB")


def method_frame(channel: int, method: commands.Frame) -> bytes:
    """Encode any method with pamqp (used off the hot path)."""
    return pframe.marshal(method, channel)


def _short(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > 255:
        raw = raw[:255]
    return bytes((len(raw),)) + raw


_DELIVER_PACKERS: dict[tuple, struct.Struct] = {}


def _deliver_packer(a: int, b: int, c: int, d: int) -> struct.Struct:
    """basic.deliver, content header and body frame header in one Struct, for a consumer tag,
    exchange and routing key (encoded short strings) of a, b, c bytes and properties of d."""
    if len(_DELIVER_PACKERS) >= 1024:
        _DELIVER_PACKERS.clear()
    packer = _DELIVER_PACKERS[(a, b, c, d)] = struct.Struct(
        f">BHIHH{a}sQB{b}s{c}sBBHIHHQ{d}sBBHI")
    return packer


def deliver_frames(channel: int, consumer_tag_sh: bytes, delivery_tag: int, redelivered: bool,
                   exchange_sh: bytes, routing_key_sh: bytes, properties: bytes, body: bytes,
                   frame_max: int) -> list[bytes]:
    """basic.deliver + content; the short strings come pre-encoded (length-prefixed)."""
    size = len(body)
    if 0 < size <= frame_max - 8:  # the usual case: one body frame, all but the body in one pack
        a, b, c, d = len(consumer_tag_sh), len(exchange_sh), len(routing_key_sh), len(properties)
        packer = _DELIVER_PACKERS.get((a, b, c, d)) or _deliver_packer(a, b, c, d)
        return [packer.pack(FRAME_METHOD, channel, 13 + a + b + c, 60, 60, consumer_tag_sh,
                            delivery_tag, 1 if redelivered else 0, exchange_sh, routing_key_sh,
                            FRAME_END, FRAME_HEADER, channel, 12 + d, 60, 0, size, properties,
                            FRAME_END, FRAME_BODY, channel, size),
                body, FRAME_END_BYTE]
    args = consumer_tag_sh + _QB.pack(delivery_tag, 1 if redelivered else 0) + exchange_sh + routing_key_sh
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + len(args), 60, 60) + args
    parts = [head, FRAME_END_BYTE]
    parts += content_frames(channel, 60, properties, body, frame_max)
    return parts


_DELIVER_TAIL_HEAD = struct.Struct(">BHIHHQ")
_BODY_HEAD = struct.Struct(">BHI")


def deliver_template(channel: int, consumer_tag_sh: bytes, redelivered: bool, exchange_sh: bytes,
                     routing_key_sh: bytes, properties: bytes, size: int,
                     frame_max: int) -> tuple[bytes, bytes] | None:
    """basic.deliver + content header + body frame header around the one thing that differs
    from message to message of a run (its delivery tag, 8 bytes): (before, after). Frames are
    then ``before``, the tag, ``after``, the body and a frame end. None: more than one body frame
    (``deliver_frames`` then)."""
    if not 0 < size <= frame_max - 8:
        return None
    before = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 13 + len(consumer_tag_sh) + len(exchange_sh) +
                                len(routing_key_sh), 60, 60) + consumer_tag_sh
    after = (b"\x01" if redelivered else b"\x00") + exchange_sh + routing_key_sh + FRAME_END_BYTE + \
        _DELIVER_TAIL_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, size) + properties + \
        FRAME_END_BYTE + _BODY_HEAD.pack(FRAME_BODY, channel, size)
    return before, after


def deliver_template_holed(channel: int, consumer_tag_sh: bytes, redelivered: bool,
                           exchange_sh: bytes, routing_key_sh: bytes, head: bytes, tail: bytes,
                           size: int, frame_max: int) -> tuple[bytes, bytes, bytes] | None:
    """``deliver_template`` for messages whose properties are ``head``, 8 bytes of their own
    (a stream's x-stream-offset value) and ``tail``: (before, middle, after). Frames are then
    ``before``, the delivery tag, ``middle``, the 8 bytes, ``after``, the body and a frame end."""
    template = deliver_template(channel, consumer_tag_sh, redelivered, exchange_sh, routing_key_sh,
                                head + bytes(8) + tail, size, frame_max)
    if template is None:
        return None
    before, after = template
    hole = len(after) - 8 - len(tail) - 8  # the body frame's head (7) and the header's end (1)
    return before, after[:hole], after[hole + 8:]


def get_ok_frames(channel: int, message_count: int, delivery_tag: int, redelivered: bool,
                  exchange_sh: bytes, routing_key_sh: bytes, properties: bytes, body: bytes,
                  frame_max: int) -> list[bytes]:
    """basic.get-ok + content: ``deliver_frames``'s arguments, the queue's message count in place
    of the consumer tag (get-ok carries it after the routing key)."""
    args = _QB.pack(delivery_tag, 1 if redelivered else 0) + exchange_sh + routing_key_sh + \
        struct.pack(">I", message_count)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + len(args), 60, 71)
    return [head, args, FRAME_END_BYTE] + content_frames(channel, 60, properties, body, frame_max)


def return_frames(channel: int, reply_code: int, reply_text: str, exchange: str, routing_key: str,
                  properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    args = struct.pack(">H", reply_code) + _short(reply_text) + _short(exchange) + _short(routing_key)
    head = _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + len(args), 60, 50)
    return [head, args, FRAME_END_BYTE] + content_frames(channel, 60, properties, body, frame_max)


def short_str(value: str) -> bytes:
    return _short(value)


SHORT_STRINGS: dict[str, bytes] = {}  # exchange names and routing keys, encoded for deliveries
_SHORT_STRINGS_MAX = 4096


def short_cached(value: str) -> bytes:
    """``short_str(value)``, remembered in SHORT_STRINGS (look there first; emptied when full)."""
    encoded = _short(value)
    if len(SHORT_STRINGS) >= _SHORT_STRINGS_MAX:
        SHORT_STRINGS.clear()
    SHORT_STRINGS[value] = encoded
    return encoded


_DECLARE_OK_COUNTS = struct.Struct(">II")


def queue_declare_ok_frame(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """queue.declare-ok, encoded here: pamqp's DeclareOk refuses names outside [A-Za-z0-9-_.:@#,/+ ]
    that RabbitMQ (and this broker) accept, e.g. ``q!`` or ``é``."""
    args = _short(queue) + _DECLARE_OK_COUNTS.pack(message_count & 0xFFFFFFFF, consumer_count & 0xFFFFFFFF)
    return _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + len(args), 50, 11) + args + FRAME_END_BYTE


# --- decoding -------------------------------------------------------------------------------

def method_id(payload: bytes) -> int:
    if len(payload) < 4:
        raise AMQPError(FRAME_ERROR, "method frame too short to hold a class and method id", hard=True)
    return _METHOD_ID.unpack_from(payload, 0)[0]


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """basic.publish arguments: exchange, routing key, mandatory, immediate."""
    try:
        pos = 6  # class, method, reserved-1 short
        n = payload[pos]
        exchange = payload[pos + 1:pos + 1 + n]
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1:pos + 1 + n]
        pos += 1 + n
        bits = payload[pos]
        if pos + 1 != len(payload) or len(exchange) + len(routing_key) + 9 > len(payload):
            raise IndexError
        return (exchange.decode("utf-8"), routing_key.decode("utf-8"), bool(bits & 1), bool(bits & 2))
    except (IndexError, UnicodeDecodeError):
        raise AMQPError(FRAME_ERROR, "cannot decode basic.publish arguments", 60, 40, hard=True) from None


def decode_tag_bits(payload: bytes) -> tuple[int, int]:
    """basic.ack / basic.nack / basic.reject: delivery tag and the bit octet."""
    if len(payload) != 13:
        raise AMQPError(FRAME_ERROR, "cannot decode acknowledgement arguments", hard=True)
    return _QB.unpack_from(payload, 4)


def decode_method(payload: bytes) -> commands.Frame:
    """Decode any method frame through pamqp; bad input becomes a 501/540 error (as RabbitMQ)."""
    mid = method_id(payload)
    cls = commands.INDEX_MAPPING.get(mid)
    if cls is None:
        raise AMQPError(540, f"unknown method: class {mid >> 16}, method {mid & 0xFFFF}",
                        mid >> 16, mid & 0xFFFF, hard=True)
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except Exception as exc:  # pamqp raises struct.error, ValueError, IndexError, UnicodeError ...
        raise AMQPError(FRAME_ERROR, f"cannot decode {cls.name} arguments: {exc}",
                        mid >> 16, mid & 0xFFFF, hard=True) from None
    for attr in ("arguments", "client_properties"):
        if too_deep(getattr(method, attr, None)):
            raise AMQPError(FRAME_ERROR, f"cannot decode {cls.name} arguments: field table nested "
                            f"deeper than {MAX_TABLE_DEPTH} levels", mid >> 16, mid & 0xFFFF, hard=True)
    return method


MAX_TABLE_DEPTH = 64  # nested tables/arrays accepted; deeper ones would break recursive code later


def too_deep(value, limit: int = MAX_TABLE_DEPTH) -> bool:
    """Is a decoded field value nested deeper than ``limit`` tables/arrays (checked without
    recursion, so any depth is safe to ask about)?"""
    if not isinstance(value, (dict, list)):
        return False
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        for item in (v.values() if isinstance(v, dict) else v):
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1))
    return False


# --- content header properties, parsed lazily ---------------------------------------------------

def parse_properties(raw: bytes) -> dict:
    """Decode raw content-header property bytes (flags + values) into a dict of set properties."""
    out: dict = {}
    try:
        flags = 0
        pos = 0
        shift = 0
        while True:
            word = struct.unpack_from(">H", raw, pos)[0]
            pos += 2
            flags |= (word & 0xFFFE) << shift if shift else (word & 0xFFFE)
            if not word & 1:
                break
            shift += 16
        props = commands.Basic.Properties()
        props.unmarshal(flags, raw[pos:])
        for name in props.__slots__:
            value = getattr(props, name)
            if value is not None:
                out[name] = value
        if too_deep(out.get("headers")):
            raise ValueError(f"headers nested deeper than {MAX_TABLE_DEPTH} levels")
    except Exception as exc:
        raise AMQPError(SYNTAX_ERROR, f"malformed content header properties: {exc}", 60, 40,
                        hard=True) from None
    return out


def encode_properties(props: dict) -> bytes:
    return commands.Basic.Properties(**props).marshal()


_FLAG_CT, _FLAG_CE, _FLAG_HEADERS, _FLAG_DM, _FLAG_PRIO = 1 << 15, 1 << 14, 1 << 13, 1 << 12, 1 << 11
FLAG_HEADERS = _FLAG_HEADERS
FLAG_PRIORITY = _FLAG_PRIO
FLAG_EXPIRATION = 1 << 8
FLAG_REPLY_TO = 1 << 9
FLAG_USER_ID = 1 << 4


def headers_offset(raw: bytes) -> tuple[int, int]:
    """(property flags, position of the headers field) in raw content-header properties: the
    headers table, when ``flags & FLAG_HEADERS``, starts there with its 4-byte length. Raises
    IndexError on truncated input."""
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    if flags & 1:  # continuation flag words: skip
        while (raw[pos - 2] << 8 | raw[pos - 1]) & 1:
            pos += 2
    if flags & _FLAG_CT:
        pos += 1 + raw[pos]
    if flags & _FLAG_CE:
        pos += 1 + raw[pos]
    return flags, pos


def quick_properties(raw: bytes) -> tuple[int, int, bool]:
    """Fast path: (delivery_mode, priority, flags) without decoding tables; ``flags`` is the
    property-presence word (test ``FLAG_HEADERS`` / ``FLAG_EXPIRATION``).

    Raises AMQPError on truncated input.
    """
    try:
        flags, pos = headers_offset(raw)
        if flags & _FLAG_HEADERS:
            pos += 4 + int.from_bytes(raw[pos:pos + 4], "big")
        dm = 0
        if flags & _FLAG_DM:
            dm = raw[pos]
            pos += 1
        prio = 0
        if flags & _FLAG_PRIO:
            prio = raw[pos]
        if pos > len(raw):
            raise IndexError
        return dm, prio, flags
    except IndexError:
        raise AMQPError(SYNTAX_ERROR, "malformed content header properties", 60, 40, hard=True) from None



# --- the headers field table, scanned in place (no full decode) ------------------------------------
# Sizes of field values by type octet: fixed-size ones, and those carrying a 4-byte length.
_FIELD_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("U"): 2,
                ord("I"): 4, ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8,
                ord("D"): 5, ord("T"): 8, ord("V"): 0, 0: 0}
_FIELD_SIZED = {ord("S"), ord("x"), ord("A"), ord("F")}
_FIELD_NUMBER = {ord(k): struct.Struct(f) for k, f in (
    ("b", ">b"), ("B", ">B"), ("s", ">h"), ("u", ">H"), ("U", ">h"), ("I", ">i"), ("i", ">I"),
    ("l", ">q"), ("L", ">q"), ("f", ">f"), ("d", ">d"))}
UNREADABLE = object()  # raw_header: the table holds a type the scanner cannot size, or is cut short
NOT_SCALAR = object()  # raw_header: present, but a byte array, timestamp, table, array or void


def headers_span(raw: bytes) -> tuple[int, int] | None:
    """(start, end) of the headers field table's entries in raw content-header properties; None
    without headers (or a table running past the end). Raises IndexError on truncated input."""
    flags, pos = headers_offset(raw)
    if not flags & _FLAG_HEADERS:
        return None
    end = pos + 4 + int.from_bytes(raw[pos:pos + 4], "big")
    return (pos + 4, end) if end <= len(raw) else None


def field_entries(raw: bytes, start: int, end: int):
    """(key start, type position, value end) of each entry of the field table in raw[start:end];
    yields None and stops at a type it cannot size (or an entry running past ``end``)."""
    pos = start
    while pos < end:
        tpos = pos + 1 + raw[pos]
        kind = raw[tpos]
        size = _FIELD_FIXED.get(kind)
        if size is not None:
            vend = tpos + 1 + size
        elif kind in _FIELD_SIZED:
            vend = tpos + 5 + int.from_bytes(raw[tpos + 1:tpos + 5], "big")
        else:
            yield None
            return
        if vend > end:
            yield None
            return
        yield pos, tpos, vend
        pos = vend


def raw_header(raw: bytes, name: bytes):
    """One header's value read straight from raw properties: numbers as int/float, 'D' as a
    Decimal, 'S' as bytes, 't' as bool; None when absent (the last entry wins when repeated),
    ``NOT_SCALAR`` for other types, ``UNREADABLE`` when the table cannot be scanned."""
    key = bytes((len(name),)) + name
    try:
        span = headers_span(raw)
        if span is None or key not in raw:
            return None
        value = None
        for entry in field_entries(raw, *span):
            if entry is None:
                return UNREADABLE
            pos, tpos, vend = entry
            if raw[pos:tpos] != key:
                continue
            kind = raw[tpos]
            if kind in _FIELD_NUMBER:
                value = _FIELD_NUMBER[kind].unpack_from(raw, tpos + 1)[0]
            elif kind == 68:  # 'D': scale octet, signed 32-bit unscaled value
                value = Decimal(int.from_bytes(raw[tpos + 2:tpos + 6], "big", signed=True)) \
                    .scaleb(-raw[tpos + 1])
            elif kind == 83:  # 'S'
                value = bytes(raw[tpos + 5:vend])
            elif kind == 116:  # 't'
                value = bool(raw[tpos + 1])
            else:
                value = NOT_SCALAR
        return value
    except (IndexError, struct.error):
        return UNREADABLE


def replace_int_header(raw: bytes, name: bytes, value: int) -> bytes:
    """Raw properties with every ``name`` header's value replaced by the integer ``value`` ('I'
    when it fits 32 bits, else 'l'); every other byte, and so every other header's wire type, is
    kept. The properties come back unchanged when the table cannot be scanned."""
    if value >= -(2 ** 31) and value < 2 ** 31:
        new_value = b"I" + struct.pack(">i", value)
    else:
        new_value = b"l" + struct.pack(">q", value)
    key = bytes((len(name),)) + name
    try:
        span = headers_span(raw)
        if span is None:
            return raw
        start, end = span
        out = bytearray()
        for entry in field_entries(raw, start, end):
            if entry is None:
                return raw  # a type we cannot skip: leave the properties alone
            pos, tpos, vend = entry
            if raw[pos:tpos] == key:
                out += raw[pos:tpos] + new_value
            else:
                out += raw[pos:vend]
    except IndexError:
        return raw
    return raw[:start - 4] + len(out).to_bytes(4, "big") + bytes(out) + raw[end:]
