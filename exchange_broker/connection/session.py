"""One client connection, the glue between the socket and the channels: bytes go to the protocol
layer (``protocol/connection.py``), its events go to the channel they name, and the output the
channels asked the protocol to emit goes to the socket once per event-loop turn.

No asyncio here either: the server hands us bytes and a ``write``/``close`` pair; the flush is
scheduled on the broker's clock. Credit flow and resource alarms pause reading this client.

Order: each event is handled before the next frame is parsed, so replies leave in the order of
the requests. A closing channel's close-ok waits for its last confirms (the store's commit), and
the connection's close-ok for every channel's and every held reply; the transport is closed only
once the close-ok is written (and, after the client's close, once the client hung up or a short
linger passed, so that input still in flight cannot reset the connection under the close-ok).
"""

from __future__ import annotations

import logging
from typing import Callable

from pamqp import commands
from pamqp import decode as pdecode

from exchange_broker.connection.channel import Channel
from exchange_broker.connection.credentials import Credentials
from exchange_broker.connection.handoff import HandOff, queue_of
from exchange_broker.core.auth import User
from exchange_broker.core.backpressure import BackPressure
from exchange_broker.core.names import logsafe
from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.connection import ServerConnection
from exchange_broker.protocol.constants import ACCESS_REFUSED, INTERNAL_ERROR
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.session")

CLOSE_LINGER = 5.0    # after our close-ok: seconds the client has to hang up before we do
INPUT_SLICE = 256     # messages (events) handled before other connections get a turn
ABRUPT_LINGER = 0.25  # after input that cannot be framed: just long enough to drain what is in flight


def certificate_cn(cert: dict | None) -> str | None:
    """The user name EXTERNAL takes from a verified client certificate: its subject's common name
    (several are joined with ",", as RabbitMQ's rabbitmq_auth_mechanism_ssl does)."""
    if not cert:
        return None
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return ",".join(names) if names else None

