"""Sans-IO client side of an AMQP 0-9-1 connection (the server side is ``connection.py``).

The protocol header is queued at construction; ``receive_data(bytes)`` returns events and answers
the handshake itself (connection.start -> start-ok with a PLAIN login, tune -> tune-ok + open,
open-ok -> :class:`~events.Connected`); ``data_to_send()`` returns the bytes to write. After the
handshake: content (deliver, get-ok, return) comes up assembled as :class:`~events.Delivered`,
the server's basic.ack/nack as :class:`~events.Confirm`, every other method as
:class:`~events.Method`; the server's connection.close is answered (close-ok) and reported as
:class:`~events.Closing` + :class:`~events.Closed`. Input that cannot be framed or decoded raises
AMQPError (the caller drops the connection). No asyncio, sockets or clock here: the asyncio
client (``exchange_broker/client/``) and any other transport drive it.
"""

from __future__ import annotations

from pamqp import commands

from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import (ACCESS_REFUSED, BASIC_ACK, BASIC_NACK, CHANNEL_ERROR, CHANNEL_MAX_DEFAULT,
                                                FRAME_BODY, FRAME_ERROR, FRAME_HEADER, FRAME_HEARTBEAT,
                                                FRAME_MAX_DEFAULT, FRAME_METHOD, HEARTBEAT_DEFAULT,
                                                PROTOCOL_HEADER, UNEXPECTED_FRAME)
from exchange_broker.protocol.deliveries import Delivery, content_body, content_header, content_method
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.output import Outbox
from exchange_broker.protocol.frames import (HEARTBEAT_FRAME, ack_frame, content_at, frame_at, method_id_at, nack_frame,
                                             publish_frames)

__all__ = ["ClientConnection", "Delivery"]

