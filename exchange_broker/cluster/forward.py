"""A standby node's AMQP listener: every client connection is passed through to the active node.

Clients may connect to any node of the cluster. The active node serves them itself; a standby
accepts the TCP connection and splices it, byte for byte, to the active node's AMQP listener
(``cluster_nodes.amqp_address``), so the client talks to the one broker that serves every queue,
with all of its semantics. When the active node is on this host, the splice starts with a PROXY
protocol v1 line that names the real client (the active node believes it only from a loopback
peer, see ``server/listener.py``): connection names and guest's loopback-only rule stay right.

No active node known, or it cannot be reached: the client's connection is closed at once and
its client retries (pika, aio-pika and kombu take several hosts). When this node becomes the
active one, the application closes this listener and opens the real one on the same port.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from exchange_broker.core.auth import is_loopback

log = logging.getLogger("exchange_broker.cluster")

HIGH_WATER = 1024 * 1024  # bytes buffered towards one side before the other side's reading pauses
CONNECT_TIMEOUT = 5.0


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' → (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _End(asyncio.Protocol):
    """One end of a splice: what it reads goes to ``other``; a full buffer here pauses ``other``."""

    def __init__(self, splicer: "ConnectionSplicer") -> None:
        self.splicer = splicer
        self.transport: asyncio.Transport | None = None
        self.other: _End | None = None
        self.early: list[bytes] = []  # read before the two ends were linked

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            self.early.append(data)
        elif not other.transport.is_closing():
            other.transport.write(data)

    def eof_received(self) -> bool:
        return False  # close the splice: AMQP and HTTP/1.1 clients do not half-close

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.splicer.ends.discard(self)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()  # flushes what is buffered, then closes

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def link(self, other: "_End") -> None:
        """Join the two ends; what either read before (its ``early`` bytes) goes across now."""
        self.other, other.other = other, self
        for end in (self, other):
            for data in end.early:
                end.other.transport.write(data)
            end.early.clear()


class _ClientEnd(_End):
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.splicer.ends.add(self)
        transport.pause_reading()
        self.splicer.loop.create_task(self._connect())

    async def _connect(self) -> None:
        target = self.splicer.target()
        client = self.transport.get_extra_info("peername") if self.transport is not None else None
        if target is None:
            log.info("cluster: no active node to pass connection %s to; closing it", _name(client))
            self.close()
            return
        try:
            host, port = split_address(target)
            async with asyncio.timeout(CONNECT_TIMEOUT):  # (not wait_for, which can lose a cancel)
                _transport, upstream = await self.splicer.loop.create_connection(
                    lambda: _End(self.splicer), host, port)
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            log.info("cluster: cannot reach the active node at %s for connection %s: %s", target, _name(client),
                     exc.__class__.__name__ if not str(exc) else " ".join(str(exc).split()))
            self.close()
            return
        if self.transport is None:  # the client hung up meanwhile
            upstream.close()
            return
        self.splicer.ends.add(upstream)
        seen_as = upstream.transport.get_extra_info("sockname")
        if self.splicer.proxy_line and client and seen_as and is_loopback(seen_as[0]):
            upstream.transport.write(proxy_line(client, upstream.transport.get_extra_info("peername")))
        self.link(upstream)
        self.transport.resume_reading()


def _name(peer) -> str:
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def proxy_line(client: tuple, server: tuple | None) -> bytes:
    """PROXY protocol v1: ``PROXY TCP4 <client ip> <server ip> <client port> <server port>``."""
    family = "TCP6" if ":" in client[0] else "TCP4"
    server = server or (client[0], 0)
    return f"PROXY {family} {client[0]} {server[0]} {client[1]} {server[1]}\r\n".encode("ascii")


class ConnectionSplicer:
    """Listens on ``host:port`` and splices each connection to ``target()`` ('host:port' or None)."""

    def __init__(self, host: str, port: int, target: Callable[[], "str | None"], what: str = "AMQP",
                 proxy_line: bool = True) -> None:
        self.host = host
        self.port = port
        self.target = target
        self.what = what
        self.proxy_line = proxy_line
        self.ends: set[_End] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = None

    async def start(self) -> None:
        """Bind (an OSError names the address, as the real listener's does)."""
        from exchange_broker.server.listener import socket_error_text
        self.loop = asyncio.get_running_loop()
        try:
            self._server = await self.loop.create_server(lambda: _ClientEnd(self), self.host, self.port,
                                                         reuse_address=True, backlog=1024)
        except OSError as exc:
            why = socket_error_text(exc)
            raise OSError(exc.errno, f"cannot listen on {self.host}:{self.port} for {self.what}: {why}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("cluster: %s listener on %s:%d passes connections to the active node", self.what, self.host,
                 self.port)

    async def stop(self) -> None:
        """Stop listening and cut every spliced connection (their clients reconnect)."""
        if self._server is not None:
            self._server.close()
        for end in list(self.ends):
            end.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        for _ in range(20):  # let the closes run their connection_lost
            if not self.ends:
                break
            await asyncio.sleep(0.01)
