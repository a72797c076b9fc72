"""One client connection: feeds bytes to the protocol layer and applies its events to the core.

No asyncio here either: the server hands us bytes and a ``write``/``close`` pair.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from pamqp import commands
from pamqp import decode as pdecode

from exchange_broker.core import permissions as perms
from exchange_broker.connection.channel import Channel
from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.connection import ServerConnection, TooLarge
from exchange_broker.protocol.constants import (ACCESS_REFUSED, COMMAND_INVALID, INTERNAL_ERROR, NOT_FOUND,
                                 NOT_IMPLEMENTED, PRECONDITION_FAILED)
from exchange_broker.core.names import generated
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.core.reply_to import PSEUDO_QUEUE

if TYPE_CHECKING:
    from exchange_broker.core.broker import Broker
    from exchange_broker.core.vhost import VHost

log = logging.getLogger("exchange_broker.session")

B, Q, E, C = commands.Basic, commands.Queue, commands.Exchange, commands.Channel


class Session:
    def __init__(self, broker: "Broker", write: Callable[[bytes], None], close: Callable[[], None],
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
        self.vhost: "VHost | None" = None
        self.user: str | None = None
        self.exclusive_queues: set = set()
        self.writable = True       # deliveries allowed (budget not exhausted, transport not paused)
        self.paused = False        # the transport asked us to stop writing
        self.out_pending = 0       # delivery bytes produced since the last flush
        self.dirty = False
        self.closed = False
        self._confirm_flush: list[Channel] = []
        self.client_properties: dict = {}

    # -- plumbing ------------------------------------------------------------------------------
    def mark_dirty(self) -> None:
        self.broker.mark_dirty(self)

    def want_confirm_flush(self, ch: Channel) -> None:
        self._confirm_flush.append(ch)
        self.broker.mark_dirty(self)

    def flush(self) -> None:
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
                self._method(self.channels[event.channel], event.method)
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
            if (q.ready or q.is_stream) and not q.deleted:  # streams: per-consumer backlog
                q.dispatch()

    # -- methods -------------------------------------------------------------------------------
    def _method(self, ch: Channel, m) -> None:
        handler = _HANDLERS.get(type(m))
        if handler is None:
            if isinstance(m, TooLarge):
                raise m.error()
            raise AMQPError(COMMAND_INVALID, f"unimplemented method {m.name}", m.index >> 16,
                            m.index & 0xFFFF, hard=True)
        try:
            handler(self, ch, m)
        except AMQPError as err:
            raise err.for_method(m.index >> 16, m.index & 0xFFFF)

    def _reply(self, ch: Channel, method) -> None:
        if type(method) in _DEFINITION_REPLIES and \
                self._defer_reply(ch, method, method.index >> 16, (method.index & 0xFFFF) - 1):
            return
        self.conn.send_method(ch.number, method)

    def _defer_reply(self, ch: Channel, reply, class_id: int, method_id: int) -> bool:
        """Hold a definition reply (a method, or raw frame bytes) until the definition is stored:
        as in RabbitMQ, declare-ok & co. mean a crash right after them cannot lose it."""
        pending = getattr(self.broker.durability, "pending_definition", None)
        if pending is None or pending.done:
            return False
        pending.add(self._definition_stored, (ch, reply, class_id, method_id))
        return True

    def _definition_stored(self, arg: tuple, ok: bool) -> None:
        ch, reply, class_id, method_id = arg
        if ch.closed or self.closed:
            return
        if not ok:
            self._error(ch.number, AMQPError(INTERNAL_ERROR, "could not store the definition",
                                             class_id, method_id, hard=True))
        elif isinstance(reply, (bytes, bytearray)):
            self.conn.send_raw(reply)
        else:
            self.conn.send_method(ch.number, reply)
        self.mark_dirty()

    def _queue_name(self, ch: Channel, name: str, cid: int, mid: int) -> str:
        if name == "":
            last = getattr(ch, "last_queue", None)
            if last is None:
                raise AMQPError(NOT_FOUND, "no previously declared queue", cid, mid, hard=False)
            return last
        return name

    # channel
    def _channel_flow(self, ch: Channel, m) -> None:
        ch.flow_active = bool(m.active)
        self._reply(ch, C.FlowOk(active=ch.flow_active))
        if ch.flow_active:
            for c in list(ch.consumers.values()):
                c.queue.dispatch()

    def _ignore(self, ch: Channel, m) -> None:
        pass

    # exchange
    def _exchange_declare(self, ch: Channel, m) -> None:
        perms.exchange_declare(self, m)
        self.vhost.declare_exchange(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                    m.internal, m.arguments)
        if not m.nowait:
            self._reply(ch, E.DeclareOk())

    def _exchange_delete(self, ch: Channel, m) -> None:
        perms.exchange_delete(self, m.exchange)
        self.vhost.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self._reply(ch, E.DeleteOk())

    def _exchange_bind(self, ch: Channel, m) -> None:
        perms.binding(self, "exchange", m.destination, m.source)
        self.vhost.bind(m.source, "exchange", m.destination, m.routing_key, m.arguments, 40, 30, self)
        if not m.nowait:
            self._reply(ch, E.BindOk())

    def _exchange_unbind(self, ch: Channel, m) -> None:
        perms.binding(self, "exchange", m.destination, m.source)
        self.vhost.unbind(m.source, "exchange", m.destination, m.routing_key, m.arguments, 40, 40, self)
        if not m.nowait:
            self._reply(ch, E.UnbindOk())

    # queue
    def _queue_declare(self, ch: Channel, m) -> None:
        if m.queue == PSEUDO_QUEUE and m.passive:
            if not m.nowait:
                self._reply(ch, Q.DeclareOk(PSEUDO_QUEUE, 0, 0))
            return
        server_name = None
        if not m.passive:
            server_name = generated("amq.gen-") if m.queue == "" else None
            if server_name or not m.queue.startswith("amq."):  # reserved-prefix 403 comes first
                perms.queue_declare(self, server_name or m.queue, m.arguments)
        q = self.vhost.declare_queue(m.queue, m.passive, m.durable, m.exclusive, m.auto_delete,
                                     m.arguments, owner=self, server_name=server_name)
        ch.last_queue = q.name
        if not m.nowait:
            frame = codec.queue_declare_ok_frame(ch.number, q.name, q.message_count, len(q.consumers))
            if not self._defer_reply(ch, frame, 50, 10):  # a durable queue: once it is stored
                self.conn.send_raw(frame)

    def _queue_bind(self, ch: Channel, m) -> None:
        rk = m.routing_key
        name = self._queue_name(ch, m.queue, 50, 20)
        if m.queue == "" and rk == "":
            rk = name
        perms.binding(self, "queue", name, m.exchange)
        self.vhost.bind(m.exchange, "queue", name, rk, m.arguments, 50, 20, self)
        if not m.nowait:
            self._reply(ch, Q.BindOk())

    def _queue_unbind(self, ch: Channel, m) -> None:
        name = self._queue_name(ch, m.queue, 50, 50)
        perms.binding(self, "queue", name, m.exchange)
        self.vhost.unbind(m.exchange, "queue", name, m.routing_key, m.arguments, 50, 50, self)
        self._reply(ch, Q.UnbindOk())

    def _queue_purge(self, ch: Channel, m) -> None:
        name = self._queue_name(ch, m.queue, 50, 30)
        perms.check(self, perms.READ, "queue", name)
        count = self.vhost.purge_queue(name, self)
        if not m.nowait:
            self._reply(ch, Q.PurgeOk(count))

    def _queue_delete(self, ch: Channel, m) -> None:
        name = self._queue_name(ch, m.queue, 50, 40)
        perms.check(self, perms.CONFIGURE, "queue", name)
        count = self.vhost.delete_queue(name, m.if_unused, m.if_empty, self)
        if not m.nowait:
            self._reply(ch, Q.DeleteOk(count))

    # basic
    def _basic_qos(self, ch: Channel, m) -> None:
        if m.prefetch_size:
            raise AMQPError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", 60, 10, hard=True)
        if m.global_:
            ch.global_prefetch = m.prefetch_count
        else:
            ch.prefetch = m.prefetch_count
            ch.global_prefetch = 0  # RabbitMQ: global=false also lifts the channel (global) limit
        self._reply(ch, B.QosOk())
        for c in list(ch.consumers.values()):
            c.queue.dispatch()

    def _basic_consume(self, ch: Channel, m) -> None:
        if m.queue == PSEUDO_QUEUE:
            tag = self.broker.reply_to.consume(ch, m.consumer_tag, m.no_ack)
            if not m.nowait:
                self._reply(ch, B.ConsumeOk(tag))
            return
        name = self._queue_name(ch, m.queue, 60, 20)
        perms.check(self, perms.READ, "queue", name)
        q = self.vhost.get_queue(name, self, 60, 20)
        if q.is_stream:  # stream consume rules, before consume-ok (stream.py)
            q.check_consume(ch, m)
        consumer = ch.consume(q, m.consumer_tag, m.no_ack, m.exclusive, m.arguments)
        if not m.nowait:
            self._reply(ch, B.ConsumeOk(consumer.tag))
        q.add_consumer(consumer)

    def _basic_cancel(self, ch: Channel, m) -> None:
        ch.cancel(m.consumer_tag)
        if not m.nowait:
            self._reply(ch, B.CancelOk(m.consumer_tag))

    def _basic_get(self, ch: Channel, m) -> None:
        name = self._queue_name(ch, m.queue, 60, 70)
        perms.check(self, perms.READ, "queue", name)
        q = self.vhost.get_queue(name, self, 60, 70)
        msg = q.get()
        if msg is None:
            if q.paged and q.refill is not None:
                # rows are being read back from the store: answer once they are here, not get-empty
                q.waiting_gets.append((self, ch, m))
                q.maybe_refill()
                return
            self._reply(ch, B.GetEmpty())
            return
        tag = ch.next_tag
        ch.next_tag += 1
        q.stats_delivered += 1
        self.broker.stats["get"] = self.broker.stats.get("get", 0) + 1
        self.conn.send_parts(codec.get_ok_frames(
            ch.number, tag, msg.redelivered, codec.short_str(msg.exchange),
            codec.short_str(msg.routing_key), q.message_count, msg.properties, msg.body,
            self.conn.frame_max))
        if m.no_ack:
            self.broker.settle(msg)
        else:
            ch.unacked[tag] = (msg, None)
            q.unacked += 1
            msg.delivered_at = time.monotonic()  # the consumer timeout covers basic.get too
            self.broker.delivered(msg)

    def retry_get(self, ch: Channel, m) -> None:
        """A basic.get that waited for a paged queue's refill (or its purge) is answered now."""
        if self.closed or ch.closed or self.channels.get(ch.number) is not ch:
            return
        try:
            self._basic_get(ch, m)
        except AMQPError as err:
            self._error(ch.number, err.for_method(60, 70))
        self.mark_dirty()

    def _basic_recover(self, ch: Channel, m) -> None:
        ch.recover(m.requeue)
        if isinstance(m, B.Recover):
            self._reply(ch, B.RecoverOk())

    def _confirm_select(self, ch: Channel, m) -> None:
        if ch.tx:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10,
                            hard=False)
        ch.confirm = True
        if not m.nowait:
            self._reply(ch, commands.Confirm.SelectOk())

    def _tx_select(self, ch: Channel, m) -> None:
        if ch.confirm:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10,
                            hard=False)
        ch.tx = True
        self._reply(ch, commands.Tx.SelectOk())

    def _tx_commit(self, ch: Channel, m) -> None:
        if not ch.tx:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional", 90, 20, hard=False)
        waiters = ch.tx_commit()
        pending = [w for w in waiters if not w.done]
        if not pending:
            self._reply(ch, commands.Tx.CommitOk())
            return
        # commit-ok only once every persistent message of the transaction is stored
        state = {"left": len(pending), "ok": True}

        def done(_arg, ok: bool) -> None:
            state["left"] -= 1
            state["ok"] = state["ok"] and ok
            if state["left"] == 0 and not ch.closed:
                if state["ok"]:
                    self._reply(ch, commands.Tx.CommitOk())
                else:
                    self._error(ch.number, AMQPError(INTERNAL_ERROR, "could not store the transaction's "
                                                     "messages", 90, 20, hard=True))
                self.mark_dirty()

        for w in pending:
            w.add(done, None)

    def _tx_rollback(self, ch: Channel, m) -> None:
        if not ch.tx:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional", 90, 30, hard=False)
        ch.tx_rollback()
        self._reply(ch, commands.Tx.RollbackOk())


