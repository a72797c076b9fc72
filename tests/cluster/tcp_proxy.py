"""A TCP proxy between one broker node and PostgreSQL that a test can break on purpose:
``hang()`` (stop forwarding without closing anything: a network blip, a frozen server),
``heal()``, ``reset()`` (every connection through it ends with a TCP RST at once: a restart, a
failover behind a virtual IP) and ``close()``. It runs its own asyncio loop in a thread.

One proxy per node (or per node and database host) cuts one node alone."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tcp-proxy", daemon=True)
        self._open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._start())
        return self

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        await self._open.wait()  # a connection made during a hang hangs too
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._abort(writer)
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()  # what was read as the hang began is held until it heals
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._abort(writer)

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        """Close with a RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
        self._writers.discard(writer)
        sock = writer.get_extra_info("socket")
        try:
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        writer.transport.abort()

    # -- what a test does ---------------------------------------------------------------------------------
    def hang(self) -> None:
        self.loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(self._open.set)

    def reset(self) -> int:
        """Every connection through the proxy ends now (RST both ways); new ones are forwarded."""
        async def _reset() -> int:
            writers = list(self._writers)
            for writer in writers:
                self._abort(writer)
            return len(writers)
        return self._call(_reset())

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def _close() -> None:
            self._open.set()
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                self._abort(writer)
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        try:
            self._call(_close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
