"""The channel's definition methods (exchange.* and queue.*), a part of :class:`Channel`.

Each checks the permission RabbitMQ's table asks for (``core/permissions.py``), lets the vhost
act, and replies. A reply that promises a stored definition (declare-ok, bind-ok, ...) is held
until the durability has committed the definition, as RabbitMQ does: a crash right after the
reply cannot lose it.
"""

from __future__ import annotations

from pamqp import commands

from exchange_broker.core import permissions as perms
from exchange_broker.core.names import generated, strip_cr_lf
from exchange_broker.core.reply_to import PSEUDO_QUEUE
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import INTERNAL_ERROR, NOT_FOUND
from exchange_broker.protocol.errors import AMQPError

Q, E = commands.Queue, commands.Exchange

# replies that promise a stored definition (sent once the definition write has committed)
DEFINITION_REPLIES = frozenset({E.DeclareOk, E.DeleteOk, E.BindOk, E.UnbindOk, Q.DeclareOk,
                                Q.BindOk, Q.UnbindOk, Q.PurgeOk, Q.DeleteOk})
# methods that change stored definitions (or a durable queue's messages: purge): refused with
# 541 while a cluster node cannot reach its database (``Broker.definitions_unavailable``)
DEFINITION_CHANGES = frozenset({E.Declare, E.Delete, E.Bind, E.Unbind, Q.Declare, Q.Bind, Q.Unbind,
                                Q.Purge, Q.Delete})


