"""Classic queue: ready messages in order, dispatch to consumers with credit, and RabbitMQ's
queue arguments (TTL, length limits, dead-lettering, priorities, single active consumer, dedup).

Durable queues longer than memory page: ``ready`` (in memory) | ``paged`` rows only in SQL |
``held`` tail in memory. Only committed rows are ever paged, so a failed write loses nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

from exchange_broker.queue_types import pacing as flow
from exchange_broker.core.actions import Block
from exchange_broker.core.message import Message
from exchange_broker.core.names import describe
from exchange_broker.core.ports import Consumer
from exchange_broker.core.queue import QueueType
from exchange_broker.core.queue_args import QueueOptions, parse_queue_arguments
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.dedup import deduplication_key, is_duplicate, remember
from exchange_broker.queue_types.ready import RUN_BYTES, RUN_COUNT, PriorityReady, ReadyDeque, take_run

DEDUP_DEFAULT_SIZE = 100_000


class ClassicQueue(QueueType):
    queue_type = "classic"
    pages_to_store = True
    stores_all = False  # True: transient messages are stored too (quorum queues)

    def __init__(self, broker, vhost: str, name: str, durable: bool = False,
                 exclusive_owner: object = None, auto_delete: bool = False,
                 arguments: dict | None = None, options: QueueOptions | None = None) -> None:
        super().__init__(broker, vhost, name, durable, exclusive_owner, auto_delete, arguments,
                         options)
        opts = self.options
        self.ready = PriorityReady(opts.max_priority) if opts.max_priority else ReadyDeque()
        self.consumers: "ReadyDeque[Consumer]" = ReadyDeque()
        self.consumer_priorities = False
        self._dispatching = False
        self.dispatch_queued = False  # waiting in broker.dispatch_later
        self.pacer: flow.Pacer | None = None  # publisher pacing (queue_types/pacing.py)
        # TTL / expiry timers
        self.has_ttl = opts.message_ttl is not None
        self._expiry_at: float | None = None
        self._expiry_handle = None
        self._expires_handle = None
        self.dedup: OrderedDict | None = OrderedDict() if opts.deduplication else None
        # paging (durable queues longer than memory)
        self.window = 0          # 0: never page; else max in-memory ready messages
        self.page_window = 0     # the window the store gave (durability.attach)
        self.paged = 0           # committed rows in the store, not in memory, seq > page_cursor
        self.page_cursor = 0
        self.held: ReadyDeque = ReadyDeque()
        self.refill: Callable[["ClassicQueue"], None] | None = None
        self.refilling = False
        self.page_epoch = 0

    @classmethod
    def declare(cls, broker, vhost, name: str, durable: bool, owner, auto_delete: bool,
                arguments: dict) -> "ClassicQueue":
        options = parse_queue_arguments(arguments, vhost.describe("queue", name))
        return cls(broker, vhost.name, name, durable, owner, auto_delete, arguments, options)

    # -- state ---------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return len(self.ready) + self.paged + len(self.held)

    @property
    def wants_dispatch(self) -> bool:
        return bool(self.ready) and not self.deleted

    @property
    def get_pending(self) -> bool:
        return bool(self.paged) and self.refill is not None

    @property
    def pageable(self) -> bool:
        """Paging keeps FIFO order by sequence; priority and length-limited queues stay in memory
        (a length limit already bounds them)."""
        return not (self.options.max_priority or self.options.limited)

    # -- publishing ----------------------------------------------------------------------------------
    def enqueue(self, m: Message, publisher, per_message_ttl: int | None):
        opts = self.options
        if (self.dedup is not None or per_message_ttl is not None or opts.message_ttl is not None
                or opts.max_length is not None or opts.max_length_bytes is not None) \
                and not self.admit(m, per_message_ttl):  # admit has nothing to do otherwise
            return None
        m.seq = self.next_seq
        self.next_seq += 1
        m.queue = self
        waiter = None
        if (m.persistent or self.stores_all) and self.durable and self.store_id is not None:
            waiter = self.broker.durability.append(self, m)
        self.push(m)
        if publisher is not None and not m.seq & flow.CHECK_MASK and len(self.ready) > flow.LOW:
            verdict = flow.look(self, publisher, len(self.ready))
            if verdict:  # the publishing channel stops reading its connection (if it may be paced)
                return Block(self, waiter, verdict == flow.PACED)
        return waiter

    def admit(self, msg: Message, per_message_ttl: int | None) -> bool:
        """Stamp TTL, apply deduplication and reject-publish overflow. False: not enqueued here
        (``msg.rejected`` tells whether the publisher must be nacked)."""
        opts = self.options
        dedup_key = deduplication_key(msg) if self.dedup is not None else None
        if dedup_key is not None and is_duplicate(self.dedup, dedup_key, self.broker.now_ms()):
            return False
        ttl = opts.message_ttl
        if per_message_ttl is not None:
            ttl = per_message_ttl if ttl is None else min(ttl, per_message_ttl)
        if ttl is not None:
            msg.expires_ms = self.broker.now_ms() + ttl
            self.has_ttl = True
        if (opts.max_length is not None or opts.max_length_bytes is not None) and \
                opts.overflow != "drop-head":  # opts.limited, inlined (per publish)
            if (opts.max_length is not None and self.message_count >= opts.max_length) or \
                    (opts.max_length_bytes is not None and self.bytes + len(msg.body) > opts.max_length_bytes):
                msg.rejected = True
                if opts.overflow == "reject-publish-dlx":
                    msg.queue = self
                    self.broker.dead_letter(self, msg, "maxlen", settle=False)
                return False  # refused: not remembered, so the producer's retry is not a duplicate
        if dedup_key is not None:
            remember(self.dedup, dedup_key, self.broker.now_ms(), self.options.dedup_cache_ttl,
                     self.options.dedup_cache_size or DEDUP_DEFAULT_SIZE)
        return True

    # -- enqueue / requeue -----------------------------------------------------------------------
    def push(self, msg: Message) -> None:
        if not msg.seq:
            msg.seq = self.next_seq
            self.next_seq += 1
        msg.queue = self
        self.stats_published += 1
        self.bytes += len(msg.body)
        if self.held or self.paged or (self.window and len(self.ready) >= self.window):
            self.held.append(msg)
            self.evict()
            return
        self.ready.append(msg)
        opts = self.options
        if (opts.max_length is not None or opts.max_length_bytes is not None) and \
                opts.overflow == "drop-head":  # opts.limited, inlined (per publish)
            self._drop_over_limit()
        if self.consumers and not self._dispatching:
            later = self.broker.dispatch_later
            # expired on arrival (TTL 0): still to a consumer that can take it now (RabbitMQ's deliver_or_enqueue)
            if msg.expires_ms is not None and msg.expires_ms <= self.broker.now_ms():
                self.dispatch(msg)
            elif later is None:
                self.dispatch()
            elif not self.dispatch_queued:
                self.dispatch_queued = True
                later.append(self)
        if msg.expires_ms is not None and self.ready:
            self._expire_head()
            self._arm_expiry()

    def _drop_over_limit(self) -> None:
        opts = self.options
        while self.ready and (
                (opts.max_length is not None and self.message_count > opts.max_length) or
                (opts.max_length_bytes is not None and self.bytes > opts.max_length_bytes)):
            self._discard(self.ready.popleft(), "maxlen")

    def _discard(self, msg: Message, reason: str) -> None:
        """A ready message leaves without delivery: expired or dropped by a length limit."""
        self.bytes -= len(msg.body)
        self.broker.dead_letter(self, msg, reason)

    def requeue(self, msgs: Iterable[Message]) -> None:
        """Put messages back in their original position (by sequence), marked redelivered; over a
        drop-head length limit, the head goes (RabbitMQ's requeue_and_run: maybe_drop_head)."""
        ready = self.ready
        for msg in sorted(msgs, key=lambda m: m.seq, reverse=True):
            msg.redelivered = True
            self.bytes += len(msg.body)
            ready.insert_by_seq(msg)
        if self.options.limited and self.options.overflow == "drop-head":
            self._drop_over_limit()
        if self.consumers:
            self.dispatch()
        if self.has_ttl:
            self._expire_head()
            self._arm_expiry()

    def purge(self) -> list[Message]:
        purged = list(self.ready)
        purged.extend(self.held)
        self.ready.clear()
        self.held.clear()
        self.paged = 0
        self.bytes = 0
        self.page_epoch += 1
        self.refilling = False
        if self.waiting_gets:
            self.broker.call_later(0, self.answer_waiting_gets)  # now empty: get-empty for them
        return purged

    def get(self) -> Message | None:
        self.touch()
        if not self.ready:
            self._unhold()
        if self.has_ttl:
            self._expire_head()
        msg = self.ready.popleft() if self.ready else None
        if msg is not None:
            self.bytes -= len(msg.body)
        if self.paged:
            self.maybe_refill()
        return msg

    # -- TTL -----------------------------------------------------------------------------------------
    def _expire_head(self, arriving: Message | None = None) -> None:
        """Expired messages at the head are dead-lettered, never delivered (RabbitMQ expires at the head);
        not ``arriving`` (see ``dispatch``)."""
        ready = self.ready
        if not ready:
            return
        now = self.broker.now_ms()
        while ready:
            head = ready[0]
            exp = head.expires_ms
            if exp is None or exp > now or head is arriving:
                break
            self._discard(ready.popleft(), "expired")

    def _arm_expiry(self) -> None:
        if not self.ready or self.deleted:
            return
        exp = self.ready[0].expires_ms
        if exp is None:
            return
        at = exp / 1000.0
        if self._expiry_at is not None and self._expiry_at <= at:
            return
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
        self._expiry_handle = self.broker.call_later(max(0.0, at - self.broker.clock.wall()),
                                                       self._expiry_fired)
        self._expiry_at = at if self._expiry_handle is not None else None  # None: no timer (no loop)

    def _expiry_fired(self) -> None:
        self._expiry_handle = self._expiry_at = None
        if self.deleted:
            return
        self._expire_head()
        self._arm_expiry()

    # -- x-expires (unused queue deletion) -----------------------------------------------------------
    def touch(self) -> None:
        """Declared, consumed from or polled: restart the x-expires countdown."""
        expires = self.options.expires
        if expires is None or self.deleted:
            return
        if self._expires_handle is not None:
            self._expires_handle.cancel()
            self._expires_handle = None
        if not self.consumers:
            self._expires_handle = self.broker.call_later(expires / 1000.0, self._expires_fired)

    def _expires_fired(self) -> None:
        self._expires_handle = None
        if not self.deleted and not self.consumers:
            self.broker.expire_queue(self)

    def cancel_timers(self) -> None:
        for h in (self._expiry_handle, self._expires_handle):
            if h is not None:
                h.cancel()
        self._expiry_handle = self._expires_handle = None
        if self.pacer is not None:
            self.pacer.cancel()

    def on_deleted(self) -> None:
        self.ready.clear()

    # -- paging ----------------------------------------------------------------------------------
    def evict(self) -> None:
        """Move committed persistent messages from the head of ``held`` into the paged region."""
        held = self.held
        if self.paged == 0 and len(self.ready) < self.window // 2:
            self._unhold()
            return
        while held:
            st = held[0].stored
            if st is True or (st and st.done and st.ok):
                msg = held.popleft()
                if self.paged == 0:
                    self.page_cursor = msg.seq - 1
                self.paged += 1
            else:
                break

    def _unhold(self) -> None:
        """No paged rows left: the held tail joins ready."""
        if self.held and self.paged == 0:
            self.ready.extend(self.held)
            self.held.clear()
            if self.consumers:
                self.dispatch()

    def refilled(self, msgs: list, epoch: int) -> None:
        """Rows read back from the store (seq > page_cursor, ascending)."""
        try:
            self._refilled(msgs, epoch)
        finally:
            self.answer_waiting_gets()

    def _refilled(self, msgs: list, epoch: int) -> None:
        self.refilling = False
        if epoch != self.page_epoch or self.deleted:
            return
        if msgs:
            self.ready.extend(msgs)
            if not self.has_ttl and any(m.expires_ms is not None for m in msgs):
                self.has_ttl = True
            self.paged -= len(msgs)
            self.page_cursor = msgs[-1].seq
            if self.paged <= 0:
                self.paged = 0
        if self.paged == 0:
            self._unhold()
        if self.has_ttl:
            self._expire_head()
            self._arm_expiry()
        if self.consumers:
            self.dispatch()

    def maybe_refill(self) -> None:
        if self.paged and not self.refilling and len(self.ready) < max(1, self.window // 2) \
                and self.refill is not None:
            self.refilling = True
            self.refill(self)

    # -- consumers -----------------------------------------------------------------------------
    rabbit_type = "rabbit_classic_queue"  # RabbitMQ's name for this type, in its error texts

    def check_consume(self, channel, method) -> None:
        """A stream's consumer argument on this type is refused, as RabbitMQ does (406)."""
        if method.arguments and "x-stream-offset" in method.arguments:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for "
                            f"{describe('queue', self.name, self.vhost)} of queue type "
                            f"{self.rabbit_type}", 60, 20, hard=False)

    def add_consumer(self, consumer: Consumer) -> None:
        self.had_consumer = True
        if self._expires_handle is not None:
            self._expires_handle.cancel()
            self._expires_handle = None
        if consumer.priority or self.consumer_priorities:
            self.consumer_priorities = True
            # sorted by x-priority, highest first; equal priorities keep arrival order
            idx = len(self.consumers)
            for i, other in enumerate(self.consumers):
                if other.priority < consumer.priority:
                    idx = i
                    break
            self.consumers.insert(idx, consumer)
        else:
            self.consumers.append(consumer)
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.options.single_active_consumer and self.consumers and self.ready:
            self.dispatch()  # the next consumer in line takes over
        if not self.consumers:
            if self.flow_blocked:
                self.release_publishers()
            self.touch()
            if self.on_empty_consumers is not None:
                self.on_empty_consumers(self)

    @property
    def active_consumer(self) -> Consumer | None:
        """With x-single-active-consumer, the one consumer that receives messages."""
        return self.consumers[0] if self.consumers else None

    def _pick(self) -> Consumer | None:
        consumers = self.consumers
        if len(consumers) == 1:  # single active consumer or not, priorities or not
            c = consumers[0]
            return c if c.can_take() else None
        if self.options.single_active_consumer:
            c = consumers[0]
            return c if c.can_take() else None
        if self.consumer_priorities:
            for i, c in enumerate(consumers):
                if c.can_take():
                    # round-robin within its priority: move behind its equals
                    j = i + 1
                    while j < len(consumers) and consumers[j].priority == c.priority:
                        j += 1
                    if j - 1 > i:
                        del consumers[i]
                        consumers.insert(j - 1, c)
                    return c
            return None
        for _ in range(len(consumers)):
            c = consumers[0]
            consumers.rotate(-1)
            if c.can_take():
                return c
        return None

    def dispatch(self, arriving: Message | None = None) -> None:
        """Deliver ready messages to consumers that have credit; ``arriving``, the message being
        pushed, is delivered even if its TTL is over (a TTL of 0)."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            ready = self.ready
            consumers = self.consumers
            if self.has_ttl:
                self._expire_head(arriving)
            while ready and consumers:
                if len(consumers) == 1:  # _pick, inlined for the usual case
                    c = consumers[0]
                    if not c.can_take():
                        break
                    if not self.has_ttl and c.deliver_run is not None:  # a run at once
                        self._deliver_run(c, ready)
                        continue
                else:
                    c = self._pick()
                    if c is None:
                        break
                msg = ready.popleft()
                if msg.expires_ms is not None and msg.expires_ms <= self.broker.now_ms() and msg is not arriving:
                    self._discard(msg, "expired")
                    continue
                self.bytes -= len(msg.body)
                self.stats_delivered += 1
                c.deliver(msg)
        finally:
            self._dispatching = False
            if self.paged:
                self.maybe_refill()
            if self.flow_blocked and len(self.ready) < flow.LOW:
                self.release_publishers()
        if self.has_ttl:
            self._arm_expiry()

    def _deliver_run(self, c: Consumer, ready) -> None:
        run, size = take_run(ready, min(RUN_COUNT, c.room()), RUN_BYTES)
        self.bytes -= size
        self.stats_delivered += len(run)
        c.deliver_run(run)

    def congested(self) -> bool:
        """Backed up because consumers' connections cannot take more (not because of prefetch)."""
        if len(self.ready) <= flow.HIGH or not self.consumers:
            return False
        return any(c.blocked_by_socket() for c in self.consumers)

    # -- policies --------------------------------------------------------------------------------------
    def apply_policy(self, effective: dict, policy: str | None = None,
                     operator_policy: str | None = None) -> None:
        """New limits apply at once (drop-head trims, TTL re-armed for what arrives from now on,
        x-expires restarted); a priority queue keeps its priorities (not a policy key)."""
        super().apply_policy(effective, policy, operator_policy)
        opts = parse_queue_arguments(effective, f"queue '{self.name}' in vhost '{self.vhost}'")
        opts.max_priority = self.options.max_priority
        self.options = opts
        if self.refill is not None:  # paging to the store: only without a length limit
            self.window = self.page_window if self.pageable else 0
        if opts.message_ttl is not None:
            self.has_ttl = True
        if opts.deduplication and self.dedup is None:
            self.dedup = OrderedDict()
        if opts.limited and opts.overflow == "drop-head":
            self._drop_over_limit()
        if self.has_ttl:
            self._expire_head()
            self._arm_expiry()
        self.touch()

    # -- recovery ------------------------------------------------------------------------------------
    def restore(self, durability, row: dict, window: int) -> bool:
        self.next_seq = (row["max_seq"] or 0) + 1
        self.paged = row["message_count"] or 0
        self.page_cursor = (row["min_seq"] or 1) - 1
        if self.paged:
            self.bytes = durability.store.queue_stats(self.store_id)[1]
        durability.attach(self, window)
        return bool(self.paged)
