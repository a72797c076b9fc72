"""One client connection, the glue between the socket and the channels: bytes go to the protocol
layer (``protocol/connection.py``), its events go to the channel they name, and the output the
channels asked the protocol to emit goes to the socket once per event-loop turn.

No asyncio here either: the server hands us bytes and a ``write``/``close`` pair; the flush is
scheduled on the broker's clock. Credit flow and resource alarms pause reading this client.
"""

from __future__ import annotations

import logging
from typing import Callable

from pamqp import commands
from pamqp import decode as pdecode

from exchange_broker.connection.channel import Channel
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.connection import ServerConnection
from exchange_broker.protocol.constants import ACCESS_REFUSED, INTERNAL_ERROR
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.session")

class Session:
    def __init__(self, broker, write: Callable[[bytes], None], close: Callable[[], None],
                 peer: tuple = ("", 0), *, limits: dict | None = None, name: str = "",
                 set_reading: Callable[[bool], None] = lambda on: None) -> None:
        self.broker = broker
        self._set_reading = set_reading
        self.throttled_by: set = set()   # queues whose congestion pauses reading from this client
        self.reading = True
        self.has_published = False
        self.blocked = False             # connection.blocked sent (resource alarm)
        self._write = write
        self._close_transport = close
        self.peer = peer
        self.name = name or f"{peer[0]}:{peer[1]}"
        limits = limits or {}
        self.conn = ServerConnection(self._authenticate, broker.open_vhost, broker.server_properties(),
                                     **limits)
        self.channels: dict[int, Channel] = {}
        self.vhost = None
        self.user: str | None = None
        self.exclusive_queues: set = set()
        self.writable = True       # deliveries allowed (budget not exhausted, transport not paused)
        self.paused = False        # the transport asked us to stop writing
        self.out_pending = 0       # delivery bytes produced since the last flush
        self.dirty = False
        self.closed = False
        self._confirm_flush: list[Channel] = []
        self.client_properties: dict = {}
        self._call_soon = broker.clock.call_soon

    # -- plumbing ------------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """Output is pending: flush it once the current event-loop turn is done."""
        if not self.dirty:
            self.dirty = True
            self._call_soon(self.flush)

    def want_confirm_flush(self, ch: Channel) -> None:
        self._confirm_flush.append(ch)
        self.mark_dirty()

    def flush(self) -> None:
        self.dirty = False
        if self._confirm_flush:
            chans, self._confirm_flush = self._confirm_flush, []
            for ch in chans:
                ch.flush_confirms()
        data = self.conn.data_to_send()
        if data and not self.closed:
            self._write(data)
        self.out_pending = 0
        if not self.writable and not self.paused and not self.closed:
            self.writable = True
            self._redispatch()

    def _authenticate(self, mechanism: str, response: bytes) -> str:
        user, password = "", ""
        try:
            if mechanism == "PLAIN":
                parts = response.split(b"\x00")
                if len(parts) != 3:
                    raise ValueError("PLAIN response must be authzid NUL user NUL password")
                user, password = parts[1].decode("utf-8"), parts[2].decode("utf-8")
            elif mechanism == "AMQPLAIN":
                table = pdecode.field_table(len(response).to_bytes(4, "big") + response)[1]
                user, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
                user = user.decode() if isinstance(user, bytes) else str(user)
                password = password.decode() if isinstance(password, bytes) else str(password)
        except Exception as exc:
            raise AMQPError(ACCESS_REFUSED, f"malformed {mechanism} login response: {exc}",
                            10, 11, hard=True) from None
        host = self.peer[0] if self.peer else ""
        loopback = host.startswith("127.") or host in ("::1", "localhost", "") or host.startswith("::ffff:127.")
        return self.broker.authenticate(user, password, loopback, mechanism)

    # -- input ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except Exception:  # a bug must never take the server down; close this connection only
            log.exception("internal error parsing input from %s", self.name)
            self._handle_closing(self.conn.close(INTERNAL_ERROR, "internal error"))
            self.mark_dirty()
            return
        try:
            for event in events:
                self._handle(event)
        except Exception:  # a bug must never take the server down; close this connection only
            log.exception("internal error handling input from %s", self.name)
            self._handle_closing(self.conn.close(INTERNAL_ERROR, "internal error"))
        self.mark_dirty()

    def _handle(self, event) -> None:
        t = type(event)
        try:
            if t is ev.Publish:
                ch = self.channels[event.channel]
                ch.publish(event.exchange, event.routing_key, event.mandatory, event.immediate,
                           event.properties, event.body)
            elif t is ev.Ack:
                self.channels[event.channel].ack(event.kind, event.delivery_tag, event.multiple,
                                                 event.requeue)
            elif t is ev.Method:
                self.channels[event.channel].handle(event.method)
            elif t is ev.ChannelOpened:
                self.channels[event.channel] = Channel(self, event.channel)
            elif t is ev.ChannelClosed:
                ch = self.channels.pop(event.channel, None)
                if ch is not None:
                    ch.close()
            elif t is ev.Opened:
                self.vhost = self.broker.vhosts[event.vhost]
                self.user = event.user
                self.client_properties = event.client_properties
                self.broker.sessions.add(self)
                log.info("connection %s opened: user '%s', vhost '%s'", self.name, event.user, event.vhost)
            elif t is ev.Closing:
                self._handle_closing(event)
            elif t is ev.Closed:
                self._handle_closing(None)
                self.flush()
                self.closed = True
                self._close_transport()
        except AMQPError as err:
            self._error(getattr(event, "channel", 0), err)
        except KeyError:
            # event for a channel the session already released (e.g. closed by an earlier error)
            if getattr(event, "channel", 0) not in self.channels:
                return
            raise

    def _error(self, channel: int, err: AMQPError) -> None:
        if err.hard or channel == 0 or channel not in self.channels:
            log.info("closing connection %s: %s", self.name, err)
            self._handle_closing(self.conn.close(err.code, err.text, err.class_id, err.method_id))
        else:
            log.info("closing channel %d on %s: %s", channel, self.name, err)
            ch = self.channels.pop(channel)
            ch.flush_confirms()
            self.conn.close_channel(channel, err)
            ch.close()
        self.mark_dirty()

    def _handle_closing(self, event) -> None:
        """Release every resource of this connection (idempotent)."""
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        for q in list(self.exclusive_queues):
            vh = self.broker.vhosts.get(q.vhost)
            if vh is not None:
                vh.remove_queue(q)
        self.exclusive_queues.clear()
        for q in list(self.throttled_by):
            q.flow_blocked.discard(self)
        self.throttled_by.clear()
        self.broker.sessions.discard(self)

    def connection_lost(self) -> None:
        self._handle_closing(None)
        self.closed = True

    def server_close(self, code: int, text: str) -> None:
        """Broker-initiated close (shutdown 320, admin API, heartbeat)."""
        self._handle_closing(self.conn.close(code, text))
        self.mark_dirty()

    # -- credit flow ----------------------------------------------------------------------------
    def throttle(self, q) -> None:
        if q not in self.throttled_by:
            self.throttled_by.add(q)
            q.flow_blocked.add(self)
            self._update_reading()

    def unthrottle(self, q) -> None:
        self.throttled_by.discard(q)
        self._update_reading()

    def block(self, reason: str) -> None:
        """Resource alarm: tell the client (connection.blocked) and stop reading it."""
        if self.blocked or self.closed:
            return
        self.blocked = True
        if self.conn.capabilities.get("connection.blocked") and self.conn.state == "opened":
            self.conn.send_method(0, commands.Connection.Blocked(reason))
            self.mark_dirty()
        self._update_reading()

    def unblock(self) -> None:
        if not self.blocked:
            return
        self.blocked = False
        if self.conn.capabilities.get("connection.blocked") and self.conn.state == "opened":
            self.conn.send_method(0, commands.Connection.Unblocked())
            self.mark_dirty()
        self._update_reading()

    def channel_error(self, channel: int, err: AMQPError) -> None:
        self._error(channel, err)

    def _update_reading(self) -> None:
        # paused: the client does not read what we write; stop reading its requests too, so
        # the replies it provokes cannot pile up in our write buffer without bound
        want = not self.throttled_by and not self.blocked and not self.closed and not self.paused
        if want != self.reading:
            self.reading = want
            self._set_reading(want)

    def pause_writing(self) -> None:
        self.paused = True
        self.writable = False
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.writable = True
        self._update_reading()
        self._redispatch()

    def _redispatch(self) -> None:
        queues = {c.queue for ch in self.channels.values() for c in ch.consumers.values()}
        for q in queues:
            if q.wants_dispatch:
                q.dispatch()

    def first_publish(self) -> None:
        """A publishing connection is blocked while a resource alarm is in force."""
        self.has_published = True
        if self.broker.alarms:
            self.block(self.broker.alarm_reason())

    def check_consumer_timeouts(self, now: float, default_ms: int) -> None:
        for ch in list(self.channels.values()):
            if ch.unacked:
                err = ch.timed_out(now, default_ms)
                if err is not None:
                    self._error(ch.number, err)
