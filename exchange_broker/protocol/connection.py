"""Sans-IO server side of an AMQP 0-9-1 connection (and of AMQP 0-8's few differences: amqp_0_8.py).

``events(bytes)`` yields events one frame at a time (``receive_data`` returns them as a list);
``data_to_send()`` returns the bytes to write. Frames are handled strictly in arrival order: a
frame is parsed only once the events of the frames before it were handled, and the replies the
protocol makes itself (open-ok, close-ok) go out after the events that precede them, so every
reply leaves in the order of the requests however many frames arrive in one read. Replies that
must wait (a declare-ok until the store has the definition) hold their place (``hold``/``fill``,
``output.py``). Handshake policy (login, vhost access) comes in as two callables: no broker state.
"""

from __future__ import annotations

import struct
from typing import Callable, Iterator

from pamqp import commands

from exchange_broker.protocol import amqp_0_8, codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import (BASIC_ACK, BASIC_NACK, BASIC_PUBLISH, BASIC_REJECT,
                                                CHANNEL_ERROR, CHANNEL_MAX_DEFAULT, FRAME_BODY, FRAME_END,
                                                FRAME_ERROR, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_MAX_DEFAULT,
                                                FRAME_METHOD, FRAME_MIN_SIZE, HEARTBEAT_DEFAULT,
                                                MAX_MESSAGE_SIZE_DEFAULT, NOT_ALLOWED, UNEXPECTED_FRAME)
from exchange_broker.protocol.content import (PUBLISH_BATCH, Content, Ignore, TooLarge, content_body, content_for,
                                             content_header,
                                             publishes as _publishes, whole_content as _whole_content)
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.frames import FRAME_HEAD, frame
from exchange_broker.protocol.connection_class import FRAME_SIZE_FUDGE, ConnectionClassMethods
from exchange_broker.protocol.handshake import SilentRefusal
from exchange_broker.protocol.output import Outbox, Output, Slot

__all__ = ["ServerConnection", "TooLarge"]

_FRAME_HDR = FRAME_HEAD

Authenticate = Callable[[str, bytes], "str | None"]  # -> user name, raise AMQPError, or None: see login_done
OpenVhost = Callable[[str, str], None]              # user, vhost -> None, or raise AMQPError

_CH_OPEN = commands.Channel.Open.index
_CH_CLOSE = commands.Channel.Close.index
_CH_CLOSE_OK = commands.Channel.CloseOk.index
_OPEN_OK_PAYLOAD = struct.pack(">HHI", 20, 11, 0)
_CLOSE_OK_PAYLOAD = struct.pack(">HH", 20, 41)
_PUBLISH_ID = struct.pack(">I", BASIC_PUBLISH)
PUBLISH_CACHE_MAX = 256  # distinct basic.publish method payloads remembered per connection


def _channel_frame(channel: int, payload: bytes) -> bytes:
    return frame(FRAME_METHOD, channel, payload)


