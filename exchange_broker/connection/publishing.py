"""basic.publish: checked, routed and handed to the queues, a part of :class:`Channel`.

Publishes arrive one at a time or as a run (``ev.Publishes``: several in a row on this channel,
nothing between them). A run is checked once per exchange it names, and the queues it reaches
deliver once at its end instead of once per message (``Broker.dispatch_later``).
"""

from __future__ import annotations

from exchange_broker.core.actions import Block
from exchange_broker.core.message import from_wire
from exchange_broker.core.reply_to import PREFIX as REPLY_PREFIX
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import ACCESS_REFUSED, NO_ROUTE, NOT_IMPLEMENTED
from exchange_broker.protocol.errors import AMQPError


class PublishMethods:
    def publish_many(self, items) -> None:
        """basic.publish, one or several in a row (``ev.Publish`` items, in order). The write
        permission and the exchange are checked again only when the exchange (or, with topic
        permissions, the routing key) changes from one publish to the next."""
        broker = self.session.broker
        if len(items) > 1 and broker.dispatch_later is None:  # deliver once the run is routed
            broker.dispatch_later = later = []
            try:
                self._publish_run(items)
            finally:
                broker.dispatch_deferred(later)
        else:
            self._publish_run(items)

    def _publish_run(self, items) -> None:
        sess = self.session
        vhost = sess.vhost
        broker = sess.broker
        checked = None  # (exchange, routing key) last checked
        ex = None
        for p in items:
            if p.immediate:
                raise AMQPError(NOT_IMPLEMENTED, "immediate=true", 60, 40, hard=True)
            exchange = p.exchange
            routing_key = p.routing_key
            if checked is None or exchange != checked[0] or \
                    (broker.topic_permissions and routing_key != checked[1]):
                broker.check_write(sess, exchange, routing_key)  # write (and topic) permission, before the 404
                ex = vhost.exchanges.get(exchange)
                if ex is None:
                    raise AMQPError(404, f"no {vhost.describe('exchange', exchange)}", 60, 40, hard=False)
                if ex.internal:
                    raise AMQPError(ACCESS_REFUSED, f"cannot publish to internal "
                                    f"{vhost.describe('exchange', exchange)}", 60, 40, hard=False)
                if not sess.has_published:
                    sess.first_publish()
                checked = (exchange, routing_key)
            seq = 0
            if self.confirm:
                self.publish_seq += 1
                seq = self.publish_seq
            self.stats_published += 1
            if self.tx:  # checked now (user-id, expiration), as RabbitMQ; routed at tx.commit
                from_wire(ex.name, routing_key, p.properties, p.body, sess.principal, p.quick)
                self.tx_publishes.append((ex, routing_key, p.mandatory, p.properties, p.body))
                continue
            self._route(ex, routing_key, p.mandatory, p.properties, p.body, seq, None, p.quick)

    def _route(self, ex, routing_key: str, mandatory: bool, properties: bytes, body: bytes,
               seq: int, tokens: list | None = None, quick: tuple | None = None) -> None:
        sess = self.session
        if quick is None:
            quick = codec.quick_properties(properties)
        flags = quick[2]
        if flags & codec.FLAG_REPLY_TO:
            properties = sess.broker.reply_to.rewrite_reply_to(self, properties)
        msg = from_wire(ex.name, routing_key, properties, body, sess.principal, quick)
        if ex.name == "" and routing_key.startswith(REPLY_PREFIX):
            routed = sess.broker.reply_to.deliver(msg)
            if not routed and mandatory:
                self._return_unroutable(ex.name, routing_key, properties, body)
            if seq:
                self._confirm_enqueue(seq, 1)
            sess.mark_dirty()
            return
        routed, waiter, rejected = sess.broker.publish(sess.vhost, ex, msg,
                                                       flags & codec.FLAG_HEADERS != 0, sess,
                                                       self.number)
        if not routed and mandatory:
            self._return_unroutable(ex.name, routing_key, properties, body)
        if waiter is None:  # nothing to wait for, nothing to do: the fast path
            if seq:
                self._confirm_enqueue(seq, 2 if rejected else 1)
            return
        if waiter.__class__ is Block:  # the queues' actions (core/actions.py): stop reading
            waiter = sess.apply_actions(waiter)
        if seq:
            if rejected:
                self._confirm_enqueue(seq, 2)
            elif waiter is None:
                self._confirm_enqueue(seq, 1)
            else:
                self._await_store(seq, waiter)
        elif tokens is not None and waiter is not None:
            tokens.append(waiter)

    def _return_unroutable(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        """basic.return 312 NO_ROUTE for a mandatory publish that reached no queue."""
        conn = self.session.conn
        conn.send_parts(codec.return_frames(self.number, NO_ROUTE, "NO_ROUTE", exchange, routing_key,
                                            properties, body, conn.frame_max))
        self.session.mark_dirty()

