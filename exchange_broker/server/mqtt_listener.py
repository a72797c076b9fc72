"""The MQTT listener (``--mqtt-port``): one asyncio protocol per client around a sans-IO
``mqtt/session.py``, a tick once a second for keep-alives and CONNECT timeouts, and a graceful
stop (MQTT 5 clients get DISCONNECT 0x8B)."""

from __future__ import annotations

import asyncio
import logging

from exchange_broker.mqtt.hub import MQTTHub
from exchange_broker.mqtt.session import MQTTSession
from exchange_broker.mqtt.takeover import cancel_older_relays
from exchange_broker.server.listener import (WRITE_HIGH_WATER, SessionProtocol, _bound, _listen_error, create_server,
                                             drain)

log = logging.getLogger("exchange_broker.server")


class MQTTProtocol(SessionProtocol):
    def __init__(self, server: "MQTTServer") -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.session: MQTTSession | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername") or ("", 0)
        self.session = self.server.new_session(self._write, self._close, peer[:2], self._set_reading)
        self.server.protocols.add(self)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _set_reading(self, on: bool) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if on:
            t.resume_reading()
        else:
            t.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.session.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.protocols.discard(self)
        if self.session is not None:
            self.session.connection_lost()
        self.transport = None

    def tick(self, now: float) -> None:
        self.session.tick(now)


class MQTTServer:
    def __init__(self, hub: MQTTHub, host: str, port: int, *, ssl=None, what: str = "MQTT",
                 protocol: type[MQTTProtocol] = MQTTProtocol) -> None:
        self.hub = hub
        self.protocol = protocol  # MQTTProtocol, or server/mqtt_websocket.py's for --mqtt-ws-port
        self.host = host
        self.port = port
        self.ssl = ssl
        self.what = what
        self.protocols: set[MQTTProtocol] = set()
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.Task | None = None

    @property
    def listing(self) -> dict:
        """This listener as the admin API lists it (RabbitMQ's protocol names)."""
        kind = "http/web-mqtt" if self.protocol is not MQTTProtocol else "mqtt/ssl" if self.ssl else "mqtt"
        return {"protocol": kind, "interface": self.host or "0.0.0.0", "port": self.port}

    def new_session(self, write, close, peer, set_reading) -> MQTTSession:
        sess = MQTTSession(self.hub, write, close, peer, set_reading=set_reading)
        sess.listener = (self.host, self.port)  # the admin API names the connection after it
        sess.tls = self.ssl is not None
        return sess

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        with _listen_error(self.host, self.port, self.what):
            self._server = await create_server(loop, lambda: self.protocol(self), self.host, self.port, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = loop.create_task(self._tick())
        log.info("%s listener on %s", self.what, _bound(self._server))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = self.hub.broker.clock.time()
            for proto in list(self.protocols):
                try:
                    proto.tick(now)
                except Exception:
                    log.exception("MQTT tick failed")
            hub = self.hub
            if hub.broker.definitions_shared and now - hub.last_tick >= 0.9:  # once per hub
                hub.last_tick = now
                try:
                    cancel_older_relays(hub)
                except Exception:
                    log.exception("MQTT takeover scan failed")

    async def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            self._server.close()
        for proto in list(self.protocols):
            if proto.session is not None:
                proto.session.shutdown()
        await drain(self.protocols, grace)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            await self._server.wait_closed()