class ServerConnection(Outbox, ConnectionClassMethods):
    """One client connection's protocol state."""

    def __init__(self, authenticate: Authenticate, open_vhost: OpenVhost, server_properties: dict,
                 *, channel_max: int = CHANNEL_MAX_DEFAULT, frame_max: int = FRAME_MAX_DEFAULT,
                 heartbeat: int = HEARTBEAT_DEFAULT,
                 max_message_size: int = MAX_MESSAGE_SIZE_DEFAULT,
                 mechanisms: str = "PLAIN AMQPLAIN") -> None:
        self._authenticate = authenticate
        self._open_vhost = open_vhost
        self._server_properties = server_properties
        self.server_channel_max = channel_max
        self.server_frame_max = frame_max
        self.server_heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.mechanisms = mechanisms
        # negotiated values
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.user: str | None = None
        self.vhost: str | None = None
        self.client_properties: dict = {}
        self.state = "header"  # header, start, tune, open, opened, closing, closed
        self._buf = bytearray()
        # where the input not yet turned into handed-up events starts (set at each yield of
        # ``events``; -1 where the events of one frame are handed up one by one): see ``detach``
        self._mark = -1
        self._detaching = False
        self._publish_cache: dict = {}  # basic.publish payloads seen: their decoded arguments
        self._header_cache: dict = {}   # content-header frames seen (content.whole_content)
        # the last whole publish: (its frames up to the body, channel, exchange, routing key,
        # mandatory, immediate, properties, quick properties, body size)
        self._last_publish: tuple | None = None
        self._output = Output()
        self._out = self._output.ready
        # largest frame payload accepted: RabbitMQ's initial_frame_max until tune-ok, then frame_max
        self._payload_max = FRAME_MIN_SIZE - 8 + FRAME_SIZE_FUDGE
        self.channels: dict[int, Content | None] = {}   # open channel -> pending content
        self.closing_channels: set[int] = set()
        self.capabilities: dict = {}
        self.amqp_0_8 = False  # the client opened with an AMQP 0-8 header (amqp_0_8.py)
        self._open_ok = _OPEN_OK_PAYLOAD

    # -- output --------------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        """Output waits behind a held reply (see ``hold``)."""
        return self._output.waiting

    def send_method(self, channel: int, method: commands.Frame) -> None:
        self._output.add(channel, codec.method_frame(channel, method))

    def send_raw(self, data: bytes) -> None:
        """Frames of one channel (the first frame's header names it)."""
        out = self._output
        if out.held:
            out.add((data[1] << 8) | data[2], data)
        else:
            self._out.append(data)

    def send_parts(self, parts: list[bytes]) -> None:
        """Frames of one channel in pieces (the first piece starts with a frame header)."""
        out = self._output
        if out.held:
            first = parts[0]
            out.extend((first[1] << 8) | first[2], parts)
        else:
            self._out.extend(parts)

    def send_heartbeat(self) -> None:
        self._out.append(codec.HEARTBEAT_FRAME)

    def hold(self, channel: int, capturing: bool = False) -> Slot:
        """Reserve the place of a reply that is not ready: what ``channel`` sends afterwards (and
        the connection's close-ok) waits until ``fill`` puts the reply there. ``capturing``: the
        channel's output goes into the place itself until ``seal``."""
        return self._output.hold(channel, capturing)

    def seal(self, slot: Slot) -> None:
        self._output.seal(slot)

    def put(self, slot: Slot, data: bytes) -> None:
        """Frames into a held place (before what waits behind it)."""
        self._output.put(slot, data)

    def fill(self, slot: Slot, data: bytes = b"") -> None:
        """The held reply is ready (``b""``: nothing more to send); what waited behind it
        becomes ready to write."""
        self._output.fill(slot, data)

    # -- closing -------------------------------------------------------------------------------
    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> ev.Closing:
        """Start a server-initiated connection close."""
        err = AMQPError(code, text, class_id, method_id, hard=True)
        return self._fail(err)

    def _fail(self, err: AMQPError) -> ev.Closing:
        if self.state in ("closing", "closed"):
            return ev.Closing(err.code, err.text, False)
        if self.state in ("header",) or isinstance(err, SilentRefusal):
            self.state = "closed"
            return ev.Closing(err.code, err.text, False)
        self._output.drop_held()  # replies still waiting for the store are not sent after a close
        self._out.append(self._conn_frame(codec.method_frame(0, commands.Connection.Close(
            err.code, err.reply_text, err.class_id, err.method_id))))
        self.state = "closing"
        self.channels.clear()
        self.closing_channels.clear()
        return ev.Closing(err.code, err.text, False)

    def _conn_frame(self, data: bytes) -> bytes:
        return amqp_0_8.connection_frame(data) if self.amqp_0_8 else data

    def close_channel(self, channel: int, err: AMQPError) -> None:
        """Server-initiated channel close after a soft error; frames until close-ok are dropped."""
        if channel not in self.channels:
            return
        self.send_method(channel, commands.Channel.Close(err.code, err.reply_text, err.class_id, err.method_id))
        del self.channels[channel]
        self.closing_channels.add(channel)

    # -- input ---------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list:
        """All events of ``data`` at once (the replies of later frames are then already made)."""
        return list(self.events(data))

    def events(self, data: bytes) -> Iterator:
        """Events of ``data``, one frame after the other: the next frame is parsed (and the
        protocol's own reply to it made) only when the caller asks for the next event."""
        if self.state == "closed":
            return
        buf = self._buf
        buf += data
        if self.state == "login":  # the login is being decided: the input waits (see login_done)
            return
        out: list = []
        batch: list = []  # complete publishes on one channel, not yet handed up
        try:
            if self.state == "header":
                if not self._receive_header(out):
                    yield from out
                    return
            pos = 0
            n = len(buf)
            # frames are sliced from one immutable copy (one allocation per slice), made only once
            # the first frame is complete (a large frame arrives read by read); buf loses what is read
            src = bytes(buf) if n < 7 or _FRAME_HDR.unpack_from(buf, 0)[2] + 8 <= n else buf
            payload_max = self._payload_max
            channels = self.channels
            publish_cache = self._publish_cache
            header_cache = self._header_cache
            last = self._last_publish
            pending = None  # a whole publish just read: joins the batch at the top of the loop
            pending_at = -1  # where its frames start (-1: earlier reads, frame by frame)
            try:
                while True:
                    if pending is not None:
                        # publishes in a row on one channel go up together (nothing is
                        # answered between them, so the order of replies holds)
                        if batch and batch[0].channel != pending.channel:
                            self._mark = pending_at
                            yield _publishes(batch)
                            batch = []
                        batch.append(pending)
                        pending = None
                        if len(batch) >= PUBLISH_BATCH:
                            self._mark = pos
                            yield _publishes(batch)
                            batch = []
                    if n - pos < 7:
                        break
                    # the hottest path: the same publish as the last one but for its body (the
                    # method, content header and body frame header known byte for byte)
                    if last is not None and src.startswith(last[0], pos) and self.state == "opened":
                        end = pos + len(last[0]) + last[8]
                        if end < n and src[end] == FRAME_END and channels.get(last[1], False) is None:
                            pending = ev.Publish(last[1], last[2], last[3], last[4], last[5], last[6],
                                                 src[end - last[8]:end], last[7])
                            pending_at = pos
                            pos = end + 1
                            continue
                    start = pos
                    ftype, channel, size = _FRAME_HDR.unpack_from(src, pos)
                    if size > payload_max:
                        limit = payload_max - FRAME_SIZE_FUDGE + 8
                        raise _FrameError(FRAME_ERROR, f"frame size {size + 8} exceeds frame_max {limit} "
                                          f"(by more than the {FRAME_SIZE_FUDGE} bytes tolerated)", hard=True)
                    end = pos + 7 + size
                    if end >= n:
                        break
                    if src[end] != FRAME_END:
                        raise _FrameError(FRAME_ERROR, f"invalid frame end byte 0x{src[end]:02x}",
                                          hard=True)
                    payload = src[pos + 7:end]
                    pos = end + 1
                    # the hot path: a basic.publish, or a content frame of a publish in progress,
                    # on an open channel (anything unusual takes the generic path below)
                    if self.state == "opened":
                        content = channels.get(channel, False)
                        event = None
                        if ftype == FRAME_METHOD:
                            # a basic.publish payload seen before is known by its bytes
                            decoded = publish_cache.get(payload) if content is None else None
                            if decoded is None and content is None and payload[:4] == _PUBLISH_ID:
                                decoded = codec.decode_publish(payload)
                                if len(publish_cache) >= PUBLISH_CACHE_MAX:
                                    publish_cache.clear()
                                publish_cache[payload] = decoded
                            if decoded is not None:
                                exchange, rk, mandatory, immediate = decoded
                                whole = _whole_content(src, pos, n, channel, payload_max,
                                                       self.max_message_size, header_cache)
                                if whole is None:  # frame by frame (split, large or unusual)
                                    channels[channel] = Content(exchange, rk, mandatory, immediate)
                                    continue
                                pos, properties, quick, body = whole
                                event = ev.Publish(channel, exchange, rk, mandatory, immediate,
                                                   properties, body, quick)
                                if body:
                                    last = self._last_publish = (
                                        src[start:pos - 1 - len(body)], channel, exchange, rk,
                                        mandatory, immediate, properties, quick, len(body))
                        elif type(content) is Content:
                            if ftype == FRAME_BODY:
                                content_body(channels, channel, content, payload, out)
                            elif ftype == FRAME_HEADER:
                                content_header(channels, channel, content, payload,
                                               self.max_message_size, out)
                            else:
                                self._frame(ftype, channel, payload, out)
                            if not out:
                                continue
                            event = out.pop()  # at most one: the publish, or a too-large refusal
                        if type(event) is ev.Publish:
                            pending = event
                            pending_at = start if ftype == FRAME_METHOD else -1
                            continue
                        if event is not None:
                            if batch:
                                self._mark = start
                                yield _publishes(batch)
                                batch = []
                            self._mark = -1
                            yield event
                            continue
                    if batch:  # what came before this frame is handled before it is
                        self._mark = start
                        yield _publishes(batch)
                        batch = []
                    try:
                        self._frame(ftype, channel, payload, out)
                    except Ignore:
                        pass
                    if out:
                        events = out[:]
                        out.clear()
                        for i, event in enumerate(events):
                            self._mark = pos if i == len(events) - 1 else -1
                            yield event
                            if type(event) in _REPLYING and event.reply is not None:
                                self._send_reply(event, event.reply)
                    if not channel:
                        if self.state in ("closed", "login"):
                            break
                        payload_max = self._payload_max  # tune-ok sets it
                if batch:
                    self._mark = pos
                    yield _publishes(batch)
                    batch = []
            finally:
                del buf[:self._mark if self._detaching else pos]
        except AMQPError as err:
            self._buf.clear()
            if batch:  # the publishes before the bad frame still count
                yield _publishes(batch)
                batch = []
            if self.state == "closing":  # still garbage after our close: give up on the peer
                self.state = "closed"
                yield ev.Closed(abrupt=True)
            else:
                yield self._fail(err)
                if isinstance(err, _FrameError) and self.state == "closing" and not self.vhost:
                    # during the handshake: a peer whose input cannot be framed is not waited for
                    self.state = "closed"
                if self.state == "closed":
                    yield ev.Closed(abrupt=True)

    def detachable(self) -> bool:
        """The input after the event just handed up can be given back as it came (``detach``):
        no content is half read and that event was the last of its frame."""
        return self._mark >= 0 and self.state == "opened" and not self.held and \
            all(v is None for v in self.channels.values())

    def detach(self, events) -> bytes:
        """Stop reading here: ``events`` (a generator of :meth:`events`, stopped at the event just
        handed up, for which ``detachable()`` is true) is closed, and the input after that event
        comes back as the peer sent it. Nothing more is parsed or answered on this connection."""
        self._detaching = True
        try:
            events.close()
        finally:
            self._detaching = False
        rest = bytes(self._buf)
        self._buf.clear()
        self.state = "closed"
        return rest

    def reattach(self) -> None:
        """After ``detach``: the same connection reads again (the caller feeds it what it got back)."""
        self.state = "opened"

    def _send_reply(self, event, reply: bytes) -> None:
        """The reply that follows an event, once the session has handled it."""
        t = type(event)
        if t is ev.Closing:
            self._output.add_final(reply)
        elif self.state == "opened" and event.channel not in self.closing_channels:
            if t is ev.ChannelClosed or event.channel in self.channels:
                self._output.add(event.channel, reply)

    def _frame(self, ftype: int, channel: int, payload: bytes, out: list) -> None:
        if ftype == FRAME_METHOD:
            if channel == 0:
                if self.amqp_0_8:  # connection.close and close-ok are numbered 60 and 61 there
                    payload = amqp_0_8.connection_method(payload)
                self._connection_method(codec.decode_method(payload), out)
                return
            if self.state != "opened":
                if self.state == "closing":
                    return
                raise AMQPError(UNEXPECTED_FRAME, "channel frame before connection.open", hard=True)
            content = self.channels.get(channel, False)
            mid = codec.method_id(payload)
            if content is False:
                if channel in self.closing_channels:
                    if mid == _CH_CLOSE_OK:
                        self.closing_channels.discard(channel)
                        out.append(ev.ChannelClosed(channel))
                    elif mid == _CH_CLOSE:
                        self.send_method(channel, commands.Channel.CloseOk())
                    return
                if mid == _CH_OPEN:
                    # channel_max limits how many channels are open, not their numbers (RabbitMQ
                    # takes channel 65535 with channel_max 2047, as aiormq uses it)
                    opened = len(self.channels) + len(self.closing_channels)
                    if self.channel_max and opened >= self.channel_max:  # RabbitMQ's check and text
                        raise AMQPError(NOT_ALLOWED, f"number of channels opened ({opened}) has reached "
                                        f"the negotiated channel_max ({self.channel_max})", hard=True)
                    self.channels[channel] = None
                    out.append(ev.ChannelOpened(channel, _channel_frame(channel, self._open_ok)))
                    return
                raise AMQPError(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}",
                                mid >> 16, mid & 0xFFFF, hard=True)
            if content is not None:
                raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got "
                                f"method frame instead on channel {channel}", mid >> 16, mid & 0xFFFF,
                                hard=True)
            if self.amqp_0_8 and mid in amqp_0_8.DIFFERENT:
                payload = amqp_0_8.as_0_9_1(mid, payload)
                if payload is None:  # access.request
                    self._output.add(channel, _channel_frame(channel, amqp_0_8.ACCESS_REQUEST_OK))
                    return
            if mid == BASIC_PUBLISH:
                exchange, rk, mandatory, immediate = codec.decode_publish(payload)
                self.channels[channel] = Content(exchange, rk, mandatory, immediate)
            elif mid == BASIC_ACK or mid == BASIC_NACK or mid == BASIC_REJECT:
                tag, bits = codec.decode_tag_bits(payload)
                if mid == BASIC_ACK:
                    out.append(ev.Ack(channel, 0, tag, bool(bits & 1), False))
                elif mid == BASIC_NACK:
                    out.append(ev.Ack(channel, 1, tag, bool(bits & 1), bool(bits & 2)))
                else:
                    out.append(ev.Ack(channel, 2, tag, False, bool(bits & 1)))
            elif mid == _CH_OPEN:
                raise AMQPError(CHANNEL_ERROR, f"second 'channel.open' seen on channel {channel}",
                                20, 10, hard=True)
            elif mid == _CH_CLOSE:
                codec.decode_method(payload)
                del self.channels[channel]
                out.append(ev.ChannelClosed(channel, _channel_frame(channel, _CLOSE_OK_PAYLOAD)))
            elif mid == _CH_CLOSE_OK:
                pass  # nothing outstanding on an open channel; ignore as RabbitMQ does
            else:
                out.append(ev.Method(channel, codec.decode_method(payload)))
        elif ftype == FRAME_HEADER:
            content_header(self.channels, channel, content_for(self, channel, "content header"), payload,
                           self.max_message_size, out)
        elif ftype == FRAME_BODY:
            content_body(self.channels, channel, content_for(self, channel, "content body"), payload, out)
        elif ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise AMQPError(UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}", hard=True)
        else:
            raise AMQPError(FRAME_ERROR, f"unknown frame type {ftype}", hard=True)

_REPLYING = frozenset({ev.ChannelOpened, ev.ChannelClosed, ev.Closing})  # events with a reply after them


class _FrameError(AMQPError):
    """The input cannot be split into frames any more (a frame too large, a bad frame end)."""
