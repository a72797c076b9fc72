"""Inter-node links: a small asyncio AMQP 0-9-1 client a node uses to talk to another node.

The cluster plan (docs/cluster-design.md, steps 3 and 4) forwards publishes for queues another
node leads over such a link, with publisher confirms, and relays that node's deliveries to local
consumers, acks flowing back. AMQP itself is the inter-node protocol: confirms, prefetch (credit)
and flow control come with it, and the other node needs nothing new to serve a link.

What a link offers:

* :meth:`Link.open` — TCP connect, PLAIN login, tune (the server's frame_max and channel_max,
  capped; heartbeats at ``heartbeat`` seconds: a peer silent for two intervals is lost), vhost.
* :meth:`Link.channel` — a :class:`LinkChannel`: ``confirm_select``; ``publish`` (raw properties
  and body, as a relay has them) returning a future set by the confirm (``LinkError`` on a nack or
  when the channel or link closes first); ``consume`` with a prefetch and a callback per delivery
  (``Delivery`` from ``link_frames``) and one for a server-sent basic.cancel; ``ack`` / ``nack`` /
  ``reject``; ``get``; ``call`` for any other synchronous method (declare, bind, delete ...).
* Loss: a closed channel (e.g. 404) fails what waits on that channel only; a lost or closed link
  fails everything and runs the ``on_lost`` callbacks once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from pamqp import commands

from exchange_broker.cluster.link_channel import LinkChannel
from exchange_broker.cluster.link_frames import Delivery, FrameReader, LinkError, method
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import FRAME_MAX_DEFAULT
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.cluster")

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CHANNEL_MAX = 2047
OPEN_TIMEOUT = 10.0


class Link(asyncio.Protocol):
    """One AMQP connection to another node (use :meth:`open`)."""

    def __init__(self, name: str, heartbeat: float) -> None:
        self.name = name
        self.heartbeat = heartbeat
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.frame_max = FRAME_MAX_DEFAULT
        self.channels: dict[int, LinkChannel] = {}
        self.error: LinkError | None = None
        self.on_lost: list[Callable[[LinkError], None]] = []
        self._next_channel = 1
        self._handshake: asyncio.Queue = asyncio.Queue()
        self._got_data = True
        self._beat: asyncio.TimerHandle | None = None
        self._silent_once = False
        self.channel_max = CHANNEL_MAX
        self._closed = asyncio.get_running_loop().create_future()
        # output is written once per event-loop turn (one send for every frame of that turn)
        self._out: list = []
        self._flush_handle: asyncio.Handle | None = None
        self._acking: set = set()  # channels with acks to coalesce before the next write

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    async def open(cls, host: str, port: int, user: str, password: str, vhost: str = "/", *,
                   name: str = "exchange-broker link", heartbeat: float = 10.0,
                   timeout: float = OPEN_TIMEOUT) -> "Link":
        loop = asyncio.get_running_loop()
        link = cls(name, heartbeat)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: link, host, port), timeout)
            await asyncio.wait_for(link._open(user, password, vhost), timeout)
        except asyncio.TimeoutError:
            link._lose(LinkError(f"{host}:{port}: no answer within {timeout:g} s"))
            raise link.error from None
        except OSError as exc:
            raise LinkError(f"{host}:{port}: {exc.strerror or exc}") from None
        except LinkError:
            link._lose(link.error or LinkError("closed during the handshake"))
            raise
        return link

    async def _open(self, user: str, password: str, vhost: str) -> None:
        self.transport.write(PROTOCOL_HEADER)
        start = await self._expect(commands.Connection.Start)
        mechanisms = start.mechanisms
        if isinstance(mechanisms, bytes):
            mechanisms = mechanisms.decode("utf-8", "replace")
        if "PLAIN" not in mechanisms.split():
            raise self._fail(LinkError("the node does not offer PLAIN logins"))
        props = {"product": "exchange-broker cluster link", "connection_name": self.name,
                 "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                                  "basic.nack": True, "connection.blocked": True}}
        self._send(method(0, commands.Connection.StartOk(
            client_properties=props, mechanism="PLAIN", response=f"\0{user}\0{password}")))
        tune = await self._expect(commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or FRAME_MAX_DEFAULT, FRAME_MAX_DEFAULT)
        channel_max = min(tune.channel_max or CHANNEL_MAX, CHANNEL_MAX)
        self.channel_max = channel_max
        beat = int(self.heartbeat)
        if tune.heartbeat:
            beat = min(beat, tune.heartbeat) if beat else tune.heartbeat
        self.heartbeat = beat
        self._send(method(0, commands.Connection.TuneOk(channel_max=channel_max,
                                                        frame_max=self.frame_max, heartbeat=beat)))
        self._send(method(0, commands.Connection.Open(virtual_host=vhost)))
        await self._expect(commands.Connection.OpenOk)
        self._handshake = None
        if beat:
            self._schedule_beat()

    async def _expect(self, kind):
        got = await self._handshake.get()
        if isinstance(got, LinkError):
            raise got
        if not isinstance(got, kind):
            raise self._fail(LinkError(f"expected {kind.name}, got {got.name}"))
        return got

    # -- asyncio protocol ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_data = True
        try:
            events = self.reader.feed(data)
        except AMQPError as exc:
            self._fail(LinkError(f"protocol error from the node: {exc}", exc.code))
            return
        for kind, channel, item in events:
            if kind == "content":
                ch = self.channels.get(channel)
                if ch is not None:
                    ch._content(item)
            elif kind == "method":
                self._method(channel, item)
            if self.error is not None:
                return

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._lose(LinkError(f"connection lost: {exc}" if exc else "connection closed by the node"))

    # -- methods ---------------------------------------------------------------------------------
    def _method(self, channel: int, m) -> None:
        if channel == 0:
            if isinstance(m, commands.Connection.Close):
                self._send(method(0, commands.Connection.CloseOk()))
                self._flush()
                self._fail(LinkError(f"closed by the node: {m.reply_code} {m.reply_text}", m.reply_code))
            elif isinstance(m, commands.Connection.CloseOk):
                self._fail(LinkError("closed"))
            elif isinstance(m, (commands.Connection.Blocked, commands.Connection.Unblocked)):
                log.info("link %s: %s", self.name, m.name)
            elif self._handshake is not None:
                self._handshake.put_nowait(m)
            return
        ch = self.channels.get(channel)
        if ch is not None:
            ch._method(m)

    def _send(self, data) -> None:
        """Queue frames (bytes, or a list of them): written at the end of this event-loop turn."""
        t = self.transport
        if t is None or t.is_closing():
            raise self.error or LinkError("link is closed")
        if isinstance(data, list):
            self._out.extend(data)
        else:
            self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _ack_later(self, channel) -> None:
        """``channel`` has acks to send: coalesced (``LinkChannel.flush_acks``) before the next write."""
        self._acking.add(channel)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if self._acking:
            acking, self._acking = self._acking, set()
            for ch in acking:
                try:
                    ch.flush_acks()  # appends to the output (this flush writes it)
                except LinkError:
                    pass  # the link is closing: the node requeues what was not acked
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        out, self._out = self._out, []
        t = self.transport
        if out and t is not None and not t.is_closing():
            t.write(b"".join(out))

    def _schedule_beat(self) -> None:
        self._beat = asyncio.get_running_loop().call_later(self.heartbeat / 2, self._on_beat)

    def _on_beat(self) -> None:
        if self.error is not None or self.transport is None:
            return
        if not self._got_data and self._silent_once:
            self._fail(LinkError(f"the node sent nothing for {self.heartbeat} s (heartbeats)"))
            return
        self._silent_once = not self._got_data
        self._got_data = False
        self.transport.write(codec.HEARTBEAT_FRAME)
        self._schedule_beat()

    def _fail(self, error: LinkError) -> LinkError:
        """Close the transport and fail everything (returns the error, for ``raise``)."""
        t = self.transport
        self._lose(error)
        if t is not None:
            t.close()
        return self.error

    def _lose(self, error: LinkError) -> None:
        if self.error is not None:
            return
        self.error = error
        if self._beat is not None:
            self._beat.cancel()
        if self._handshake is not None:
            self._handshake.put_nowait(error)
        for ch in list(self.channels.values()):
            ch._closed(error)
        self.channels.clear()
        if not self._closed.done():
            self._closed.set_result(error)
        for fn in self.on_lost:
            try:
                fn(error)
            except Exception:  # a callback's failure must not keep the others from running
                log.exception("link %s: on_lost callback failed", self.name)

    # -- public ----------------------------------------------------------------------------------
    async def channel(self) -> "LinkChannel":
        if self.error is not None:
            raise self.error
        for _ in range(self.channel_max):
            number = self._next_channel
            self._next_channel = number % self.channel_max + 1
            if number not in self.channels:
                break
        else:
            raise LinkError("no channel number left")
        ch = self.channels[number] = LinkChannel(self, number)
        await ch.call(commands.Channel.Open(), commands.Channel.OpenOk)
        return ch

    async def close(self) -> None:
        if self.error is not None:
            return
        try:
            self._send(method(0, commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0)))
            await asyncio.wait_for(asyncio.shield(self._closed), 5.0)
        except (LinkError, asyncio.TimeoutError):
            pass
        self._fail(LinkError("closed"))

    @property
    def closed(self) -> asyncio.Future:
        return self._closed


__all__ = ["Delivery", "Link", "LinkChannel", "LinkError"]