# replies that promise a stored definition (sent once the definition write has committed)
_DEFINITION_REPLIES = frozenset({E.DeclareOk, E.DeleteOk, E.BindOk, E.UnbindOk, Q.DeclareOk,
                                 Q.BindOk, Q.UnbindOk, Q.PurgeOk, Q.DeleteOk})

_HANDLERS = {
    C.Flow: Session._channel_flow,
    C.FlowOk: Session._ignore,
    E.Declare: Session._exchange_declare,
    E.Delete: Session._exchange_delete,
    E.Bind: Session._exchange_bind,
    E.Unbind: Session._exchange_unbind,
    Q.Declare: Session._queue_declare,
    Q.Bind: Session._queue_bind,
    Q.Unbind: Session._queue_unbind,
    Q.Purge: Session._queue_purge,
    Q.Delete: Session._queue_delete,
    B.Qos: Session._basic_qos,
    B.Consume: Session._basic_consume,
    B.Cancel: Session._basic_cancel,
    B.Get: Session._basic_get,
    B.Recover: Session._basic_recover,
    B.RecoverAsync: Session._basic_recover,
    commands.Confirm.Select: Session._confirm_select,
    commands.Tx.Select: Session._tx_select,
    commands.Tx.Commit: Session._tx_commit,
    commands.Tx.Rollback: Session._tx_rollback,
}
