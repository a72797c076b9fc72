"""The asyncio edge: listeners (AMQP and AMQPS), transports, heartbeats, back-pressure,
graceful shutdown. The settings arrive as arguments (``app.py`` takes them from ``Config``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING

from exchange_broker.connection.session import Session
from exchange_broker.core.auth import is_loopback
from exchange_broker.protocol.codec import HEARTBEAT_FRAME  # passes a guard's hold: it is no delivery
from exchange_broker.protocol.constants import CONNECTION_FORCED
from exchange_broker.server.busy_wait import BusyWait

if TYPE_CHECKING:
    from exchange_broker.core.broker import Broker
    from exchange_broker.server.resources import ResourceMonitor
    from exchange_broker.server.tls import TLSConfig

log = logging.getLogger("exchange_broker.server")

WRITE_HIGH_WATER = 4 * 1024 * 1024  # transport buffer above which a session stops writing deliveries
PROXY_LINE_MAX = 107  # the longest PROXY protocol v1 line, CRLF included


SETTLE_GRACE = 3.0  # s a stopping broker waits for the confirms of what was published before it


class SessionProtocol(asyncio.Protocol):
    """What every client protocol of the broker (AMQP here, MQTT in ``mqtt_listener.py``) does
    the same way: hand the transport's flow control to its session, close on request, and never
    half-close on EOF."""

    transport: asyncio.Transport | None
    session: object

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.session.pause_writing()

    def resume_writing(self) -> None:
        self.session.resume_writing()


class AMQPProtocol(SessionProtocol):
    pipe = None  # another broker's end, once the connection was handed off (connection/handoff.py)

    def __init__(self, server: "BrokerServer") -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.last_read = self.last_write = time.monotonic()
        self.opened_at = self.last_read
        self.lingering = False  # closed on our side: input is read and dropped until the peer hangs up
        self._linger_timer: asyncio.TimerHandle | None = None
        self._head: bytes | None = b""  # the first bytes, until we know whether a PROXY line leads them

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername") or ("", 0)
        if peer[0].startswith("::ffff:") and "." in peer[0]:  # IPv4 on the dual-stack socket: shown as
            peer = (peer[0][7:], peer[1])                       # IPv4, as RabbitMQ's rabbit_misc:ntoa
        # a TLS client certificate, when one was sent and verified against the CA (else None/{})
        cert = transport.get_extra_info("peercert")
        self.session = Session(self.server.broker, self._write, self._close, peer[:2],
                               limits=self.server.limits, set_reading=self._set_reading,
                               linger=self._linger_close, peer_cert=cert or None, pipe=self._pipe_to)
        self.server.protocols.add(self)

    def _write(self, data: bytes) -> None:
        guard = self.server.guard
        if guard is not None and data != HEARTBEAT_FRAME and guard() is False and self.session is not None \
                and self.session.user and self.server.broker.is_link_user(self.session.user):
            # a cluster node that may no longer lead its queues cuts other nodes' links: those
            # nodes nack what they forwarded here and forward it to the queues' next leaders (its
            # clients' connections go on: the queues another node could take over deliver nothing
            # meanwhile, ``core.queue.delivery_guard``)
            if self.transport is not None:
                self.transport.abort()
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.last_write = time.monotonic()

    def _pipe_to(self, other) -> asyncio.Transport | None:
        """The input goes to ``other.write`` as it comes from now on (a hand-off); the transport,
        for what ``other`` sends back. Flow control and hanging up cross over too."""
        self.pipe = other
        t = self.transport
        if t is None or t.is_closing():
            return None
        t.resume_reading()
        return t

    def pause_writing(self) -> None:
        if self.pipe is not None:
            self.pipe.pause_reading()
        else:
            self.session.pause_writing()

    def resume_writing(self) -> None:
        if self.pipe is not None:
            self.pipe.resume_reading()
        else:
            self.session.resume_writing()

    def _set_reading(self, on: bool) -> None:
        t = self.transport
        if t is None or t.is_closing() or self.lingering:
            return
        if on:
            t.resume_reading()
            self.last_read = time.monotonic()
        else:
            t.pause_reading()

    def _linger_close(self, seconds: float) -> None:
        """Close once what was written is out and the peer hung up, at the latest after ``seconds``.

        Meanwhile input is read and dropped: closing a socket with unread input resets the
        connection, and the peer may lose the close-ok it has not read yet."""
        t = self.transport
        if t is None or t.is_closing():
            return
        self.lingering = True
        t.resume_reading()
        self._linger_timer = self.server.loop.call_later(seconds, self._close)

    def data_received(self, data: bytes) -> None:
        if self.pipe is not None:
            self.pipe.write(data)
            return
        self.last_read = time.monotonic()
        if self.server.busy_wait is not None:
            self.server.busy_wait.touch()
        if self.lingering:
            return
        guard = self.server.guard
        if guard is not None:
            guard()  # an active/standby node that may have been replaced stops before it reads
        if self._head is not None:
            data = self._proxy_header(data)
            if not data:
                return
        self.session.data_received(data)

    def _proxy_header(self, data: bytes) -> bytes:
        """A connection forwarded by a cluster node on this host starts with a PROXY protocol v1
        line naming the real client (HAProxy's format). It is believed only from a loopback peer,
        the rule guest's login follows too: a remote peer cannot claim to be local."""
        head = self._head + data
        if not (head.startswith(b"PROXY ") or (len(head) < 6 and b"PROXY "[:len(head)] == head)):
            self._head = None
            return head
        if not is_loopback(self.session.peer[0]):
            self._head = None  # a remote peer's PROXY line is not believed: the session refuses it
            return head
        end = head.find(b"\r\n")
        if end < 0:
            if len(head) > PROXY_LINE_MAX:
                self._head = None
                return head
            self._head = head
            return b""
        self._head = None
        fields = head[:end].split(b" ")
        if len(fields) == 6 and fields[1] in (b"TCP4", b"TCP6"):
            try:
                client = (fields[2].decode("ascii"), int(fields[4]))
            except (UnicodeDecodeError, ValueError):
                client = None
            if client is not None:
                self.session.peer = client
                self.session.name = f"{client[0]}:{client[1]}"
        return head[end + 2:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self.server.protocols.discard(self)
        if self.pipe is not None:
            self.pipe.close()
        if self.session is not None:
            self.session.connection_lost()
        self.transport = None

    def tick(self, now: float) -> None:
        """Once a second: heartbeats out, dead peers and stalled handshakes dropped."""
        sess = self.session
        conn = sess.conn
        if self.pipe is not None or sess.suspended:
            return  # the other broker's heartbeats pass through (or the hand-off is being decided)
        if conn.state != "opened":
            if conn.state in ("closing", "closed"):
                if now - self.last_read > 5 and now - self.opened_at > 5:
                    self._close()
            elif now - self.opened_at > self.server.handshake_timeout:
                log.info("handshake timeout for %s", sess.name)
                self._close()
            return
        hb = conn.heartbeat
        if not hb:
            return
        if not sess.reading:
            self.last_read = now  # we are not reading: silence is ours, not the peer's
        elif now - self.last_read > 2 * hb:
            log.info("missed heartbeats from %s, closing", sess.name)
            sess.connection_lost()
            self._close()
            return
        if now - self.last_write >= hb / 2:
            conn.send_heartbeat()
            sess.mark_dirty()


class BrokerServer:
    """The AMQP listener, and the AMQPS one when ``tls`` is given, serving one broker."""

    def __init__(self, broker: "Broker", host: str, port: int, *, handshake_timeout: float,
                 limits: dict | None = None, tls: "TLSConfig | None" = None,
                 monitor: "ResourceMonitor | None" = None, busy_wait_us: int = 0) -> None:
        self.broker = broker
        self.busy_wait_us = busy_wait_us  # after input, poll this long before sleeping
        self.busy_wait: BusyWait | None = None
        self.tls = tls  # an amqps listener besides the plain one
        self.host = host
        self.port = port
        self.limits = limits or {}
        self.handshake_timeout = handshake_timeout
        self.protocols: set[AMQPProtocol] = set()
        self.monitor = monitor  # resource alarms, checked every tick
        # the node's other protocols' listeners, as the admin API lists them: dicts of protocol
        # ("mqtt", "mqtt/ssl", "http/web-mqtt"), interface and port (app.py adds them)
        self.other_listeners: list[dict] = []
        # a cluster node's check before it writes to a client (ClusterNode.guard, which ends the
        # process, or LeaderNode.guard: False cuts the links of other nodes, see ``_write``)
        self.guard = None
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        self._tls_port = 0
        self._ticker: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self.loop = loop = asyncio.get_running_loop()
        if self.busy_wait_us > 0:
            self.busy_wait = BusyWait(loop, self.busy_wait_us / 1e6)
        with _listen_error(self.host, self.port, "AMQP"):
            self._server = await create_server(loop, lambda: AMQPProtocol(self), self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = loop.create_task(self._tick())
        log.info("AMQP listener on %s", _bound(self._server))
        if self.tls is not None:
            await self._start_tls(self.tls)

    async def _start_tls(self, tls: "TLSConfig") -> None:
        """The amqps listener: same protocol, sessions and limits as plain AMQP."""
        context = tls.server_context()
        with _listen_error(self.host, tls.port, "AMQPS"):
            self._tls_server = await create_server(
                self.loop, lambda: AMQPProtocol(self), self.host, tls.port, ssl=context,
                ssl_handshake_timeout=max(1.0, float(self.handshake_timeout)))
        self._tls_port = self._tls_server.sockets[0].getsockname()[1]
        log.info("AMQPS listener on %s (client certificates: %s)", _bound(self._tls_server), tls.describe())

    @property
    def tls_port(self) -> int:
        return self._tls_port if self._tls_server is not None else 0

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            try:
                self.broker.tick()  # on the broker's clock (consumer timeouts)
                if self.monitor is not None:
                    self.monitor.check()
            except Exception:
                log.exception("broker tick failed")
            for proto in list(self.protocols):
                try:
                    proto.tick(now)
                except Exception:
                    log.exception("heartbeat tick failed")

    async def stop(self, grace: float = 5.0) -> None:
        """Close listeners, send connection.close 320 to every client, wait, then cut them."""
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        await settle(self.protocols, SETTLE_GRACE)
        for proto in list(self.protocols):
            if proto.session is not None and proto.session.conn.state == "opened":
                proto.session.server_close(CONNECTION_FORCED, "broker shutdown")
        await asyncio.sleep(0)  # the sessions' flushes (scheduled on the loop) send those closes
        await drain(self.protocols, grace)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        if self._tls_server is not None:
            await self._tls_server.wait_closed()


async def settle(protocols: set, grace: float) -> None:
    """Before the closes: no more input is read, and what was published already gets its confirm
    (or held reply) once the store has it, for up to ``grace`` s. A close sent first would drop
    those confirms while the messages are stored anyway: a publisher (a shovel) would send them
    again."""
    for proto in list(protocols):
        proto._set_reading(False)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(
            p.session is not None and p.session.settling() for p in list(protocols)):
        await asyncio.sleep(0.01)


async def drain(protocols: set, grace: float) -> None:
    """After the closes were sent: wait up to ``grace`` s for the clients to hang up, then cut
    the ones left."""
    deadline = time.monotonic() + grace
    while protocols and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for proto in list(protocols):
        proto._close()


async def create_server(loop: asyncio.AbstractEventLoop, factory, host: str, port: int, **kwargs):
    """``::`` (the default) is every IPv6 and IPv4 address on one socket, as RabbitMQ's default
    listener (one socket, so ``--port 0`` is one port); without dual-stack IPv6, 0.0.0.0."""
    if host != "::":
        return await loop.create_server(factory, host, port, reuse_address=True, backlog=1024, **kwargs)
    if not socket.has_dualstack_ipv6():
        return await loop.create_server(factory, "0.0.0.0", port, reuse_address=True, backlog=1024, **kwargs)
    sock = socket.create_server(("::", port), family=socket.AF_INET6, backlog=1024, dualstack_ipv6=True)
    sock.setblocking(False)
    try:
        return await loop.create_server(factory, sock=sock, backlog=1024, **kwargs)
    except BaseException:
        sock.close()
        raise


@contextlib.contextmanager
def _listen_error(host: str, port: int, what: str):
    """A bind failure as one clear line: 'cannot listen on HOST:PORT for AMQP: address already in use'."""
    try:
        yield
    except OSError as exc:
        why = socket_error_text(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port} for {what}: {why}") from exc


def socket_error_text(exc: OSError) -> str:
    """'address already in use', 'Name or service not known' (a host that does not resolve)."""
    if exc.errno and exc.errno > 0:
        return os.strerror(exc.errno).lower()
    text = exc.strerror if isinstance(exc.strerror, str) else str(exc)
    return text.split(" (while attempting to bind")[0]  # socket.create_server's addition


def _bound(server: asyncio.base_events.Server) -> str:
    """The addresses a listener really bound (a host name may give several)."""
    names = []
    for sock in server.sockets:
        host, port = sock.getsockname()[:2]
        names.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return ", ".join(names)


def install_signal_handlers(stop_event: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop_event.set)
        except (NotImplementedError, RuntimeError):
            pass
