"""Run a broker in a background thread with its own event loop (for tests and embedding)."""

from __future__ import annotations

import asyncio
import threading

from pamqp import commands
from pamqp import frame as pframe

from exchange_broker.app import build_broker
from exchange_broker.config import Config
from exchange_broker.core.broker import Broker
from exchange_broker.protocol.constants import PROTOCOL_HEADER
from exchange_broker.server.clock import LoopClock
from exchange_broker.server.listener import BrokerServer


def client_handshake(*channels: int, vhost: str = "/") -> bytes:
    """What a client sends to log in as guest and open ``vhost`` (then channel.open on each of
    ``channels``): bytes to feed a sans-IO Session or ServerConnection."""
    data = (PROTOCOL_HEADER
            + pframe.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                         response="\x00guest\x00guest"), 0)
            + pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
            + pframe.marshal(commands.Connection.Open(virtual_host=vhost), 0))
    return data + b"".join(pframe.marshal(commands.Channel.Open(), ch) for ch in channels)


class ThreadedBroker:
    """Start with ``start()``; ``port`` is then the bound ephemeral port; ``stop()`` joins the thread.

    Without ``broker``, an in-memory broker on this thread's loop (``app.build_broker`` with the
    loop's clock). A broker built by the caller should use the same loop: pass ``loop`` (a new,
    not yet running event loop) and build the broker with ``clock=LoopClock(loop)`` (and a
    durability on that loop). ``server_kwargs`` go to ``BrokerServer`` (``tls``,
    ``handshake_timeout``: ``Config``'s default unless given)."""

    def __init__(self, broker: Broker | None = None, host: str = "127.0.0.1", port: int = 0,
                 limits: dict | None = None, *, admin: bool = False, admin_port: int = 0,
                 admin_sample_interval: float | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, mqtt=None, mqtt_ws: bool = False,
                 **server_kwargs) -> None:
        self.loop = loop or asyncio.new_event_loop()
        if broker is None:
            broker = build_broker(LoopClock(self.loop))
        elif getattr(broker.clock, "loop", None) is not self.loop:
            # sessions flush their output through the broker's clock: it must be this loop's
            raise ValueError("ThreadedBroker(broker, loop=loop): build the broker with "
                             "clock=LoopClock(loop) on the loop given here")
        self.broker = broker
        server_kwargs.setdefault("handshake_timeout", Config.handshake_timeout)
        self.server = BrokerServer(self.broker, host, port, limits=limits, **server_kwargs)
        # admin HTTP API: admin=True picks a free port; admin_port>0 uses that port; else off
        self.admin = None
        self._admin_port = admin_port if admin_port > 0 else (0 if admin else None)
        self._admin_sample_interval = admin_sample_interval  # None: the admin server's default
        # mqtt: an mqtt.hub.MQTTSettings (or True for the defaults) adds an MQTT listener on a free port
        # (and, with mqtt_ws=True, MQTT over WebSocket at /ws on another: ``mqtt_ws_port``)
        self.mqtt = self.mqtt_ws = None
        if mqtt is not None and mqtt is not False:
            from exchange_broker.mqtt.hub import MQTTHub, MQTTSettings
            from exchange_broker.server.mqtt_listener import MQTTServer
            from exchange_broker.server.mqtt_websocket import MQTTWebSocketProtocol
            hub = MQTTHub(self.broker, mqtt if isinstance(mqtt, MQTTSettings) else MQTTSettings())
            self.mqtt = MQTTServer(hub, host, 0)
            if mqtt_ws:
                self.mqtt_ws = MQTTServer(hub, host, 0, protocol=MQTTWebSocketProtocol)
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self._ready = threading.Event()
        self._stopped = asyncio.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def mqtt_port(self) -> int:
        return self.mqtt.port if self.mqtt is not None else 0

    @property
    def mqtt_ws_port(self) -> int:
        return self.mqtt_ws.port if self.mqtt_ws is not None else 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def admin_port(self) -> int:
        return self.admin.port if self.admin is not None else 0

    @property
    def admin_url(self) -> str:
        """Base URL of the admin API (``http://127.0.0.1:PORT``), when started with admin=True."""
        return f"http://127.0.0.1:{self.admin_port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        await self.server.start()
        for mqtt_server in (self.mqtt, self.mqtt_ws):
            if mqtt_server is not None:
                await mqtt_server.start()
                self.server.other_listeners.append(mqtt_server.listing)
        if self._admin_port is not None:
            from exchange_broker.management.samples import DEFAULT_INTERVAL
            from exchange_broker.management.server import AdminServer
            from exchange_broker.movers.start import start_movers
            self.admin = AdminServer(self.broker, self.server.host, self._admin_port, amqp_server=self.server,
                                     sample_interval=self._admin_sample_interval or DEFAULT_INTERVAL)
            await self.admin.start()
            self.admin.context.movers = await start_movers(self.broker, None, self.server.host, self.server.port)
        self._ready.set()
        await self._stopped.wait()
        if self.admin is not None:
            await self.admin.stop()
            await self.admin.context.movers.close()
        for mqtt_server in (self.mqtt, self.mqtt_ws):
            if mqtt_server is not None:
                await mqtt_server.stop()
        await self.server.stop(grace=2.0)

    def start(self) -> "ThreadedBroker":
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args, timeout: float = 10):
        """Run fn(*args) on the broker's loop and return its result (thread-safe inspection)."""
        async def _call():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_call(), self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(15)

    def __enter__(self) -> "ThreadedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
