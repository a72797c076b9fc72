"""The client side of the wire for inter-node links (``link.py``): incoming frames cut out of the
byte stream, content (deliveries, get-oks, returns) assembled with its header and body, and the
few outgoing frames a link writes on its hot path.

Deliveries are decoded by hand (they are most of what a link reads); every other method goes
through pamqp (``codec.decode_method``). Properties stay raw bytes: a relay passes them on as is.
"""

from __future__ import annotations

import struct

from pamqp import commands

from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD
from exchange_broker.protocol.errors import AMQPError

_FRAME_HDR = struct.Struct(">BHI")
_CONTENT_HDR = struct.Struct(">HHQ")
_QB = struct.Struct(">QB")
_PUBLISH_HEAD = struct.Struct(">BHIHHH")  # frame type, channel, size, class, method, reserved
_DELIVER = 0x003C003C  # basic.deliver
_GET_OK = 0x003C0047
_RETURN = 0x003C0032


class LinkError(Exception):
    """A link or one of its channels is closed (``code`` is the AMQP reply code, 0 if none)."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


class Delivery:
    """A message received on a link: by basic.deliver (``consumer_tag`` set), basic.get-ok
    (``message_count`` set) or basic.return (``reply_code`` set)."""

    __slots__ = ("channel", "consumer_tag", "delivery_tag", "redelivered", "exchange", "routing_key",
                 "properties", "body", "message_count", "reply_code", "reply_text", "_size", "_parts")

    def __init__(self, channel: int, exchange: str, routing_key: str) -> None:
        self.channel = channel
        self.exchange = exchange
        self.routing_key = routing_key
        self.consumer_tag = ""
        self.delivery_tag = 0
        self.redelivered = False
        self.message_count = None
        self.reply_code = 0
        self.reply_text = ""
        self.properties = b""
        self.body = b""
        self._size = 0
        self._parts: list[bytes] = []


def _short(payload: bytes, pos: int) -> tuple[str, int]:
    n = payload[pos]
    return payload[pos + 1:pos + 1 + n].decode("utf-8"), pos + 1 + n


def _content_method(channel: int, payload: bytes, mid: int) -> Delivery | None:
    """basic.deliver / get-ok / return, decoded; None for any other method."""
    if mid == _DELIVER:
        tag, pos = _short(payload, 4)
        delivery_tag, bits = _QB.unpack_from(payload, pos)
        exchange, pos = _short(payload, pos + 9)
        routing_key, pos = _short(payload, pos)
        d = Delivery(channel, exchange, routing_key)
        d.consumer_tag, d.delivery_tag, d.redelivered = tag, delivery_tag, bool(bits & 1)
        return d
    if mid == _GET_OK:
        delivery_tag, bits = _QB.unpack_from(payload, 4)
        exchange, pos = _short(payload, 13)
        routing_key, pos = _short(payload, pos)
        d = Delivery(channel, exchange, routing_key)
        d.delivery_tag, d.redelivered = delivery_tag, bool(bits & 1)
        d.message_count = struct.unpack_from(">I", payload, pos)[0]
        return d
    if mid == _RETURN:
        code = struct.unpack_from(">H", payload, 4)[0]
        text, pos = _short(payload, 6)
        exchange, pos = _short(payload, pos)
        routing_key, pos = _short(payload, pos)
        d = Delivery(channel, exchange, routing_key)
        d.reply_code, d.reply_text = code, text
        return d
    return None


class FrameReader:
    """Bytes in, events out: ``("method", channel, pamqp method)``, ``("content", channel,
    Delivery)`` (complete with properties and body) and ``("heartbeat", 0, None)``. A protocol
    violation raises AMQPError (the link then closes)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._content: dict[int, Delivery] = {}  # channel -> content being assembled

    def feed(self, data: bytes) -> list[tuple]:
        buf = self._buf
        buf += data
        out: list[tuple] = []
        pos, n = 0, len(buf)
        while n - pos >= 8:
            ftype, channel, size = _FRAME_HDR.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                raise AMQPError(501, "invalid frame end byte", hard=True)
            payload = bytes(buf[pos + 7:end])
            pos = end + 1
            self._frame(ftype, channel, payload, out)
        del buf[:pos]
        return out

    def _frame(self, ftype: int, channel: int, payload: bytes, out: list) -> None:
        content = self._content
        if ftype == FRAME_METHOD:
            if channel in content:
                raise AMQPError(505, "method frame while content was expected", hard=True)
            mid = codec.method_id(payload)
            try:
                d = _content_method(channel, payload, mid)
            except (IndexError, struct.error, UnicodeDecodeError):
                raise AMQPError(501, "cannot decode a content method", hard=True) from None
            if d is not None:
                content[channel] = d
                d._size = -1  # header expected
                return
            out.append(("method", channel, codec.decode_method(payload)))
        elif ftype == FRAME_HEADER:
            d = content.get(channel)
            if d is None or d._size != -1 or len(payload) < 14:
                raise AMQPError(505, "unexpected content header", hard=True)
            _cls, _weight, size = _CONTENT_HDR.unpack_from(payload, 0)
            d.properties = payload[12:]
            d._size = size
            if size == 0:
                del content[channel]
                out.append(("content", channel, d))
        elif ftype == FRAME_BODY:
            d = content.get(channel)
            if d is None or d._size < 0:
                raise AMQPError(505, "unexpected content body", hard=True)
            d._parts.append(payload)
            got = sum(len(p) for p in d._parts) if len(d._parts) > 1 else len(payload)
            if got >= d._size:
                d.body = payload if len(d._parts) == 1 else b"".join(d._parts)
                d._parts = []
                del content[channel]
                out.append(("content", channel, d))
        elif ftype == FRAME_HEARTBEAT:
            out.append(("heartbeat", 0, None))
        else:
            raise AMQPError(501, f"unknown frame type {ftype}", hard=True)

    def forget(self, channel: int) -> None:
        self._content.pop(channel, None)


def publish_frames(channel: int, exchange_sh: bytes, routing_key_sh: bytes, mandatory: bool,
                   properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """basic.publish + content header + body frames (short strings pre-encoded)."""
    args = exchange_sh + routing_key_sh + (b"\x01" if mandatory else b"\x00")
    head = _PUBLISH_HEAD.pack(FRAME_METHOD, channel, 6 + len(args), 60, 40, 0)
    return [head, args, bytes((FRAME_END,))] + codec.content_frames(channel, 60, properties, body,
                                                                      frame_max)


def method(channel: int, m: commands.Frame) -> bytes:
    return codec.method_frame(channel, m)