_START = commands.Connection.Start
_TUNE = commands.Connection.Tune
_OPEN_OK = commands.Connection.OpenOk
_CLOSE = commands.Connection.Close
_CLOSE_OK = commands.Connection.CloseOk
CAPABILITIES = {"publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                "connection.blocked": True, "authentication_failure_close": True}


class ClientConnection(Outbox):
    """One client connection's protocol state: PLAIN login to ``vhost``.

    ``heartbeat``: the interval asked for in seconds; the smaller of it and the server's wins, 0
    turns heartbeats off, None takes the server's. ``frame_max``/``channel_max`` are upper bounds
    on what the server proposes."""

    def __init__(self, user: str, password: str, vhost: str = "/", *, client_properties: dict | None = None,
                 frame_max: int = FRAME_MAX_DEFAULT, channel_max: int = CHANNEL_MAX_DEFAULT,
                 heartbeat: int | None = HEARTBEAT_DEFAULT, locale: str = "en_US") -> None:
        self._user, self._password, self.vhost = user, password, vhost
        props = dict(client_properties or {})
        props.setdefault("capabilities", dict(CAPABILITIES))
        self.client_properties = props
        self._locale = locale
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.server_properties: dict = {}
        self.state = "start"  # start, tune, open, opened, closing, closed
        self._buf = bytearray()
        self._out: list[bytes] = [PROTOCOL_HEADER]
        self._content: dict[int, Delivery] = {}  # channel -> content being assembled

    # -- output --------------------------------------------------------------------------------
    def send_method(self, channel: int, method: commands.Frame) -> None:
        self._out.append(codec.method_frame(channel, method))

    def send(self, data) -> None:
        """Frames already encoded: bytes, or a list of pieces."""
        if type(data) is list:
            self._out.extend(data)
        else:
            self._out.append(data)

    def publish(self, channel: int, exchange: str, routing_key: str, properties: bytes, body: bytes,
                mandatory: bool = False) -> None:
        """basic.publish with raw content-header properties (``codec.encode_properties``)."""
        sc = codec.SHORT_STRINGS
        self._out.extend(publish_frames(channel, sc.get(exchange) or codec.short_cached(exchange),
                                        sc.get(routing_key) or codec.short_cached(routing_key), mandatory,
                                        properties, body, self.frame_max))

    def ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self._out.append(ack_frame(channel, delivery_tag, multiple))

    def nack(self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self._out.append(nack_frame(channel, delivery_tag, multiple, requeue))

    def send_heartbeat(self) -> None:
        self._out.append(HEARTBEAT_FRAME)

    def close(self, code: int = 200, text: str = "Goodbye") -> None:
        """Start a client-initiated close; :class:`~events.Closed` comes with the close-ok."""
        if self.state in ("closing", "closed"):
            return
        self.send_method(0, _CLOSE(reply_code=code, reply_text=text, class_id=0, method_id=0))
        self.state = "closing"

    def forget(self, channel: int) -> None:
        """The channel is closed: content half-received on it is dropped."""
        self._content.pop(channel, None)

    # -- input ---------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list:
        if self.state == "closed":
            return []
        buf = self._buf
        buf += data
        out: list = []
        pos, n = 0, len(buf)
        try:
            if self.state == "start" and buf[:4] == b"AMQP" and n >= 8:
                version = ".".join(str(b) for b in buf[5:8])
                raise AMQPError(FRAME_ERROR, f"the server refused the protocol header (it speaks AMQP "
                                f"{version})", hard=True)
            while True:
                got = frame_at(buf, pos, n)
                if got is None:
                    break
                ftype, channel, end = got
                payload = bytes(buf[pos + 7:end])
                pos = end + 1
                self._frame(ftype, channel, payload, out)
                if ftype == FRAME_METHOD and channel and channel in self._content:
                    # a content method: its header and single body frame are usually here too
                    whole = content_at(buf, pos, n, channel)
                    if whole is not None:
                        d = self._content.pop(channel)
                        _flags, hend, start, stop, nxt = whole
                        d._size = stop - start
                        d.properties = bytes(buf[pos + 19:hend])
                        d.body = bytes(buf[start:stop]) if stop > start else b""
                        pos = nxt
                        out.append(ev.Delivered(channel, d))
                if self.state == "closed":
                    break
        except AMQPError:
            self.state = "closed"
            buf.clear()
            raise
        del buf[:pos]
        return out

    def _frame(self, ftype: int, channel: int, payload: bytes, out: list) -> None:
        if channel and self.state == "closing":
            return  # what the server sent before it saw our close: nobody waits for it now
        if ftype == FRAME_METHOD:
            if channel == 0:
                self._connection_method(codec.decode_method(payload), out)
                return
            if self.state != "opened":
                raise AMQPError(UNEXPECTED_FRAME, "channel frame before connection.open-ok", hard=True)
            if channel in self._content:
                raise AMQPError(UNEXPECTED_FRAME, f"method frame on channel {channel} while content "
                                "was expected", hard=True)
            mid = method_id_at(payload, 0)
            if mid == BASIC_ACK or mid == BASIC_NACK:
                tag, bits = codec.decode_tag_bits(payload)
                out.append(ev.Confirm(channel, tag, bool(bits & 1), mid == BASIC_ACK))
                return
            d = content_method(channel, payload, mid)
            if d is not None:
                self._content[channel] = d
            else:
                out.append(ev.Method(channel, codec.decode_method(payload)))
        elif ftype == FRAME_HEADER:
            d = self._content.get(channel)
            if content_header(d, payload):
                del self._content[channel]
                out.append(ev.Delivered(channel, d))
        elif ftype == FRAME_BODY:
            d = self._content.get(channel)
            if content_body(d, payload):
                del self._content[channel]
                out.append(ev.Delivered(channel, d))
        elif ftype == FRAME_HEARTBEAT:
            if channel:
                raise AMQPError(UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}", hard=True)
        else:
            raise AMQPError(FRAME_ERROR, f"unknown frame type {ftype}", hard=True)

    def _connection_method(self, m, out: list) -> None:
        state = self.state
        if isinstance(m, _CLOSE):
            self.send_method(0, _CLOSE_OK())
            self.state = "closed"
            self._content.clear()
            out.append(ev.Closing(m.reply_code, m.reply_text, False))
            out.append(ev.Closed())
        elif isinstance(m, _CLOSE_OK) and state == "closing":
            self.state = "closed"
            out.append(ev.Closed())
        elif state == "start" and isinstance(m, _START):
            self._start(m)
        elif state == "tune" and isinstance(m, _TUNE):
            self._tune(m)
        elif state == "open" and isinstance(m, _OPEN_OK):
            self.state = "opened"
            out.append(ev.Connected(self.server_properties, self.frame_max, self.channel_max,
                                    self.heartbeat))
        elif state in ("opened", "closing") and isinstance(m, (commands.Connection.Blocked,
                                                               commands.Connection.Unblocked,
                                                               commands.Connection.UpdateSecretOk)):
            out.append(ev.Method(0, m))
        elif state != "closing":
            expected = {"start": "connection.start", "tune": "connection.tune",
                        "open": "connection.open-ok"}.get(state, "no connection method")
            raise AMQPError(CHANNEL_ERROR, f"expected {expected}, got {m.name}", m.index >> 16,
                            m.index & 0xFFFF, hard=True)

    def _start(self, m) -> None:
        self.server_properties = dict(m.server_properties or {})
        mechanisms = m.mechanisms
        if isinstance(mechanisms, bytes):
            mechanisms = mechanisms.decode("utf-8", "replace")
        if "PLAIN" not in str(mechanisms).split():
            raise AMQPError(ACCESS_REFUSED, f"the server offers no PLAIN login (mechanisms: {mechanisms})",
                            10, 11, hard=True)
        self.send_method(0, commands.Connection.StartOk(
            client_properties=self.client_properties, mechanism="PLAIN",
            response=f"\0{self._user}\0{self._password}", locale=self._locale))
        self.state = "tune"

    def _tune(self, m) -> None:
        self.frame_max = min(m.frame_max or self.frame_max, self.frame_max)
        self.channel_max = min(m.channel_max or self.channel_max, self.channel_max)
        mine, theirs = self.heartbeat, m.heartbeat
        if mine is None:
            beat = theirs
        elif not mine or not theirs:
            beat = mine
        else:
            beat = min(mine, theirs)
        self.heartbeat = beat
        self.send_method(0, commands.Connection.TuneOk(channel_max=self.channel_max,
                                                       frame_max=self.frame_max, heartbeat=beat))
        self.send_method(0, commands.Connection.Open(virtual_host=self.vhost))
        self.state = "open"
