"""MQTT over WebSocket (``--mqtt-ws-port``, RabbitMQ's Web MQTT): the HTTP upgrade at ``/ws`` and
the WebSocket framing are wsproto's (sans-IO); the binary messages carry the same MQTT byte
stream a TCP client sends, handed to the same ``mqtt/session.py``."""

from __future__ import annotations

import asyncio
import logging

from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, RejectConnection,
                            Request, TextMessage)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from exchange_broker.server.mqtt_listener import MQTTProtocol

log = logging.getLogger("exchange_broker.server")

PATH = "/ws"                                     # RabbitMQ's web_mqtt default path
SUBPROTOCOLS = ("mqtt", "mqttv3.1")              # what MQTT clients ask for in Sec-WebSocket-Protocol


class MQTTWebSocketProtocol(MQTTProtocol):
    """An MQTT session once the client's upgrade request at ``/ws`` is accepted."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.ws = WSConnection(ConnectionType.SERVER)
        self.peer = (transport.get_extra_info("peername") or ("", 0))[:2]
        self.opened_at = self.server.hub.broker.clock.time()
        self.server.protocols.add(self)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.ws.send(BytesMessage(data=data)))

    def _close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            try:
                t.write(self.ws.send(CloseConnection(code=1000)))
            except LocalProtocolError:
                pass
            t.close()

    def data_received(self, data: bytes) -> None:
        try:
            self.ws.receive_data(data)
            for event in self.ws.events():
                self._event(event)
        except RemoteProtocolError as exc:
            log.info("MQTT over WebSocket from %s:%s: %s", self.peer[0], self.peer[1], exc)
            if self.transport is not None:
                self.transport.write(self.ws.send(exc.event_hint)) if exc.event_hint else None
                self.transport.close()

    def _event(self, event) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if isinstance(event, Request):
            if event.target.split("?", 1)[0] != PATH:
                t.write(self.ws.send(RejectConnection(status_code=404)))
                t.close()
                return
            chosen = next((s for s in event.subprotocols if s in SUBPROTOCOLS), None)
            t.write(self.ws.send(AcceptConnection(subprotocol=chosen)))
            self.session = self.server.new_session(self._write, self._close, self.peer, self._set_reading)
        elif isinstance(event, BytesMessage) and self.session is not None:
            self.session.data_received(bytes(event.data))
        elif isinstance(event, TextMessage):  # MQTT travels in binary messages only
            t.write(self.ws.send(CloseConnection(code=1003, reason="MQTT needs binary messages")))
            t.close()
        elif isinstance(event, Ping):
            t.write(self.ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            try:
                t.write(self.ws.send(event.response()))
            except LocalProtocolError:
                pass
            t.close()

    def tick(self, now: float) -> None:
        if self.session is not None:
            self.session.tick(now)
        elif now - self.opened_at > self.server.hub.settings.connect_timeout:
            self._close()  # no upgrade request in time

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.pause_writing()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.resume_writing()