class DefinitionMethods:
    """Mixed into Channel: uses its ``session``, ``number`` and ``closed``."""

    last_queue: str | None = None   # the queue "" means in queue.bind & co.

    def check_store_reachable(self, m) -> None:
        """A definition change while the node cannot reach the database: a channel error 541
        INTERNAL_ERROR at once (the change could not be stored; RabbitMQ answers 541 when its
        metadata store times out). Only the channel closes: the connection and its other channels
        (transient traffic, deliveries) go on. A passive declare and the re-declare of an existing
        queue or exchange store nothing and are answered as usual."""
        reason = self.session.broker.definitions_unavailable()
        if reason is None or getattr(m, "passive", False):
            return
        vhost = self.session.vhost
        if isinstance(m, Q.Declare) and (m.queue in vhost.queues or m.queue.startswith(PSEUDO_QUEUE)):
            return
        if isinstance(m, E.Declare) and m.exchange in vhost.exchanges:
            return
        raise AMQPError(INTERNAL_ERROR, reason, m.index >> 16, m.index & 0xFFFF, hard=False)

    # -- replies ----------------------------------------------------------------------------------
    def reply(self, method) -> None:
        if type(method) in DEFINITION_REPLIES and \
                self._defer_reply(method, method.index >> 16, (method.index & 0xFFFF) - 1):
            return
        self.session.conn.send_method(self.number, method)

    def _defer_reply(self, reply, class_id: int, method_id: int, slot=None) -> bool:
        """Hold a definition reply (a method, or raw frame bytes) until the definition is stored."""
        pending = self.session.broker.durability.pending_definition
        if pending is None or pending.done:
            return False
        self.reply_when_stored([pending], reply, class_id, method_id, "could not store the definition", slot)
        return True

    def reply_in(self, slot, method) -> None:
        """``method`` into a place of the channel's output held before it was made (``conn.hold``),
        once its definition is stored."""
        if not self._defer_reply(method, method.index >> 16, (method.index & 0xFFFF) - 1, slot):
            self.session.conn.fill(slot, codec.method_frame(self.number, method))

    def reply_when_stored(self, waiters: list, reply, class_id: int, method_id: int, failure: str,
                          slot=None) -> None:
        """Send ``reply`` (a method, or raw frame bytes) once every durability waiter has fired;
        if one failed, close the connection with 541 ``failure`` instead.

        The reply's place in the channel's output is held meanwhile: later replies and deliveries
        on this channel, its close-ok and the connection's close-ok go out after it, in request
        order (and it is sent even if the client closed the channel since)."""
        state = [len(waiters), True, slot or self.session.conn.hold(self.number), reply, class_id, method_id,
                 failure]
        for waiter in waiters:
            waiter.add(self._stored, state)

    def _stored(self, state: list, ok: bool) -> None:
        state[0] -= 1
        state[1] = state[1] and ok
        if state[0]:
            return
        _, ok, slot, reply, class_id, method_id, failure = state
        sess = self.session
        if not ok:
            sess.conn.fill(slot)
            if not (self.closed or sess.closed):  # ``failure``: a text (541), or gives the error
                error = failure() if callable(failure) else AMQPError(INTERNAL_ERROR, failure, class_id,
                                                                      method_id, hard=True)
                sess.channel_error(self.number, error)
        else:
            if not isinstance(reply, (bytes, bytearray)):
                reply = codec.method_frame(self.number, reply)
            sess.conn.fill(slot, bytes(reply))
        sess.mark_dirty()

    def queue_name(self, name: str, cid: int, mid: int) -> str:
        """"" means the last queue declared on this channel (404 when there is none)."""
        if name == "":
            if self.last_queue is None:
                raise AMQPError(NOT_FOUND, "no previously declared queue", cid, mid, hard=False)
            return self.last_queue
        return name

    # -- exchange.* (names lose CR and LF in declare, delete and bindings: core/names.strip_cr_lf) --
    def _exchange_declare(self, m) -> None:
        m.exchange = strip_cr_lf(m.exchange)
        sess = self.session
        perms.exchange_declare(sess, m)
        sess.vhost.declare_exchange(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                    m.internal, m.arguments)
        if not m.nowait:
            self.reply(E.DeclareOk())

    def _exchange_delete(self, m) -> None:
        m.exchange = strip_cr_lf(m.exchange)
        perms.exchange_delete(self.session, m.exchange)
        self.session.vhost.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self.reply(E.DeleteOk())

    def _exchange_bind(self, m) -> None:
        m.source, m.destination = strip_cr_lf(m.source), strip_cr_lf(m.destination)
        sess = self.session
        perms.binding(sess, "exchange", m.destination, m.source, m.routing_key)
        sess.vhost.bind(m.source, "exchange", m.destination, m.routing_key, m.arguments, 40, 30, sess)
        if not m.nowait:
            self.reply(E.BindOk())

    def _exchange_unbind(self, m) -> None:
        m.source, m.destination = strip_cr_lf(m.source), strip_cr_lf(m.destination)
        sess = self.session
        perms.binding(sess, "exchange", m.destination, m.source, m.routing_key)
        sess.vhost.unbind(m.source, "exchange", m.destination, m.routing_key, m.arguments, 40, 40,
                          sess)
        if not m.nowait:
            self.reply(E.UnbindOk())

    # -- queue.* ------------------------------------------------------------------------------------
    def _queue_declare(self, m) -> None:
        m.queue = strip_cr_lf(m.queue)
        sess = self.session
        if m.queue.startswith(PSEUDO_QUEUE):
            # every declare of direct reply-to is passive (rabbit_channel): the pseudo-queue
            # exists with one consumer, a reply address while its channel consumes
            if not sess.broker.reply_to.exists(m.queue):
                raise AMQPError(NOT_FOUND, f"no queue '{m.queue}' in vhost '{sess.vhost.name}'", 50, 10,
                                hard=False)
            if not m.nowait:
                self.reply(Q.DeclareOk(m.queue, 0, 1))
            return
        server_name = None
        if not m.passive:
            server_name = generated("amq.gen-") if m.queue == "" else None
            if server_name or not m.queue.startswith("amq."):  # reserved-prefix 403 comes first
                perms.queue_declare(sess, server_name or m.queue, m.arguments)
        q = sess.vhost.declare_queue(m.queue, m.passive, m.durable, m.exclusive, m.auto_delete,
                                     m.arguments, owner=sess, server_name=server_name)
        self.last_queue = q.name
        if not m.nowait:
            frame = codec.queue_declare_ok_frame(self.number, q.name, q.message_count,
                                                 len(q.consumers))
            if not self._defer_reply(frame, 50, 10):  # a durable queue: once it is stored
                sess.conn.send_raw(frame)

    def _queue_bind(self, m) -> None:
        m.exchange, m.queue = strip_cr_lf(m.exchange), strip_cr_lf(m.queue)
        sess = self.session
        rk = m.routing_key
        name = self.queue_name(m.queue, 50, 20)
        if m.queue == "" and rk == "":
            rk = name
        perms.binding(sess, "queue", name, m.exchange, rk)
        sess.vhost.bind(m.exchange, "queue", name, rk, m.arguments, 50, 20, sess)
        if not m.nowait:
            self.reply(Q.BindOk())

    def _queue_unbind(self, m) -> None:
        m.exchange, m.queue = strip_cr_lf(m.exchange), strip_cr_lf(m.queue)
        sess = self.session
        name = self.queue_name(m.queue, 50, 50)
        perms.binding(sess, "queue", name, m.exchange, m.routing_key)
        sess.vhost.unbind(m.exchange, "queue", name, m.routing_key, m.arguments, 50, 50, sess)
        self.reply(Q.UnbindOk())

    def _queue_purge(self, m) -> None:
        sess = self.session
        name = self.queue_name(m.queue, 50, 30)
        perms.check(sess, perms.READ, "queue", name)
        q = sess.vhost.get_queue(name, sess, 50, 30)
        ok = Q.PurgeOk(0)
        later = q.purge_later(ok)  # the queue type's answer may come later (purge-ok waits for it)
        if later is not None:
            if not m.nowait:
                self.reply_when_stored([later], ok, 50, 30, q.command_error)
            return
        count = sess.vhost.purge_queue(name, sess)
        if not m.nowait:
            self.reply(Q.PurgeOk(count))

    def _queue_delete(self, m) -> None:
        m.queue = strip_cr_lf(m.queue)
        sess = self.session
        name = self.queue_name(m.queue, 50, 40)
        perms.check(sess, perms.CONFIGURE, "queue", name)
        q = sess.vhost.queues.get(name)
        if q is not None:
            sess.vhost.get_queue(name, sess, 50, 40)  # exclusive to another connection: 405
            ok = Q.DeleteOk(0)
            later = q.delete_later(ok, m.if_unused, m.if_empty)  # the queue type's answer may come later
            if later is not None:
                if not m.nowait:
                    self.reply_when_stored([later], ok, 50, 40, q.command_error)
                return
        if m.nowait:
            sess.vhost.delete_queue(name, m.if_unused, m.if_empty, sess)
            return
        # delete-ok goes before the basic.cancel of this channel's consumers of the queue, as
        # RabbitMQ sends them (a client closing the channel on the cancel still gets the reply)
        slot = sess.conn.hold(self.number)
        try:
            count = sess.vhost.delete_queue(name, m.if_unused, m.if_empty, sess)
        except BaseException:
            sess.conn.fill(slot)
            raise
        self.reply_in(slot, Q.DeleteOk(count))
