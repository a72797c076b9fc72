"""Content frames (header and body) of a basic.publish: a message is put together from them.

Also the fast path of a whole publish already read (``whole_content``) and the runs of publishes
(``publishes``). Part of the sans-IO protocol (``connection.py`` calls these once it knows the frame's channel
expects content); a complete message becomes an ``ev.Publish`` event.
"""

from __future__ import annotations

from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import (BASIC_PUBLISH, FRAME_BODY, FRAME_END, FRAME_ERROR, FRAME_HEADER,
                                                PRECONDITION_FAILED, UNEXPECTED_FRAME)
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.frames import CONTENT_HEAD, FRAME_HEAD

_CONTENT_HDR = CONTENT_HEAD  # class, weight, body size
_FRAME_HDR = FRAME_HEAD


class Content:
    """A message being received on a channel: basic.publish seen, header and body to come."""

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate", "properties", "size", "parts",
                 "received", "have_header", "discard", "quick")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.properties = b""
        self.size = 0
        self.parts: list[bytes] = []
        self.received = 0
        self.have_header = False
        self.discard = False  # too large: body frames are read and dropped
        self.quick = None     # codec.quick_properties of the header: (delivery_mode, priority, flags)


class Ignore(Exception):
    """Raised internally for frames that belong to a channel being closed."""


def content_for(conn, channel: int, what: str) -> Content:
    """The content in progress a header or body frame of ``channel`` belongs to (``conn``: the
    server connection); Ignore for a channel being closed, AMQPError 505 where none can be."""
    if conn.state != "opened":
        if conn.state == "closing":
            raise Ignore()
        raise AMQPError(UNEXPECTED_FRAME, f"{what} frame before connection.open", hard=True)
    content = conn.channels.get(channel, False)
    if content is False:
        if channel in conn.closing_channels:
            raise Ignore()
        raise AMQPError(UNEXPECTED_FRAME, f"expected method frame, got non method frame ({what}) "
                        f"on channel {channel}, which is not open", hard=True)
    if content is None:
        raise AMQPError(UNEXPECTED_FRAME, f"expected method frame, got non method frame "
                        f"({what}) instead on channel {channel}", hard=True)
    return content


def content_header(channels: dict, channel: int, content: Content, payload: bytes, max_message_size: int,
                   out: list) -> None:
    if content.have_header:
        raise AMQPError(UNEXPECTED_FRAME, f"expected content body, got content header on "
                        f"channel {channel}", 60, 40, hard=True)
    if len(payload) < 14:
        raise AMQPError(FRAME_ERROR, "content header frame too short", 60, 40, hard=True)
    class_id, _weight, size = _CONTENT_HDR.unpack_from(payload, 0)
    if class_id != 60:
        raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got one for "
                        f"class {class_id} instead", 60, 40, hard=True)
    content.properties = payload[12:]
    content.quick = codec.quick_properties(content.properties)  # validated before the body
    content.size = size
    content.have_header = True
    if size > max_message_size:
        # Soft error like RabbitMQ; the body frames that follow are dropped (some may be in
        # this very chunk, read before the session gets to close the channel).
        content.discard = True
        out.append(ev.Method(channel, TooLarge(size, max_message_size)))
        return
    if size == 0:
        channels[channel] = None
        out.append(ev.Publish(channel, content.exchange, content.routing_key, content.mandatory,
                              content.immediate, content.properties, b"", content.quick))


def content_body(channels: dict, channel: int, content: Content, payload: bytes, out: list) -> None:
    if not content.have_header:
        raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got "
                        f"content body on channel {channel}", 60, 40, hard=True)
    content.received += len(payload)
    if content.received > content.size:
        raise AMQPError(FRAME_ERROR, f"content body of {content.received} bytes exceeds the "
                        f"declared size {content.size}", 60, 40, hard=True)
    if content.discard:
        if content.received == content.size:
            channels[channel] = None
    elif content.received == content.size:
        if content.parts:
            content.parts.append(payload)
            body = b"".join(content.parts)
        else:
            body = payload
        channels[channel] = None
        out.append(ev.Publish(channel, content.exchange, content.routing_key, content.mandatory,
                              content.immediate, content.properties, body, content.quick))
    else:
        content.parts.append(payload)


class TooLarge:
    """Pseudo-method telling the session a message exceeded max_message_size (406)."""
    name = "basic.publish"
    index = BASIC_PUBLISH

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit

    def error(self) -> AMQPError:
        return AMQPError(PRECONDITION_FAILED, f"message size {self.size} is larger than configured "
                         f"max size {self.limit}", 60, 40, hard=False)


HEADER_CACHE_MAX = 256    # distinct content-header frames remembered per connection
HEADER_CACHE_FRAME = 512  # the largest payload of one remembered (so ~260 KiB a connection at most)


def whole_content(buf: bytes, pos: int, n: int, channel: int, payload_max: int,
                  max_size: int, cache: dict) -> tuple | None:
    """The usual publish: its content header and single body frame are already in ``buf`` at
    ``pos``, well-formed. Returns (position after them, properties, quick properties, body), or
    None to take them frame by frame (which also reports whatever is wrong with them).

    ``cache``: the connection's content-header frames already seen (a publisher repeats the
    same one, byte for byte, for same-sized messages), each with its (properties, quick
    properties, body size): those are checked and decoded once, and share one properties
    object."""
    if n - pos < 21:
        return None
    ftype, ch, size = _FRAME_HDR.unpack_from(buf, pos)
    end = pos + 7 + size
    if ch != channel or size > payload_max or end >= n:
        return None
    hit = cache.get(buf[pos:end + 1])
    if hit is None:
        if ftype != FRAME_HEADER or size < 14 or buf[end] != FRAME_END:
            return None
        class_id, _weight, body_size = _CONTENT_HDR.unpack_from(buf, pos + 7)
        if class_id != 60:
            return None
        properties = buf[pos + 19:end]
        quick = codec.quick_properties(properties)
        if size <= HEADER_CACHE_FRAME:  # large headers tables are not kept
            if len(cache) >= HEADER_CACHE_MAX:
                cache.clear()
            cache[buf[pos:end + 1]] = properties, quick, body_size
    else:
        properties, quick, body_size = hit
    if body_size > max_size:
        return None
    pos = end + 1
    if body_size == 0:
        return pos, properties, quick, b""
    if n - pos < 8:
        return None
    ftype, ch, size = _FRAME_HDR.unpack_from(buf, pos)
    end = pos + 7 + size
    if ftype != FRAME_BODY or ch != channel or size != body_size or size > payload_max or end >= n \
            or buf[end] != FRAME_END:
        return None
    return end + 1, properties, quick, buf[pos + 7:end]


PUBLISH_BATCH = 512  # most publishes handed up as one event


def publishes(batch: list):
    """One publish as itself, several in a row as one ``ev.Publishes``."""
    return batch[0] if len(batch) == 1 else ev.Publishes(batch[0].channel, batch)