class Session(Credentials, BackPressure, HandOff):
    def __init__(self, broker, write: Callable[[bytes], None], close: Callable[[], None],
                 peer: tuple = ("", 0), *, limits: dict | None = None, name: str = "",
                 set_reading: Callable[[bool], None] = lambda on: None,
                 linger: Callable[[float], None] | None = None,
                 peer_cert: dict | None = None, pipe: Callable | None = None) -> None:
        self.broker = broker
        self.pipe_to = pipe              # hand the transport to another broker's end (connection/handoff.py)
        self._linger = linger            # close the transport after reading (and dropping) input for N s
        self.peer_cert_cn = certificate_cn(peer_cert)  # a verified TLS client certificate's CN
        self.auth_mechanism = ""
        self._set_reading = set_reading
        self.throttled_by: set = set()   # queues whose congestion pauses reading from this client
        self.reading = True
        self.has_published = False
        self.handoff_open = broker.handoff is not None  # see connection/handoff.py
        self.blocked = False             # connection.blocked sent (resource alarm)
        self._write = write
        self._close_transport = close
        self.peer = peer
        self.name = name or f"{peer[0]}:{peer[1]}"
        limits = dict(limits or {})
        self.pacing = limits.pop("publisher_pacing", True)  # queue_types/pacing.py may pause it
        if self.peer_cert_cn is not None:  # EXTERNAL only where a verified certificate names the user
            limits["mechanisms"] = "PLAIN AMQPLAIN EXTERNAL"
        self.conn = ServerConnection(self._authenticate, self._open_vhost, broker.server_properties(),
                                     **limits)
        self.channels: dict[int, Channel] = {}
        self.vhost = None
        self.user: str | None = None
        self.from_link = False     # logged in as the cluster's link user (another node forwards): set once
        self.principal = None      # the user publishes are checked against (message.from_wire)
        self.auth_user = None      # core/auth_backends.AuthenticatedUser, once logged in
        self.authz = None          # an external backend's grants (None: the broker's tables)
        self._login_waiting = False
        self._expiry = None        # the credential's expiry timer
        self.exclusive_queues: set = set()
        self.writable = True       # deliveries allowed (budget not exhausted, transport not paused)
        self.paused = False        # the transport asked us to stop writing
        self.out_pending = 0       # delivery bytes produced since the last flush
        self.dirty = False
        self.closed = False
        self._confirm_flush: list[Channel] = []
        self.client_properties: dict = {}
        self._call_soon = broker.clock.call_soon
        self._input = None         # the events of input not handled yet (see _work)
        self._later: list[bytes] = []  # input that arrived meanwhile
        # closed channels whose publishes await the store: their place in the output (confirms
        # go in there) and the close-ok that ends it
        self._draining: dict[Channel, tuple] = {}
        self._finish: float | None = None     # close the transport once the output is out (linger s)

    # -- plumbing ------------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """Output is pending: flush it once the current event-loop turn is done."""
        if not self.dirty:
            self.dirty = True
            self._call_soon(self.flush)

    def want_confirm_flush(self, ch: Channel) -> None:
        if not ch.confirm_queued:  # once per flush, however many publishes it confirms
            ch.confirm_queued = True
            self._confirm_flush.append(ch)
        if not self.dirty:
            self.mark_dirty()

    def flush(self) -> None:
        self.dirty = False
        if self._confirm_flush:
            chans, self._confirm_flush = self._confirm_flush, []
            for ch in chans:
                ch.confirm_queued = False
                if ch.closed and ch in self._draining:
                    self._draining_ack(ch)
                else:
                    ch.flush_confirms()
        if self._draining:
            self._check_drained()
        data = self.conn.data_to_send()
        if data and not self.closed:
            self._write(data)
        self.out_pending = 0
        if not self.writable and not self.paused and not self.closed:
            self.writable = True
            self._redispatch()
        if self._finish is not None and not self.closed and not self.conn.held:
            self._finish_now()

    # -- closing in order ------------------------------------------------------------------------
    def _draining_ack(self, ch: Channel) -> None:
        """A channel the client closed while publishes awaited the store: their acks still go out,
        in its held place (ahead of its close-ok and of a channel reopened with its number)."""
        if ch.ack_upto:
            self.conn.put(self._draining[ch][0], codec.ack_frame(ch.number, ch.ack_upto, True))
            ch.ack_upto = 0

    def _drain(self, ch: Channel, close_ok: bytes | None) -> None:
        """Close ``ch`` now (consumers cancelled, unacked requeued); its close-ok (and the
        connection's) waits until the store confirmed what was published on it: its confirms
        go into a held place of the output, the close-ok ends it."""
        ch.flush_confirms()
        ch.close()
        if ch.unconfirmed:
            self._draining[ch] = (self.conn.hold(ch.number, capturing=True), close_ok)
        elif close_ok is not None:
            self.conn.send_raw(close_ok)

    def _check_drained(self) -> None:
        for ch, (slot, close_ok) in list(self._draining.items()):
            if ch.unconfirmed:
                continue
            self._draining_ack(ch)
            del self._draining[ch]
            self.conn.fill(slot, close_ok or b"")

    def _finish_now(self) -> None:
        linger, self._finish = self._finish, None
        self.closed = True
        if linger and self._linger is not None:
            self._linger(linger)
        else:
            self._close_transport()

    def _authenticate(self, mechanism: str, response: bytes) -> str:
        user, password = "", ""
        self.auth_mechanism = mechanism
        if self.handoff_open and mechanism in ("PLAIN", "AMQPLAIN"):  # the leader is logged in to the same way
            self.login_response = (mechanism, response)
        try:
            if mechanism == "EXTERNAL":  # the user is the certificate's; the response is not used
                user, password = self.peer_cert_cn or "", None
            elif mechanism == "PLAIN":
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
            log.info("login refused on connection %s: malformed %s response", self.name, mechanism)
            raise AMQPError(ACCESS_REFUSED, f"malformed {mechanism} login response: {exc}",
                            10, 11, hard=True) from None
        host = self.peer[0] if self.peer else ""
        decided: list = []
        self.broker.login(user, password, host, mechanism,
                          lambda r: self.login_decided(r) if self._login_waiting else decided.append(r),
                          self.name)
        if not decided:  # a backend asked the network (off the loop): answered in _login_decided
            self._login_waiting = True
            return None
        return self._login_result(decided[0], mechanism)

    def _open_vhost(self, user: str, vhost: str) -> None:
        try:
            self.broker.open_vhost(user, vhost, self.authz)
        except AMQPError as err:
            log.info("connection %s refused: user '%s', vhost '%s': %s", self.name, logsafe(user),
                     logsafe(vhost), logsafe(err.text))
            raise

    # -- input ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._input is not None or self.suspended:  # still working through earlier input: after it
            self._later.append(data)
            return
        # one frame at a time: each handled before the next is read
        self._work(self.conn.events(data), INPUT_SLICE)

    def _work(self, events, budget: int) -> None:
        """Handle ``events`` until they end or ``budget`` messages are done; then the rest waits
        for the next loop turn (reading paused meanwhile), so that one busy publisher cannot
        keep the other connections (its consumers' acks) waiting for a whole read buffer."""
        self._events = events
        try:
            for event in events:
                if self.handoff_open and self._offer(event):
                    return  # suspended: the input waits for the hand-off's outcome
                self._handle(event)
                t = type(event)
                budget -= len(event.items) if t is ev.Publishes else 1
                if budget <= 0 and not self.closed:
                    if self._input is None:
                        self._input = events
                        self._update_reading()
                    self._call_soon(self._resume_input)
                    self.mark_dirty()
                    return
        except Exception:  # a bug must never take the server down; close this connection only
            events.close()
            log.exception("internal error on connection %s", self.name)
            self._handle_closing(self.conn.close(INTERNAL_ERROR, "internal error"))
        if self._input is not None:
            self._input = None
            self._update_reading()
        self.mark_dirty()
        if self._later:
            data = b"".join(self._later)
            self._later.clear()
            self.data_received(data)

    def _offer(self, event) -> bool:
        """Before the connection's first queue-bound request: may another broker take it now?"""
        where = queue_of(event)
        if where is None:
            return False
        self.handoff_open = False
        handoff = self.broker.handoff
        return handoff is not None and handoff(self, event, *where)

    def _resume_input(self, budget: int = 0) -> None:
        if self._input is not None:
            self._work(self._input, budget or INPUT_SLICE)

    def _finish_input(self) -> None:
        """The connection is going: what the client sent before it went is still handled."""
        while self._input is not None and not self.closed:
            self._resume_input(1 << 30)

    def _handle(self, event) -> None:
        t = type(event)
        try:
            if t is ev.Publish:
                self.channels[event.channel].publish_many((event,))
            elif t is ev.Publishes:
                self.channels[event.channel].publish_many(event.items)
            elif t is ev.Ack:
                self.channels[event.channel].ack(event.kind, event.delivery_tag, event.multiple,
                                                 event.requeue)
            elif t is ev.Method:
                self.channels[event.channel].handle(event.method)
            elif t is ev.ChannelOpened:
                self.broker.check_channel_open(self, len(self.channels))  # the user's max-channels
                for old, (slot, _) in self._draining.items():
                    if old.number == event.channel:  # reopened before its close-ok: queue behind
                        self.conn.seal(slot)
                self.channels[event.channel] = Channel(self, event.channel)
                if self.broker.events is not None:
                    self.broker.events.channel_created(self, event.channel)
            elif t is ev.ChannelClosed:
                ch = self.channels.pop(event.channel, None)
                if ch is not None:
                    self._drain(ch, event.reply)  # its close-ok once its confirms are out
                    event.reply = None
            elif t is ev.Opened:
                self.vhost = self.broker.vhosts[event.vhost]
                self.user = event.user
                self.from_link = self.broker.is_link_user(event.user)
                # the cluster's link user republishes what other nodes checked: it is not checked;
                # a user of another backend (OAuth 2.0, LDAP) has the tags it logged in with
                if self.broker.is_internal_user(event.user):  # the cluster's nodes, the movers
                    self.principal = None
                elif self.authz is None and event.user in self.broker.users:
                    self.principal = self.broker.users[event.user]
                else:
                    self.principal = User(event.user, "", tags=list(self.auth_user.tags if self.auth_user else []))
                self.client_properties = event.client_properties
                self.broker.sessions.add(self)
                self._arm_expiry()
                if self.broker.events is not None:
                    self.broker.events.connection_created(self)
                log.info("connection %s opened: user '%s', vhost '%s', mechanism %s", self.name,
                         logsafe(event.user), logsafe(event.vhost), self.auth_mechanism)
            elif t is ev.UpdateSecret:
                self._update_secret(event)
            elif t is ev.Closing:
                if event.by_client:
                    self._client_close(event)
                else:
                    self._handle_closing(event)
            elif t is ev.Closed:
                self._handle_closing(None, drop_draining=not self._client_closed)
                # after our close-ok the client hangs up; after its close-ok (or garbage) we do
                self._finish = ABRUPT_LINGER if event.abrupt else \
                    CLOSE_LINGER if self._client_closed else 0.0
                self.flush()
        except AMQPError as err:
            self._error(getattr(event, "channel", 0), err)
        except KeyError:
            # event for a channel the session already released (e.g. closed by an earlier error)
            if getattr(event, "channel", 0) not in self.channels:
                return
            raise

    def _error(self, channel: int, err: AMQPError) -> None:
        if err.hard or channel == 0 or channel not in self.channels:
            log.info("closing connection %s: %s", self.name, logsafe(err))
            self._handle_closing(self.conn.close(err.code, err.text, err.class_id, err.method_id))
        else:
            log.info("closing channel %d on connection %s: %s", channel, self.name, logsafe(err))
            ch = self.channels.pop(channel)
            ch.flush_confirms()
            self.conn.close_channel(channel, err)
            ch.close()
        self.mark_dirty()

    _client_closed = False

    def _client_close(self, event: ev.Closing) -> None:
        """connection.close from the client: close-ok once every channel's confirms are out."""
        self._client_closed = True
        log.info("closing connection %s (user '%s', vhost '%s'): closed by the client: %d %s",
                 self.name, logsafe(self.user or ""), logsafe(self.vhost.name if self.vhost else ""),
                 event.code, logsafe(event.text))
        for ch in list(self.channels.values()):
            self._drain(ch, None)  # the close-ok (sent by the protocol) waits for what they hold
        self.channels.clear()
        self._handle_closing(event, drop_draining=False)

    def settling(self) -> bool:
        """Publishes still wait for the store: a confirm not yet sent or a reply held for it."""
        if self.closed or self.conn.state != "opened":
            return False
        return self.conn.held or self.dirty or any(
            run[2] == 0 for ch in self.channels.values() for run in getattr(ch, "unconfirmed", ()))

    def _handle_closing(self, event, drop_draining: bool = True) -> None:
        """Release every resource of this connection (idempotent)."""
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        if drop_draining:  # the close is ours (or the socket is gone): no close-ok to wait for
            self._draining.clear()
        for q in list(self.exclusive_queues):
            vh = self.broker.vhosts.get(q.vhost)
            if vh is not None:
                vh.remove_queue(q)
        self.exclusive_queues.clear()
        for q in list(self.throttled_by):
            q.flow_blocked.discard(self)
        self.throttled_by.clear()
        if self.broker.events is not None and self in self.broker.sessions:
            self.broker.events.connection_closed(self)
        self.broker.sessions.discard(self)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def connection_lost(self) -> None:
        self._finish_input()
        if not self.closed and self._finish is None and self.conn.state not in ("closed", "header"):
            if self.conn.state == "opened":
                log.info("closing connection %s (user '%s', vhost '%s'): client unexpectedly "
                         "closed TCP connection", self.name, logsafe(self.user or ""),
                         logsafe(self.vhost.name if self.vhost else ""))
            elif self.conn.state != "closing":
                log.info("closing connection %s: client closed TCP connection during the handshake",
                         self.name)
        self._handle_closing(None)
        self.closed = True

    def server_close(self, code: int, text: str) -> None:
        """Broker-initiated close (shutdown 320, admin API, heartbeat)."""
        if self.conn.state not in ("closing", "closed"):
            log.info("closing connection %s: %d %s", self.name, code, logsafe(text))
        self._handle_closing(self.conn.close(code, text))
        self.mark_dirty()

    # -- credit flow ----------------------------------------------------------------------------
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
        want = not self.throttled_by and not self.blocked and not self.closed and not self.paused \
            and self._input is None and not self.suspended
        if want != self.reading:
            self.reading = want
            self._set_reading(want)

    def _redispatch(self) -> None:
        queues = {c.queue for ch in self.channels.values() for c in ch.consumers.values()}
        for q in queues:
            if q.wants_dispatch:
                q.dispatch()

    def may_pace(self) -> bool:
        """Pacing is on and pausing this connection cannot hold back acks or consumption some
        queue waits for (it has no consumer and no unacked delivery): no deadlock."""
        return self.pacing and not any(ch.consumers or ch.unacked for ch in self.channels.values())

    def first_publish(self) -> None:
        """A publishing connection is blocked while a resource alarm is in force."""
        self.has_published = True
        if self.broker.alarms:
            self.block(self.broker.alarm_reason())

    def nack_overdue_confirms(self, now: float, bound: float) -> None:
        """``serve --database-outage-nack-after``: publishes waiting longer for the store are nacked."""
        for ch in list(self.channels.values()):
            if ch.waiting_groups:
                ch.nack_overdue(now, bound)

    def check_consumer_timeouts(self, now: float, default_ms: int) -> None:
        for ch in list(self.channels.values()):
            if ch.unacked:
                err = ch.timed_out(now, default_ms)
                if err is not None:
                    self._error(ch.number, err)
