"""One AMQP channel: its consumers, unacknowledged deliveries, QoS, confirms and transactions."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from pamqp import commands

from exchange_broker.connection.consumer import Consumer
from exchange_broker.core.message import Message
from exchange_broker.core.names import generated
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import (ACCESS_REFUSED, NO_ROUTE, NOT_ALLOWED, NOT_IMPLEMENTED,
                                 PRECONDITION_FAILED)
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.core.queue_args import amqp_type, parse_expiration
from exchange_broker.core.reply_to import PREFIX as REPLY_PREFIX
from exchange_broker.queue_types.stream import refuse_reject

if TYPE_CHECKING:
    from exchange_broker.queue_types.classic import Queue
    from exchange_broker.connection.session import Session

B = commands.Basic

OUTPUT_BUDGET = 512 * 1024  # delivery bytes a connection may queue before its flush


class Channel:
    def __init__(self, session: "Session", number: int) -> None:
        self.session = session
        self.number = number
        self.consumers: dict[str, Consumer] = {}
        self.unacked: "OrderedDict[int, tuple[Message, Consumer | None]]" = OrderedDict()
        self.next_tag = 1
        self.prefetch = 0            # basic.qos global=false: limit for each new consumer
        self.global_prefetch = 0     # basic.qos global=true: limit shared by the channel
        self.global_unacked = 0
        self.flow_active = True
        self.closed = False
        # publisher confirms
        self.confirm = False
        self.publish_seq = 0
        self.unconfirmed: deque[list] = deque()   # [seq, state] state: 0 pending, 1 ack, 2 nack
        self.ack_upto = 0                          # confirmed contiguously, not yet sent
        # transactions
        self.tx = False
        self.tx_publishes: list = []
        self.tx_acks: list = []
        self.stats_published = 0
        self.stats_delivered = 0
        self.stats_acked = 0
        self.last_queue: str | None = None
        # direct reply-to (amq.rabbitmq.reply-to)
        self.reply_tag: str | None = None
        self.reply_tag_sh = b""
        self.reply_token: str | None = None

    # -- delivery ------------------------------------------------------------------------------
    @property
    def deliverable(self) -> bool:
        return self.flow_active and self.session.writable and not self.closed

    def deliver_reply(self, msg: Message) -> None:
        """A direct reply-to delivery: no queue, no ack (the consumer is no_ack by contract)."""
        tag = self.next_tag
        self.next_tag = tag + 1
        sess = self.session
        sess.conn.send_parts(codec.deliver_frames(
            self.number, self.reply_tag_sh, tag, False, b"\x00", codec.short_str(msg.routing_key),
            msg.properties, msg.body, sess.conn.frame_max))
        self.stats_delivered += 1
        sess.mark_dirty()

    def deliver(self, consumer: Consumer, msg: Message) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        sess = self.session
        sess.conn.send_parts(codec.deliver_frames(
            self.number, consumer.tag_sh, tag, msg.redelivered, codec.short_str(msg.exchange),
            codec.short_str(msg.routing_key), msg.properties, msg.body, sess.conn.frame_max))
        self.stats_delivered += 1
        sess.broker.stats["deliver"] += 1
        msg.delivered_at = time.monotonic()
        sess.out_pending += len(msg.body) + 96
        if sess.out_pending > OUTPUT_BUDGET:
            sess.writable = False  # resumes after the next flush
        if consumer.no_ack:
            sess.broker.settle(msg)
        else:
            self.unacked[tag] = (msg, consumer)
            consumer.unacked += 1
            msg.queue.unacked += 1
            self.global_unacked += 1
            sess.broker.delivered(msg)
        sess.mark_dirty()

    # -- publishing ----------------------------------------------------------------------------
    def publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                properties: bytes, body: bytes) -> None:
        if immediate:
            raise AMQPError(NOT_IMPLEMENTED, "immediate=true", 60, 40, hard=True)
        sess = self.session
        vhost = sess.vhost
        sess.broker.check_write(sess, exchange)  # write permission, before the existence check
        ex = vhost.exchanges.get(exchange)
        if ex is None:
            raise AMQPError(404, f"no {vhost.describe('exchange', exchange)}", 60, 40, hard=False)
        if ex.internal:
            raise AMQPError(ACCESS_REFUSED, f"cannot publish to internal "
                            f"{vhost.describe('exchange', exchange)}", 60, 40, hard=False)
        if not sess.has_published:
            sess.has_published = True
            if sess.broker.alarms:
                sess.block(sess.broker.alarm_reason())
        seq = 0
        if self.confirm:
            self.publish_seq += 1
            seq = self.publish_seq
        self.stats_published += 1
        if self.tx:
            self.tx_publishes.append((ex, routing_key, mandatory, properties, body))
            return
        self._route(ex, routing_key, mandatory, properties, body, seq)

    def _route(self, ex, routing_key: str, mandatory: bool, properties: bytes, body: bytes,
               seq: int, tokens: list | None = None) -> None:
        sess = self.session
        reply_to = sess.broker.reply_to
        properties = reply_to.rewrite_reply_to(self, properties)
        if ex.name == "" and routing_key.startswith(REPLY_PREFIX):
            routed = reply_to.deliver(routing_key, properties, body)
            if not routed and mandatory:
                self._return_unroutable(ex.name, routing_key, properties, body)
            if seq:
                self._confirm_enqueue(seq, 1)
            sess.mark_dirty()
            return
        dm, prio, flags = codec.quick_properties(properties)
        msg = Message(ex.name, routing_key, properties, body, dm == 2, prio)
        ttl = parse_expiration(msg.props.get("expiration")) if flags & codec.FLAG_EXPIRATION else None
        result = sess.broker.publish(sess.vhost, ex, msg, bool(flags & codec.FLAG_HEADERS), sess, ttl)
        routed, waiter, rejected = result
        if not routed and mandatory:
            self._return_unroutable(ex.name, routing_key, properties, body)
        if seq:
            if rejected:
                self._confirm_enqueue(seq, 2)
            elif waiter is None:
                self._confirm_enqueue(seq, 1)
            else:
                entry = [seq, 0]
                self.unconfirmed.append(entry)
                waiter.add(self._confirmed, entry)
        elif tokens is not None and waiter is not None:
            tokens.append(waiter)

    def _return_unroutable(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        """basic.return 312 NO_ROUTE for a mandatory publish that reached no queue."""
        conn = self.session.conn
        conn.send_parts(codec.return_frames(self.number, NO_ROUTE, "NO_ROUTE", exchange, routing_key,
                                            properties, body, conn.frame_max))
        self.session.mark_dirty()

    def _confirm_enqueue(self, seq: int, state: int) -> None:
        if not self.unconfirmed and state == 1:
            self.ack_upto = seq
            self.session.want_confirm_flush(self)
        else:
            self.unconfirmed.append([seq, state])
            self._drain_confirms()

    def _confirmed(self, entry: list, ok: bool) -> None:
        entry[1] = 1 if ok else 2
        self._drain_confirms()

    def _drain_confirms(self) -> None:
        unconfirmed = self.unconfirmed
        conn = self.session.conn
        while unconfirmed and unconfirmed[0][1]:
            seq, state = unconfirmed.popleft()
            if state == 1:
                self.ack_upto = seq
            else:
                self.flush_confirms()
                conn.send_raw(codec.nack_frame(self.number, seq, False))
        if self.ack_upto:
            self.session.want_confirm_flush(self)
        self.session.mark_dirty()

    def flush_confirms(self) -> None:
        if self.ack_upto and not self.closed:
            self.session.conn.send_raw(codec.ack_frame(self.number, self.ack_upto, True))
            self.session.mark_dirty()
        self.ack_upto = 0

    # -- acknowledgements ----------------------------------------------------------------------
    def ack(self, kind: int, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        if kind:  # basic.nack/reject of a stream delivery: 540 (stream.py)
            refuse_reject(self, delivery_tag, multiple, kind)
        if self.tx:
            if not (multiple and delivery_tag == 0) and delivery_tag not in self.unacked:
                raise self._unknown_tag(delivery_tag, kind)
            self.tx_acks.append((kind, delivery_tag, multiple, requeue))
            return
        self._settle(self._take(delivery_tag, multiple, kind), kind, requeue)

    def _take(self, delivery_tag: int, multiple: bool, kind: int) -> list:
        """Remove and return the (msg, consumer) entries an ack/nack/reject covers (RabbitMQ's rule:
        multiple with tag 0 means everything outstanding; otherwise the tag must be outstanding)."""
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                taken = list(unacked.values())
                unacked.clear()
                return taken
            if delivery_tag not in unacked:
                raise self._unknown_tag(delivery_tag, kind)
            taken = []
            while True:
                tag, entry = unacked.popitem(last=False)
                taken.append(entry)
                if tag == delivery_tag:
                    return taken
        entry = unacked.pop(delivery_tag, None)
        if entry is None:
            raise self._unknown_tag(delivery_tag, kind)
        return [entry]

    def _unknown_tag(self, tag: int, kind: int) -> AMQPError:
        method = (80, 120, 90)[kind]
        return AMQPError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method, hard=False)

    def _settle(self, entries: list, kind: int, requeue: bool) -> None:
        """Apply acks (kind 0) or nack/reject (1/2) to taken entries."""
        if not entries:
            return
        broker = self.session.broker
        touched: set = set()
        to_requeue: dict = {}
        for msg, consumer in entries:
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
                touched.add(consumer.queue)
            q = msg.queue
            if q is not None:
                q.unacked -= 1
            if kind != 0 and requeue:
                if q is not None and not q.deleted:
                    to_requeue.setdefault(q, []).append(msg)
            else:
                if kind == 0:
                    self.stats_acked += 1
                    broker.stats["ack"] += 1
                    broker.settle(msg)
                else:
                    broker.rejected(msg)
        for q, msgs in to_requeue.items():
            q.requeue(msgs)
        for q in touched:
            if (q.ready or q.is_stream) and not q.deleted:  # streams: per-consumer backlog
                q.dispatch()
        if self.global_prefetch:
            for c in self.consumers.values():
                if (c.queue.ready or c.queue.is_stream) and not c.queue.deleted:
                    c.queue.dispatch()

    def recover(self, requeue: bool) -> None:
        if not requeue:
            raise AMQPError(NOT_IMPLEMENTED, "requeue=false", 60, 110, hard=True)
        self.requeue_all()

    def requeue_all(self) -> None:
        entries = list(self.unacked.values())
        self.unacked.clear()
        self._settle(entries, 1, True)

    # -- consumers -----------------------------------------------------------------------------
    def consume(self, queue: "Queue", tag: str, no_ack: bool, exclusive: bool, arguments: dict) -> Consumer:
        if not tag:
            tag = generated("amq.ctag-")
        if tag in self.consumers:
            raise AMQPError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20, hard=True)
        desc = self.session.vhost.describe("queue", queue.name)
        if queue.consumers and (exclusive or any(c.exclusive for c in queue.consumers)):
            raise AMQPError(ACCESS_REFUSED, f"{desc} in exclusive use", 60, 20, hard=False)
        prio = (arguments or {}).get("x-priority")
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for {desc}: "
                            f'"expected integer, got {amqp_type(prio)}"', 60, 20, hard=False)
        c = Consumer(tag, self, queue, no_ack, exclusive, self.prefetch, arguments or {})
        self.consumers[tag] = c
        return c

    def cancel(self, tag: str) -> Consumer | None:
        if tag is not None and tag == self.reply_tag:
            self.session.broker.reply_to.cancel(self)
            return None
        c = self.consumers.pop(tag, None)
        if c is not None:
            c.active = False
            c.queue.remove_consumer(c)
        return c

    # -- transactions --------------------------------------------------------------------------
    def tx_commit(self) -> list:
        """Apply buffered publishes and acks; returns durability waiters to wait for."""
        waiters: list = []
        publishes, acks = self.tx_publishes, self.tx_acks
        self.tx_publishes, self.tx_acks = [], []
        for ex, rk, mandatory, props, body in publishes:
            if ex.name not in self.session.vhost.exchanges:
                continue
            self._route(ex, rk, mandatory, props, body, 0, waiters)
        for kind, tag, multiple, requeue in acks:
            try:
                entries = self._take(tag, multiple, kind)
            except AMQPError:
                continue  # already settled by an earlier ack in the same transaction
            self._settle(entries, kind, requeue)
        return waiters

    def tx_rollback(self) -> None:
        self.tx_publishes.clear()
        self.tx_acks.clear()

    # -- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Release everything: cancel consumers, return unacked messages to their queues in order."""
        if self.closed:
            return
        self.closed = True
        # requeue first (no consumer of this channel can take them now), then cancel consumers:
        # a single-active-consumer queue hands over with the old unacked messages at the head
        entries = list(self.unacked.values())
        self.unacked.clear()
        self._settle(entries, 1, True)
        for tag in list(self.consumers):
            self.cancel(tag)
        self.session.broker.reply_to.cancel(self)
        self.tx_publishes.clear()
        self.tx_acks.clear()
