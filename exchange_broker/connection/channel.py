"""One AMQP channel: every channel-level method, and the one delivery routine.

The session hands each event for this channel to :meth:`Channel.publish`, :meth:`Channel.ack` or
:meth:`Channel.handle` (every other method, through the table at the end). Definition methods
(exchange.*, queue.*) are in ``definitions.py``, confirm.select and the confirms in
``confirms.py``, tx.* in ``transactions.py``: all parts of this class. Queues deliver through each consumer's sink (``Consumer.deliver``), which is
:meth:`Channel._deliver` bound to the consumer; basic.get's get-ok and direct reply-to deliveries
go through the same routine, :meth:`Channel._deliver_run`, which keeps every per-delivery counter.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

from pamqp import commands

from exchange_broker.connection.acks import AckMethods
from exchange_broker.connection.confirms import ConfirmMethods
from exchange_broker.connection.consumer import Consumer
from exchange_broker.connection.definitions import DEFINITION_CHANGES, DefinitionMethods
from exchange_broker.connection.publishing import PublishMethods
from exchange_broker.connection.timeouts import ConsumerTimeoutMethods
from exchange_broker.connection.transactions import TransactionMethods
from exchange_broker.core import permissions as perms
from exchange_broker.core import tracing
from exchange_broker.core.message import Message
from exchange_broker.core.names import generated
from exchange_broker.core.queue import delivery_guard
from exchange_broker.core.queue_args import amqp_type
from exchange_broker.core.reply_to import PSEUDO_QUEUE
from exchange_broker.protocol import codec
from exchange_broker.protocol.codec import (SHORT_STRINGS, deliver_frames, deliver_template,
                                             deliver_template_holed, get_ok_frames)
from exchange_broker.protocol.connection import TooLarge
from exchange_broker.protocol.constants import (ACCESS_REFUSED, COMMAND_INVALID, FRAME_END_BYTE,
                                                NOT_ALLOWED, NOT_IMPLEMENTED, PRECONDITION_FAILED)
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.consumer_groups import GROUP_ARG, find_group

B, Q, E, C = commands.Basic, commands.Queue, commands.Exchange, commands.Channel

OUTPUT_BUDGET = 512 * 1024  # delivery bytes a connection may queue before its flush


class Channel(AckMethods, PublishMethods, ConfirmMethods, DefinitionMethods, TransactionMethods, ConsumerTimeoutMethods):
    def __init__(self, session, number: int) -> None:
        self.session = session
        self.number = number
        self.consumers: dict[str, Consumer] = {}
        self.unacked: "OrderedDict[int, tuple[Message, Consumer | None]]" = OrderedDict()
        self.next_tag = 1
        self.prefetch = 0            # basic.qos global=false: limit for each new consumer
        self.global_prefetch = 0     # basic.qos global=true: limit shared by the channel
        self.global_unacked = 0
        self._turn = 0               # where _dispatch_consumers starts next
        self.closed = False
        self._confirm_init()
        self._tx_init()
        self._timeouts_init()
        self.stats_published = 0
        self.stats_delivered = 0
        self.stats_acked = 0
        # direct reply-to (amq.rabbitmq.reply-to)
        self.reply_tag: str | None = None
        self.reply_consumer = None   # what _deliver_run needs of it (core/reply_to.py)
        self.reply_token: str | None = None

    # -- methods ------------------------------------------------------------------------------------
    def handle(self, m) -> None:
        """Every method but basic.publish and the acknowledgements (see the table below)."""
        handler = _HANDLERS.get(type(m))
        if handler is None:
            if isinstance(m, TooLarge):
                raise m.error()
            raise AMQPError(COMMAND_INVALID, f"unimplemented method {m.name}", m.index >> 16,
                            m.index & 0xFFFF, hard=True)
        events = self.session.broker.events
        if events is not None:  # the event exchange names the user whose method this is
            events.acting_user = self.session.user
        try:
            if type(m) in DEFINITION_CHANGES:
                self.check_store_reachable(m)
            handler(self, m)
        except AMQPError as err:
            raise err.for_method(m.index >> 16, m.index & 0xFFFF)
        finally:
            if events is not None:
                events.acting_user = None

    def _ignore(self, m) -> None:
        pass

    def _channel_flow(self, m) -> None:
        # RabbitMQ never stops deliveries for a client's channel.flow: active=true is answered,
        # active=false refused with 540 (rabbit_channel's handle_method for channel.flow)
        if not m.active:
            raise AMQPError(NOT_IMPLEMENTED, "active=false", hard=True)
        self.reply(C.FlowOk(active=True))

    # -- delivery: the one routine ------------------------------------------------------------------
    def delivery_sink(self, consumer: Consumer):
        """``deliver(msg) -> tag`` for one consumer (what its queue calls)."""
        return partial(self._deliver, consumer)

    def run_sink(self, consumer: Consumer):
        """``deliver_run(msgs)`` for one consumer: a queue's run of messages at once."""
        return partial(self._deliver_run, consumer)

    def _deliver(self, consumer: Consumer, msg: Message) -> int:
        return self._deliver_run(consumer, (msg,))[0]

    def _deliver_run(self, consumer: Consumer | None, msgs, no_ack: bool = True, count: int = 0):
        """basic.deliver of ``msgs`` (of one queue, in order) to ``consumer``: settled as they
        leave (no-ack) or awaiting their acks; the lookups and counters done once per run.
        Returns their delivery tags. Every delivery of the channel comes here: ``consumer`` None
        is basic.get's get-ok of one message (``no_ack``; ``count``: the queue's message count),
        a message of no queue a direct reply (``Channel.deliver_reply``)."""
        sess = self.session
        conn = sess.conn
        number, frame_max = self.number, conn.frame_max
        if consumer is not None:  # basic.deliver: the consumer tag where get-ok has the count
            frames, tag_sh, no_ack = deliver_frames, consumer.tag_sh, consumer.no_ack
        else:
            frames, tag_sh = get_ok_frames, count
        q = msgs[0].queue
        settle = q.settle if q is not None else _unqueued
        unacked = self.unacked
        now = None if no_ack else sess.broker.clock.time()  # the consumer timeout's start
        traced = sess.vhost.tracing  # the firehose (deliver.<queue>) after each message's frames
        single = len(msgs) == 1
        tag = first = self.next_tag
        tags = [] if traced else None  # (a traced run's tags need not follow each other)
        parts: list[bytes] = []
        exchange = key = props = body_size = again = before = middle = after = None
        size = redelivered = 0
        for msg in msgs:
            if msg.exchange is not exchange or msg.routing_key is not key:
                exchange, key = msg.exchange, msg.routing_key
                exchange_sh = SHORT_STRINGS.get(exchange) or codec.short_cached(exchange)
                key_sh = SHORT_STRINGS.get(key) or codec.short_cached(key)
                props = before = middle = None  # a template for this exchange and key
            body = msg.body
            if before is not None and msg.properties is props and len(body) == body_size and \
                    msg.redelivered is again:
                parts += (before, tag.to_bytes(8, "big"), after, body, FRAME_END_BYTE)
            elif middle is not None and msg.props_shape is props and len(body) == body_size and \
                    msg.redelivered is again:  # a stream's: its offset in the properties' hole
                parts += (before, tag.to_bytes(8, "big"), middle, (msg.seq - 1).to_bytes(8, "big"),
                          after, body, FRAME_END_BYTE)
            elif single or props is not None:  # one message, or not the shape of the run's first
                parts += frames(number, tag_sh, tag, msg.redelivered, exchange_sh, key_sh,
                                msg.properties, body, frame_max)
            else:  # the run's first message: a template for those that share its shape
                body_size, again = len(body), msg.redelivered
                props = msg.props_shape  # (head, tail) around 8 bytes of each message's own
                if props is None:
                    props = msg.properties
                    template = deliver_template(number, tag_sh, again, exchange_sh, key_sh, props,
                                                body_size, frame_max)
                    if template is not None:
                        before, after = template
                else:
                    template = deliver_template_holed(number, tag_sh, again, exchange_sh, key_sh,
                                                      props[0], props[1], body_size, frame_max)
                    if template is not None:
                        before, middle, after = template
                if template is None:
                    parts += frames(number, tag_sh, tag, again, exchange_sh, key_sh,
                                    msg.properties, body, frame_max)
                elif middle is None:
                    parts += (before, tag.to_bytes(8, "big"), after, body, FRAME_END_BYTE)
                else:
                    parts += (before, tag.to_bytes(8, "big"), middle,
                              (msg.seq - 1).to_bytes(8, "big"), after, body, FRAME_END_BYTE)
            if traced:
                tags.append(tag)
                conn.send_parts(parts)
                parts = []
                self.next_tag = tag + 1
                tracing.tap_out(sess.broker, sess.vhost, msg, sess, number)
            size += len(body)
            if msg.redelivered:
                redelivered += 1
            if no_ack:
                settle(msg)
            else:
                msg.delivered_at = now
                unacked[tag] = (msg, consumer)
                if msg.stored:
                    q.delivered(msg)
            tag = self.next_tag if traced else tag + 1  # (a traced copy may have taken tags)
        if parts:
            conn.send_parts(parts)
        n = len(msgs)
        self.next_tag = tag
        if consumer is None:  # basic.get: counted as a get; no consumer's prefetch counts it
            self._count_get(q, n, redelivered, no_ack)
        elif q is not None:
            self.stats_delivered += n
            sess.broker.stats["deliver"] += n
            q.stats_redeliver += redelivered
            if no_ack:
                q.stats_deliver_no_ack += n
            else:
                q.stats_deliver += n
                q.unacked += n
                consumer.unacked += n
                self.global_unacked += n
        else:  # a direct reply: no queue counts it
            self.stats_delivered += n
        sess.out_pending += size + 96 * n
        if sess.out_pending > OUTPUT_BUDGET:
            sess.writable = False  # resumes after the next flush
        if not sess.dirty:
            sess.mark_dirty()
        return tags if traced else range(first, tag)

    def _count_get(self, q, n: int, redelivered: int, no_ack: bool) -> None:
        """A get-ok's counters (``_deliver_run``); the queue counts consumers' deliveries itself."""
        q.stats_delivered += n
        q.stats_redeliver += redelivered
        if no_ack:
            q.stats_get_no_ack += n
        else:
            q.stats_get += n
            q.unacked += n
        stats = self.session.broker.stats
        stats["get"] = stats.get("get", 0) + n

    def deliver_reply(self, msg: Message) -> None:
        """A direct reply-to delivery: no queue, no ack (the consumer is no_ack by contract)."""
        self._deliver_run(self.reply_consumer, (msg,))

    def _dispatch_consumers(self) -> None:
        """Offer the channel's freed capacity to its consumers' queues, starting one further each
        time: RabbitMQ's limiter varies the order it notifies queues in, so that none is left behind."""
        queues = list(dict.fromkeys(c.queue for c in self.consumers.values()))
        if queues:
            self._turn = turn = (self._turn + 1) % len(queues)
            for q in queues[turn:] + queues[:turn]:
                if q.wants_dispatch:
                    q.dispatch()

    # -- basic.* -------------------------------------------------------------------------------------
    def _basic_qos(self, m) -> None:
        if m.prefetch_size:
            raise AMQPError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", 60, 10, hard=True)
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
            self.global_prefetch = 0  # RabbitMQ: global=false also lifts the channel (global) limit
        self.reply(B.QosOk())
        for c in list(self.consumers.values()):
            c.queue.dispatch()

    def _basic_consume(self, m) -> None:
        sess = self.session
        if m.queue == PSEUDO_QUEUE:
            tag = sess.broker.reply_to.consume(self, m.consumer_tag, m.no_ack)
            if not m.nowait:
                self.reply(B.ConsumeOk(tag))
            return
        name = self.queue_name(m.queue, 60, 20)
        if m.arguments and GROUP_ARG in m.arguments:  # a consumer group of a super stream
            q = find_group(self, m, name)
        else:
            perms.check(sess, perms.READ, "queue", name)
            q = sess.vhost.get_queue(name, sess, 60, 20)
        q.check_consume(self, m)  # the queue type's own rules, before consume-ok
        consumer = self._new_consumer(q, m.consumer_tag, m.no_ack, m.exclusive, m.arguments)
        if not m.nowait:
            self.reply(B.ConsumeOk(consumer.tag))
        q.add_consumer(consumer)
        if sess.broker.events is not None:
            sess.broker.events.consumer_created(self, consumer)

    def _new_consumer(self, queue, tag: str, no_ack: bool, exclusive: bool, arguments: dict) -> Consumer:
        if not tag:
            tag = generated("amq.ctag-")
        if tag in self.consumers:
            raise AMQPError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20, hard=True)
        desc = self.session.vhost.describe("queue", queue.name)
        if queue.consumers and (exclusive or any(c.exclusive for c in queue.consumers)):
            raise AMQPError(ACCESS_REFUSED, f"{desc} in exclusive use", 60, 20, hard=False)
        prio = (arguments or {}).get("x-priority", 0)  # present but void: 406, as RabbitMQ
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for {desc}: "
                            f'"expected integer, got {amqp_type(prio)}"', 60, 20, hard=False)
        c = Consumer(tag, self, queue, no_ack, exclusive, self.prefetch, arguments or {})
        self.consumers[tag] = c
        return c

    def _basic_cancel(self, m) -> None:
        self.cancel(m.consumer_tag)
        if not m.nowait:
            self.reply(B.CancelOk(m.consumer_tag))

    def cancel(self, tag: str) -> Consumer | None:
        if tag is not None and tag == self.reply_tag:
            self.session.broker.reply_to.cancel(self)
            return None
        c = self.consumers.pop(tag, None)
        if c is not None:
            c.active = False
            c.queue.remove_consumer(c)
            if self.session.broker.events is not None:
                self.session.broker.events.consumer_deleted(self, c)
        return c

    def consumer_cancelled_by_broker(self, c: Consumer) -> None:
        """Its queue was deleted: forget the consumer; basic.cancel if the client asked for it."""
        self.consumers.pop(c.tag, None)
        c.active = False
        sess = self.session
        if sess.conn.capabilities.get("consumer_cancel_notify") and not self.closed:
            sess.conn.send_method(self.number, B.Cancel(c.tag, nowait=True))
            sess.mark_dirty()

    def _basic_get(self, m) -> None:
        sess = self.session
        name = self.queue_name(m.queue, 60, 70)
        perms.check(sess, perms.READ, "queue", name)
        q = sess.vhost.get_queue(name, sess, 60, 70)
        guard = delivery_guard(q)
        if guard is not None and not guard():  # a cluster node that may no longer lead the queue
            q.stats_get_empty += 1
            self.reply(B.GetEmpty())
            return
        msg = q.get()
        if msg is None:
            if q.get_pending:
                # rows are being read back from the store: answer once they are here, not get-empty
                q.waiting_gets.append(lambda: self._retry_get(m))
                q.maybe_refill()
                return
            q.stats_get_empty += 1
            self.reply(B.GetEmpty())
            return
        self._deliver_run(None, (msg,), m.no_ack, q.message_count)  # get-ok

    def _retry_get(self, m) -> None:
        """A basic.get that waited for a paged queue's refill (or its purge) is answered now."""
        sess = self.session
        if sess.closed or self.closed or sess.channels.get(self.number) is not self:
            return
        try:
            self._basic_get(m)
        except AMQPError as err:
            sess.channel_error(self.number, err.for_method(60, 70))
        sess.mark_dirty()

    def _basic_recover(self, m) -> None:
        if not m.requeue:
            raise AMQPError(NOT_IMPLEMENTED, "requeue=false", 60, 110, hard=True)
        self.requeue_all()
        if isinstance(m, B.Recover):
            self.reply(B.RecoverOk())

    def requeue_all(self) -> None:
        entries = list(self.unacked.values())
        self.unacked.clear()
        self._settle(entries, 1, True)

    # -- teardown ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release everything: cancel consumers, return unacked messages to their queues in order."""
        if self.closed:
            return
        self.closed = True
        self.tx_restore()  # acks of an open transaction never happened
        # requeue first (no consumer of this channel can take them now), then cancel consumers:
        # a single-active-consumer queue hands over with the old unacked messages at the head
        self.requeue_all()
        if self.session.broker.events is not None:
            self.session.broker.events.channel_closed(self)
        for tag in list(self.consumers):
            self.cancel(tag)
        self.session.broker.reply_to.cancel(self)
        self.tx_publishes.clear()


def _unqueued(msg: Message) -> None:
    """Settling a direct reply (no queue holds it): nothing to do."""


_HANDLERS = {
    C.Flow: Channel._channel_flow,
    C.FlowOk: Channel._ignore,
    E.Declare: Channel._exchange_declare,
    E.Delete: Channel._exchange_delete,
    E.Bind: Channel._exchange_bind,
    E.Unbind: Channel._exchange_unbind,
    Q.Declare: Channel._queue_declare,
    Q.Bind: Channel._queue_bind,
    Q.Unbind: Channel._queue_unbind,
    Q.Purge: Channel._queue_purge,
    Q.Delete: Channel._queue_delete,
    B.Qos: Channel._basic_qos,
    B.Consume: Channel._basic_consume,
    B.Cancel: Channel._basic_cancel,
    B.Get: Channel._basic_get,
    B.Recover: Channel._basic_recover,
    B.RecoverAsync: Channel._basic_recover,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}
