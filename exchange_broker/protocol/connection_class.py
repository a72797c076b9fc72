"""The connection class of the AMQP handshake and close, a part of ``ServerConnection``
(protocol/connection.py): the protocol header, start-ok (the login, decided now or later),
tune-ok, open, and connection.close / close-ok in either direction."""

from __future__ import annotations

import struct

from pamqp import commands

from exchange_broker.protocol import amqp_0_8
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import ACCESS_REFUSED, CHANNEL_ERROR, FRAME_METHOD, PROTOCOL_HEADER
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.frames import frame
from exchange_broker.protocol.handshake import header_verdict, login_refusal, tuned

_CONN_CLOSE = commands.Connection.Close.index
_CONN_CLOSE_OK = commands.Connection.CloseOk.index
_CONN_CLOSE_OK_FRAME = frame(FRAME_METHOD, 0, struct.pack(">HH", 10, 51))
FRAME_SIZE_FUDGE = 8  # RabbitMQ accepts frames up to 8 bytes over frame_max (a common client slip)


class ConnectionClassMethods:
    """Mixed into ``ServerConnection``, whose state (``state``, ``_buf``, ``_out``, the server's
    limits) these methods read and move on."""

    def _receive_header(self, out: list) -> bool:
        buf = self._buf
        verdict = header_verdict(bytes(buf[:8]))
        if verdict is None:
            return False
        if not verdict:
            # Wrong protocol or version: answer with the header we speak, then close.
            self._out.append(PROTOCOL_HEADER)
            self.state = "closed"
            buf.clear()
            out.append(ev.Closing(0, "bad protocol header", False))
            out.append(ev.Closed(abrupt=True))
            return False
        del buf[:8]
        self.state = "start"
        props, version = dict(self._server_properties), (0, 9)
        if verdict == "0-8":
            self.amqp_0_8, self._open_ok = True, amqp_0_8.CHANNEL_OPEN_OK
            props, version = amqp_0_8.server_properties(props), amqp_0_8.VERSION
        self.send_method(0, commands.Connection.Start(*version, props, self.mechanisms, "en_US"))
        return True


    # -- connection class ------------------------------------------------------------------------
    def _connection_method(self, method, out: list) -> None:
        idx = method.index
        state = self.state
        if idx == _CONN_CLOSE:
            if state == "closing":
                self._out.append(self._conn_frame(_CONN_CLOSE_OK_FRAME))
                return
            self.state = "closed"
            self.channels.clear()
            self.closing_channels.clear()
            out.append(ev.Closing(method.reply_code, method.reply_text, True, self._conn_frame(_CONN_CLOSE_OK_FRAME)))
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
            out.append(ev.UpdateSecret(method.new_secret, method.reason or ""))  # the session answers
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
        try:
            if mechanism not in self.mechanisms.split():
                raise AMQPError(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'",
                                10, 11, hard=True)
            response = method.response
            if isinstance(response, str):
                response = response.encode("utf-8", "surrogateescape")
            user = self._authenticate(mechanism, response)
        except AMQPError as err:
            raise login_refusal(err, self.capabilities) from None
        if user is not None:
            self.login_done(user)
        else:  # decided later (a backend asks the network): input waits until login_done or a close
            self.state = "login"

    def refuse_login(self, err: AMQPError) -> list:
        """A login decided later was refused: the events of a refusal in the handshake."""
        closing = self._fail(login_refusal(err, self.capabilities))
        return [closing, ev.Closed(abrupt=True)] if self.state == "closed" else [closing]

    def login_done(self, user: str) -> None:
        """The login allowed ``user``: connection.tune; the caller then feeds what waited (events(b""))."""
        self.user = user
        self.state = "tune"
        self.send_method(0, commands.Connection.Tune(self.server_channel_max, self.server_frame_max, self.server_heartbeat))

    def _tune_ok(self, method) -> None:
        frame_max, channel_max = tuned(method, self.server_channel_max, self.server_frame_max)
        self.frame_max = frame_max
        self._payload_max = frame_max - 8 + FRAME_SIZE_FUDGE
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = "open"
