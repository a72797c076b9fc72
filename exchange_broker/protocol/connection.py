"""Sans-IO server side of an AMQP 0-9-1 connection.

``receive_data(bytes)`` returns a list of events; ``data_to_send()`` returns
the bytes to write. Handshake policy (login, vhost access) comes in as two
callables so this module needs no broker state, no asyncio and no clock.
"""

from __future__ import annotations

import struct
from typing import Callable

from pamqp import commands

from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import (BASIC_ACK, BASIC_NACK, BASIC_PUBLISH, BASIC_REJECT, CHANNEL_ERROR,
                        CHANNEL_MAX_DEFAULT, FRAME_BODY, FRAME_END,
                        FRAME_ERROR, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_MAX_DEFAULT,
                        FRAME_METHOD, FRAME_MIN_SIZE, HEARTBEAT_DEFAULT, MAX_MESSAGE_SIZE_DEFAULT,
                        NOT_ALLOWED, PRECONDITION_FAILED, PROTOCOL_HEADER, UNEXPECTED_FRAME,
                        ACCESS_REFUSED)
from exchange_broker.protocol.errors import AMQPError

_FRAME_HDR = struct.Struct(">BHI")
_CONTENT_HDR = struct.Struct(">HHQ")

Authenticate = Callable[[str, bytes], str]          # mechanism, response -> user name, or raise AMQPError
OpenVhost = Callable[[str, str], None]              # user, vhost -> None, or raise AMQPError

_CONN_CLOSE = commands.Connection.Close.index
_CONN_CLOSE_OK = commands.Connection.CloseOk.index
_CH_OPEN = commands.Channel.Open.index
_CH_CLOSE = commands.Channel.Close.index
_CH_CLOSE_OK = commands.Channel.CloseOk.index


class _Content:
    __slots__ = ("exchange", "routing_key", "mandatory", "immediate", "properties", "size", "parts",
                 "received", "have_header", "discard")

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


