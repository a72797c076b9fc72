"""An asyncio AMQP 0-9-1 client for everything that talks to another broker: the cluster's
inter-node links today (``cluster/links.py``, ``relay.py``, ``remote.py``), shovels and federation
next. The wire is the sans-IO :class:`~exchange_broker.protocol.client.ClientConnection` (the
project's one frame codec); this module only moves its bytes and turns its events into futures and
callbacks.

What a connection offers:

* :meth:`Connection.open` — TCP connect, PLAIN login, tune (the server's frame_max and channel_max,
  capped; heartbeats at ``heartbeat`` seconds: a peer silent for two intervals is lost), vhost.
* :meth:`Connection.channel` — a :class:`~exchange_broker.client.channel.Channel`:
  ``confirm_select``; ``publish`` (raw properties and body, as a relay has them) returning a future
  set by the confirm (``ClientError`` on a nack or when the channel or connection closes first);
  ``consume`` with a prefetch and a callback per delivery (``Delivery``) and one for a server-sent
  basic.cancel; ``ack`` / ``nack`` / ``reject``; ``get``; ``call`` for any other synchronous method
  (declare, bind, delete ...).
* Loss: a closed channel (e.g. 404) fails what waits on that channel only; a lost or closed
  connection fails everything and runs the ``on_lost`` callbacks once.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from typing import Callable

from pamqp import commands

from exchange_broker.client.channel import Channel, ClientError
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.client import ClientConnection
from exchange_broker.protocol.constants import CHANNEL_MAX_DEFAULT, FRAME_MAX_DEFAULT
from exchange_broker.protocol.deliveries import Delivery
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.client")

CHANNEL_MAX = CHANNEL_MAX_DEFAULT
OPEN_TIMEOUT = 10.0


class Connection(asyncio.Protocol):
    """One AMQP connection to a broker (use :meth:`open`)."""

    def __init__(self, name: str, heartbeat: float, product: str = "exchange-broker client") -> None:
        self.name = name
        self.heartbeat = heartbeat
        self.product = product
        self.transport: asyncio.Transport | None = None
        self.protocol: ClientConnection | None = None
        self.frame_max = FRAME_MAX_DEFAULT
        self.channel_max = CHANNEL_MAX
        self.server_properties: dict = {}
        self.channels: dict[int, Channel] = {}
        self.error: ClientError | None = None
        self.on_lost: list[Callable[[ClientError], None]] = []
        self._next_channel = 1
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future = loop.create_future()
        self._closed: asyncio.Future = loop.create_future()
        self._got_data = True
        self._beat: asyncio.TimerHandle | None = None
        self._silent_once = False
        # output is written once per event-loop turn (one send for every frame of that turn)
        self._flush_handle: asyncio.Handle | None = None
        self.flushes = 0  # writes so far: what is published between two is sent together
        self._acking: set = set()  # channels with acks to coalesce before the next write
        # called once at the end of the read they were added in (a relay hands the deliveries of
        # one read to its consumer as one run)
        self.after_read: list[Callable[[], None]] = []

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    async def open(cls, host: str, port: int, user: str, password: str, vhost: str = "/", *,
                   name: str = "exchange-broker client", heartbeat: float = 10.0,
                   timeout: float = OPEN_TIMEOUT, product: str = "exchange-broker client",
                   ssl: "ssl_module.SSLContext | None" = None, server_hostname: str | None = None
                   ) -> "Connection":
        """Connect and log in; ``heartbeat`` 0 takes the server's interval. ``ssl``: over TLS
        with that context (``server_hostname``: the name sent and checked, default ``host``;
        "" sends none)."""
        loop = asyncio.get_running_loop()
        conn = cls(name, heartbeat, product)
        conn.protocol = ClientConnection(
            user, password, vhost, heartbeat=int(heartbeat) or None,
            client_properties={"product": product, "connection_name": name})
        try:
            tls = {} if ssl is None else {"ssl": ssl, "server_hostname": server_hostname}
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the
            # caller is cancelled in the turn the handshake completes, and the cancel is lost
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, host, port, **tls)
                await asyncio.shield(conn._opened)
        except asyncio.CancelledError:
            conn._fail(ClientError("cancelled while opening"))  # its socket closed
            raise
        except asyncio.TimeoutError:
            conn._fail(ClientError(f"{host}:{port}: no answer within {timeout:g} s"))
            raise conn.error from None
        except ssl_module.SSLError as exc:  # before OSError: it is one
            raise ClientError(f"{host}:{port}: TLS: {exc.reason or exc}") from None
        except OSError as exc:
            raise ClientError(f"{host}:{port}: {exc.strerror or exc}") from None
        except ClientError:
            conn._fail(conn.error or ClientError("closed during the handshake"))
            raise
        return conn

    # -- asyncio protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.protocol.data_to_send())  # the protocol header

    def data_received(self, data: bytes) -> None:
        self._got_data = True
        try:
            events = self.protocol.receive_data(data)
        except AMQPError as exc:
            self._fail(ClientError(f"protocol error from the broker: {exc}", exc.code))
            return
        channels = self.channels
        for e in events:
            t = type(e)
            if t is ev.Delivered:
                ch = channels.get(e.channel)
                if ch is not None:
                    ch._content(e.delivery)
            elif t is ev.Confirm:
                ch = channels.get(e.channel)
                if ch is not None:
                    ch._confirm(e.delivery_tag, e.multiple, e.ack)
            elif t is ev.Method:
                if e.channel == 0:
                    log.info("connection %s: %s", self.name, e.method.name)  # blocked / unblocked
                else:
                    ch = channels.get(e.channel)
                    if ch is not None:
                        ch._method(e.method)
            elif t is ev.Connected:
                self._connected(e)
            elif t is ev.Closing:  # the broker closed the connection (its close-ok is queued)
                self._flush()
                self._fail(ClientError(f"closed by the broker: {e.code} {e.text}", e.code))
            elif t is ev.Closed:  # the close-ok of our close
                self._fail(ClientError("closed"))
            if self.error is not None:
                break
        if self.after_read:
            done, self.after_read = self.after_read, []
            for fn in done:
                fn()
        if self.error is None and self.protocol.has_output:
            self._schedule_flush()

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._lose(ClientError(f"connection lost: {exc}" if exc else "connection closed by the broker"))

    def _connected(self, e: ev.Connected) -> None:
        self.frame_max, self.channel_max, self.heartbeat = e.frame_max, e.channel_max, e.heartbeat
        self.server_properties = e.server_properties
        if e.heartbeat:
            self._schedule_beat()
        if not self._opened.done():
            self._opened.set_result(None)

    # -- output ----------------------------------------------------------------------------------
    def _send(self, data) -> None:
        """Queue frames (bytes, or a list of them): written at the end of this event-loop turn."""
        t = self.transport
        if t is None or t.is_closing():
            raise self.error or ClientError("connection is closed")
        self.protocol.send(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _ack_later(self, channel) -> None:
        """``channel`` has acks to send: coalesced (``Channel.flush_acks``) before the next write."""
        self._acking.add(channel)
        self._schedule_flush()

    def _flush(self) -> None:
        self.flushes += 1
        if self._acking:
            acking, self._acking = self._acking, set()
            for ch in acking:
                try:
                    ch.flush_acks()  # adds to the output (this flush writes it)
                except ClientError:
                    pass  # the connection is closing: the broker requeues what was not acked
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        data = self.protocol.data_to_send()
        t = self.transport
        if data and t is not None and not t.is_closing():
            t.write(data)

    def _schedule_beat(self) -> None:
        self._beat = asyncio.get_running_loop().call_later(self.heartbeat / 2, self._on_beat)

    def _on_beat(self) -> None:
        if self.error is not None or self.transport is None:
            return
        if not self._got_data and self._silent_once:
            self._fail(ClientError(f"the broker sent nothing for {self.heartbeat} s (heartbeats)"))
            return
        self._silent_once = not self._got_data
        self._got_data = False
        self.protocol.send_heartbeat()
        self._flush()
        self._schedule_beat()

    # -- loss ------------------------------------------------------------------------------------
    def _fail(self, error: ClientError) -> ClientError:
        """Close the transport and fail everything (returns the error, for ``raise``)."""
        t = self.transport
        self._lose(error)
        if t is not None:
            t.close()
        return self.error

    def _lose(self, error: ClientError) -> None:
        if self.error is not None:
            return
        self.error = error
        if self._beat is not None:
            self._beat.cancel()
        if not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # retrieved: open() raises it
        for ch in list(self.channels.values()):
            ch._closed(error)
        self.channels.clear()
        if not self._closed.done():
            self._closed.set_result(error)
        for fn in self.on_lost:
            try:
                fn(error)
            except Exception:  # a callback's failure must not keep the others from running
                log.exception("connection %s: on_lost callback failed", self.name)

    # -- public ----------------------------------------------------------------------------------
    async def channel(self) -> Channel:
        if self.error is not None:
            raise self.error
        for _ in range(self.channel_max):
            number = self._next_channel
            self._next_channel = number % self.channel_max + 1
            if number not in self.channels:
                break
        else:
            raise ClientError("no channel number left")
        ch = self.channels[number] = Channel(self, number)
        await ch.call(commands.Channel.Open(), commands.Channel.OpenOk)
        return ch

    async def close(self) -> None:
        if self.error is not None:
            return
        try:
            self._flush()  # first: acks still coalescing go before connection.close (after it
            # the broker reads nothing more, and would requeue what they settle)
            self.protocol.close(200, "Goodbye")
            self._flush()
            async with asyncio.timeout(5.0):  # (not wait_for: see open)
                await asyncio.shield(self._closed)
        except (ClientError, asyncio.TimeoutError):
            pass
        self._fail(ClientError("closed"))

    @property
    def closed(self) -> asyncio.Future:
        return self._closed


__all__ = ["Channel", "ClientError", "Connection", "Delivery"]
