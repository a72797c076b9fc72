"""Acknowledgements of deliveries (basic.ack, basic.nack, basic.reject), a part of :class:`Channel`.

An acknowledgement takes the entries it covers out of the channel's ``unacked`` (RabbitMQ's rules
for ``multiple`` and unknown tags), then settles them: the channel's, consumers' and queues'
counters move, and each queue is told (``settle``, ``reject`` or ``requeue``). Inside a
transaction they are taken at once and settled at commit (connection/transactions.py)."""

from __future__ import annotations

from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError


class AckMethods:
    """basic.ack/nack/reject for :class:`~exchange_broker.connection.channel.Channel`."""

    def ack(self, kind: int, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        """basic.ack (kind 0), basic.nack (1), basic.reject (2)."""
        if self.released:  # deliveries a consumer timeout took back (connection/timeouts.py)
            delivery_tag = self._forget_released(delivery_tag, multiple)
            if delivery_tag is None:
                return
        if kind:  # the queue type may refuse a nack/reject (a stream: 540)
            for msg, _consumer in self._covered(delivery_tag, multiple):
                if msg.queue is not None:
                    msg.queue.check_reject(kind)
        if self.tx:  # taken now (a second ack of the tag is 406), settled at tx.commit
            self.tx_acks.append((kind, self._take(delivery_tag, multiple, kind, tagged=True), requeue))
            return
        self._settle(self._take(delivery_tag, multiple, kind), kind, requeue)

    def _covered(self, delivery_tag: int, multiple: bool) -> list:
        """The outstanding entries an acknowledgement names (without taking them)."""
        unacked = self.unacked
        if not multiple:
            entry = unacked.get(delivery_tag)
            return [entry] if entry is not None else []
        out = []
        for tag, entry in unacked.items():
            if delivery_tag and tag > delivery_tag:
                break
            out.append(entry)
        return out

    def _take(self, delivery_tag: int, multiple: bool, kind: int, tagged: bool = False) -> list:
        """Remove and return the (msg, consumer) entries an ack/nack/reject covers (RabbitMQ's rule:
        multiple with tag 0 means everything outstanding; otherwise the tag must be outstanding).
        ``tagged``: (tag, entry) pairs."""
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                taken = list(unacked.items() if tagged else unacked.values())
                unacked.clear()
                return taken
            if delivery_tag not in unacked:
                raise self._unknown_tag(delivery_tag, kind)
            taken = []
            while True:
                tag, entry = unacked.popitem(last=False)
                taken.append((tag, entry) if tagged else entry)
                if tag == delivery_tag:
                    return taken
        entry = unacked.pop(delivery_tag, None)
        if entry is None:
            raise self._unknown_tag(delivery_tag, kind)
        return [(delivery_tag, entry) if tagged else entry]

    def _unknown_tag(self, tag: int, kind: int) -> AMQPError:
        method = (80, 120, 90)[kind]
        return AMQPError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method, hard=False)

    def _settle(self, entries: list, kind: int, requeue: bool) -> None:
        """Apply acks (kind 0) or nack/reject (1/2) to taken entries."""
        if not entries:
            return
        touched: set = set()
        if kind == 0:  # acks: the counters moved once per stretch of one queue and consumer
            n = len(entries)
            self.stats_acked += n
            self.session.broker.stats["ack"] += n
            q = consumer = None
            count = 0
            stretches = []  # (queue, consumer, count): counters first, as a queue's settle may
            for msg, by in entries:  # deliver again (a relay) and so count what is unacked
                if msg.queue is not q or by is not consumer:
                    if count:
                        stretches.append((q, consumer, count))
                    q, consumer, count = msg.queue, by, 0
                count += 1
            stretches.append((q, consumer, count))
            for q, consumer, count in stretches:
                q.stats_ack += count
                self._settled(q, consumer, count, touched)
            q = None
            for msg, _by in entries:
                if msg.queue is not q:
                    q = msg.queue
                    settle = q.settle
                settle(msg)
        else:
            to_requeue: dict = {}
            for msg, consumer in entries:
                q = msg.queue
                self._settled(q, consumer, 1, touched)
                if requeue:
                    if not q.deleted:
                        to_requeue.setdefault(q, []).append(msg)
                else:
                    q.reject(msg)
            for q, msgs in to_requeue.items():
                q.requeue(msgs)
        if self.global_prefetch:  # the channel's freed capacity goes to its queues in turn
            self._dispatch_consumers()
            return
        for q in touched:
            if q.wants_dispatch:
                q.dispatch()

    def _settled(self, q, consumer, n: int, touched: set) -> None:
        """``n`` deliveries of ``q`` (to ``consumer``, or None: a basic.get) no longer unacked."""
        q.unacked -= n
        if consumer is not None:
            consumer.unacked -= n
            self.global_unacked -= n
            touched.add(consumer.queue)