class ServerConnection:
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
        self._out: list[bytes] = []
        self.channels: dict[int, _Content | None] = {}   # open channel -> pending content
        self.closing_channels: set[int] = set()
        self.capabilities: dict = {}

    # -- output --------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def send_method(self, channel: int, method: commands.Frame) -> None:
        self._out.append(codec.method_frame(channel, method))

    def send_raw(self, data: bytes) -> None:
        self._out.append(data)

    def send_parts(self, parts: list[bytes]) -> None:
        self._out.extend(parts)

    def send_heartbeat(self) -> None:
        self._out.append(codec.HEARTBEAT_FRAME)

    # -- closing -------------------------------------------------------------------------------
    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> ev.Closing:
        """Start a server-initiated connection close."""
        err = AMQPError(code, text, class_id, method_id, hard=True)
        return self._fail(err)

    def _fail(self, err: AMQPError) -> ev.Closing:
        if self.state in ("closing", "closed"):
            return ev.Closing(err.code, err.text, False)
        if self.state in ("header",):
            self.state = "closed"
            return ev.Closing(err.code, err.text, False)
        self.send_method(0, commands.Connection.Close(err.code, err.reply_text, err.class_id, err.method_id))
        self.state = "closing"
        self.channels.clear()
        return ev.Closing(err.code, err.text, False)

    def close_channel(self, channel: int, err: AMQPError) -> None:
        """Server-initiated channel close after a soft error; frames until close-ok are dropped."""
        if channel not in self.channels:
            return
        self.send_method(channel, commands.Channel.Close(err.code, err.reply_text, err.class_id, err.method_id))
        del self.channels[channel]
        self.closing_channels.add(channel)

    # -- input ---------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list:
        out: list = []
        if self.state == "closed":
            return out
        buf = self._buf
        buf += data
        try:
            if self.state == "header":
                if not self._receive_header(out):
                    return out
            pos = 0
            n = len(buf)
            limit = (self.frame_max or self.server_frame_max)
            while n - pos >= 7:
                ftype, channel, size = _FRAME_HDR.unpack_from(buf, pos)
                if size > limit - 8:
                    raise AMQPError(FRAME_ERROR, f"frame size {size + 8} exceeds frame_max {limit}",
                                    hard=True)
                end = pos + 7 + size
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise AMQPError(FRAME_ERROR, f"invalid frame end byte 0x{buf[end]:02x}", hard=True)
                payload = bytes(buf[pos + 7:end])
                pos = end + 1
                try:
                    self._frame(ftype, channel, payload, out)
                except _Ignore:
                    pass
                if self.state == "closed":
                    break
            del buf[:pos]
        except AMQPError as err:
            self._buf.clear()
            if self.state == "closing":  # still garbage after our close: give up on the peer
                self.state = "closed"
                out.append(ev.Closed())
            else:
                out.append(self._fail(err))
                if self.state == "closed":
                    out.append(ev.Closed())
        return out

    def _receive_header(self, out: list) -> bool:
        buf = self._buf
        if len(buf) < 8 and PROTOCOL_HEADER.startswith(bytes(buf)):
            return False
        if bytes(buf[:8]) != PROTOCOL_HEADER:
            # Wrong protocol or version: answer with the header we speak, then close.
            self._out.append(PROTOCOL_HEADER)
            self.state = "closed"
            buf.clear()
            out.append(ev.Closing(0, "bad protocol header", False))
            out.append(ev.Closed())
            return False
        del buf[:8]
        self.state = "start"
        props = dict(self._server_properties)
        self.send_method(0, commands.Connection.Start(0, 9, props, self.mechanisms, "en_US"))
        return True

    def _frame(self, ftype: int, channel: int, payload: bytes, out: list) -> None:
        if ftype == FRAME_METHOD:
            if channel == 0:
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
                    opened = len(self.channels) + len(self.closing_channels)
                    if self.channel_max and opened >= self.channel_max:  # RabbitMQ's check and text
                        raise AMQPError(NOT_ALLOWED, f"number of channels opened ({opened}) has reached "
                                        f"the negotiated channel_max ({self.channel_max})", hard=True)
                    if channel > self.channel_max:
                        raise AMQPError(CHANNEL_ERROR, f"channel number {channel} exceeds channel_max "
                                        f"{self.channel_max}", 20, 10, hard=True)
                    self.channels[channel] = None
                    self.send_method(channel, commands.Channel.OpenOk())
                    out.append(ev.ChannelOpened(channel))
                    return
                raise AMQPError(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}",
                                mid >> 16, mid & 0xFFFF, hard=True)
            if content is not None:
                raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got "
                                f"method frame instead on channel {channel}", mid >> 16, mid & 0xFFFF,
                                hard=True)
            if mid == BASIC_PUBLISH:
                exchange, rk, mandatory, immediate = codec.decode_publish(payload)
                self.channels[channel] = _Content(exchange, rk, mandatory, immediate)
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
                self.send_method(channel, commands.Channel.CloseOk())
                out.append(ev.ChannelClosed(channel))
            elif mid == _CH_CLOSE_OK:
                pass  # nothing outstanding on an open channel; ignore as RabbitMQ does
            else:
                out.append(ev.Method(channel, codec.decode_method(payload)))
        elif ftype == FRAME_HEADER:
            content = self._content_for(channel, "content header")
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
            codec.quick_properties(content.properties)  # validate before accepting the body
            content.size = size
            content.have_header = True
            if size > self.max_message_size:
                # Soft error like RabbitMQ; the body frames that follow are dropped (some may be in
                # this very chunk, read before the session gets to close the channel).
                content.discard = True
                out.append(ev.Method(channel, _TooLarge(size, self.max_message_size)))
                return
            if size == 0:
                self.channels[channel] = None
                out.append(ev.Publish(channel, content.exchange, content.routing_key, content.mandatory,
                                      content.immediate, content.properties, b""))
        elif ftype == FRAME_BODY:
            content = self._content_for(channel, "content body")
            if not content.have_header:
                raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got "
                                f"content body on channel {channel}", 60, 40, hard=True)
            content.received += len(payload)
            if content.received > content.size:
                raise AMQPError(FRAME_ERROR, f"content body of {content.received} bytes exceeds the "
                                f"declared size {content.size}", 60, 40, hard=True)
            if content.discard:
                if content.received == content.size:
                    self.channels[channel] = None
            elif content.received == content.size:
                if content.parts:
                    content.parts.append(payload)
                    body = b"".join(content.parts)
                else:
                    body = payload
                self.channels[channel] = None
                out.append(ev.Publish(channel, content.exchange, content.routing_key, content.mandatory,
                                      content.immediate, content.properties, body))
            else:
                content.parts.append(payload)
        elif ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise AMQPError(UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}", hard=True)
        else:
            raise AMQPError(FRAME_ERROR, f"unknown frame type {ftype}", hard=True)

    def _content_for(self, channel: int, what: str) -> _Content:
        if self.state != "opened":
            if self.state == "closing":
                raise _Ignore()
            raise AMQPError(UNEXPECTED_FRAME, f"{what} frame before connection.open", hard=True)
        content = self.channels.get(channel, False)
        if content is False:
            if channel in self.closing_channels:
                raise _Ignore()
            raise AMQPError(UNEXPECTED_FRAME, f"expected method frame, got non method frame ({what}) "
                            f"on channel {channel}, which is not open", hard=True)
        if content is None:
            raise AMQPError(UNEXPECTED_FRAME, f"expected method frame, got non method frame "
                            f"({what}) instead on channel {channel}", hard=True)
        return content

    # -- connection class ------------------------------------------------------------------------
    def _connection_method(self, method, out: list) -> None:
        idx = method.index
        state = self.state
        if idx == _CONN_CLOSE:
            if state == "closing":
                self.send_method(0, commands.Connection.CloseOk())
                return
            self.send_method(0, commands.Connection.CloseOk())
            self.state = "closed"
            self.channels.clear()
            out.append(ev.Closing(method.reply_code, method.reply_text, True))
            out.append(ev.Closed())
            return
        if idx == _CONN_CLOSE_OK:
            if state == "closing":
                self.state = "closed"
                out.append(ev.Closed())
                return
            raise AMQPError(CHANNEL_ERROR, "unexpected connection.close-ok", 10, 51, hard=True)
        if state == "closing":
            return
        if state == "start" and isinstance(method, commands.Connection.StartOk):
            self._start_ok(method)
        elif state == "tune" and isinstance(method, commands.Connection.TuneOk):
            self._tune_ok(method)
        elif state == "open" and isinstance(method, commands.Connection.Open):
            self._open_vhost(self.user, method.virtual_host)
            self.vhost = method.virtual_host
            self.send_method(0, commands.Connection.OpenOk())
            self.state = "opened"
            out.append(ev.Opened(self.user, self.vhost, self.client_properties))
        elif state == "opened" and isinstance(method, commands.Connection.UpdateSecret):
            self.send_method(0, commands.Connection.UpdateSecretOk())
        elif state == "opened" and isinstance(method, (commands.Connection.Blocked,
                                                       commands.Connection.Unblocked)):
            pass
        else:
            raise AMQPError(CHANNEL_ERROR, f"unexpected method {method.name} in connection state "
                            f"'{state}'", method.index >> 16, method.index & 0xFFFF, hard=True)

    def _start_ok(self, method) -> None:
        self.client_properties = method.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism
        if mechanism not in self.mechanisms.split():
            raise AMQPError(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'",
                            10, 11, hard=True)
        response = method.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        self.user = self._authenticate(mechanism, response)
        self.state = "tune"
        self.send_method(0, commands.Connection.Tune(self.server_channel_max, self.server_frame_max,
                                                     self.server_heartbeat))

    def _tune_ok(self, method) -> None:
        frame_max = method.frame_max or self.server_frame_max
        if frame_max > self.server_frame_max:
            raise AMQPError(NOT_ALLOWED, f"frame_max={frame_max} > {self.server_frame_max} max size",
                            10, 31, hard=True)
        if frame_max < FRAME_MIN_SIZE:
            raise AMQPError(NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size",
                            10, 31, hard=True)
        channel_max = method.channel_max or self.server_channel_max
        if channel_max > self.server_channel_max:
            raise AMQPError(NOT_ALLOWED, f"channel_max={channel_max} > {self.server_channel_max} max",
                            10, 31, hard=True)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = "open"


class _Ignore(Exception):
    """Raised internally for frames that belong to a channel being closed."""


class _TooLarge:
    """Pseudo-method telling the session a message exceeded max_message_size (406)."""
    name = "basic.publish"
    index = BASIC_PUBLISH

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit

    def error(self) -> AMQPError:
        return AMQPError(PRECONDITION_FAILED, f"message size {self.size} is larger than configured "
                         f"max size {self.limit}", 60, 40, hard=False)


TooLarge = _TooLarge
