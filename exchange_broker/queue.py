"""Classic queue: ready messages in order, round-robin dispatch to consumers with credit."""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

from .message import Message

if TYPE_CHECKING:
    from .consumer import Consumer


FLOW_HIGH = 8000   # ready messages with starved consumers before publishers are paused
FLOW_LOW = 2000


class Queue:
    def __init__(self, vhost: str, name: str, durable: bool = False, exclusive_owner: object = None,
                 auto_delete: bool = False, arguments: dict | None = None) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.ready: deque[Message] = deque()
        self.consumers: deque[Consumer] = deque()
        self.unacked = 0
        self.next_seq = 1
        self.had_consumer = False
        self.deleted = False
        self.store_id: int | None = None  # row id in the durable store
        self.on_empty_consumers: Callable[["Queue"], None] | None = None
        self.stats_published = 0
        self.stats_delivered = 0
        self._dispatching = False
        # paging (durable queues longer than memory): ready | paged rows in SQL | held tail
        self.window = 0          # 0: never page; else max in-memory ready messages
        self.paged = 0           # committed rows in the store, not in memory, seq > page_cursor
        self.page_cursor = 0
        self.held: deque[Message] = deque()
        self.refill: Callable[["Queue"], None] | None = None
        self.refilling = False
        self.page_epoch = 0
        # credit flow: publishers whose reading is paused until this queue drains
        self.flow_blocked: set = set()

    # -- state ---------------------------------------------------------------------------------
    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.ready) + self.paged + len(self.held)

    @property
    def ready_bytes(self) -> int:
        return sum(len(m.body) for m in self.ready)

    # -- enqueue / requeue -----------------------------------------------------------------------
    def push(self, msg: Message) -> None:
        if not msg.seq:
            msg.seq = self.next_seq
            self.next_seq += 1
        msg.queue = self
        self.stats_published += 1
        if self.held or self.paged or (self.window and len(self.ready) >= self.window):
            self.held.append(msg)
            self.evict()
            return
        self.ready.append(msg)
        if self.consumers and not self._dispatching:
            self.dispatch()

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
        self.refilling = False
        if epoch != self.page_epoch or self.deleted:
            return
        if msgs:
            self.ready.extend(msgs)
            self.paged -= len(msgs)
            self.page_cursor = msgs[-1].seq
            if self.paged <= 0:
                self.paged = 0
        if self.paged == 0:
            self._unhold()
        if self.consumers:
            self.dispatch()

    def maybe_refill(self) -> None:
        if self.paged and not self.refilling and len(self.ready) < max(1, self.window // 2) \
                and self.refill is not None:
            self.refilling = True
            self.refill(self)

    def requeue(self, msgs: Iterable[Message]) -> None:
        """Put messages back in their original position (by sequence), marked redelivered."""
        ready = self.ready
        for msg in sorted(msgs, key=lambda m: m.seq, reverse=True):
            msg.redelivered = True
            if not ready or msg.seq < ready[0].seq:
                ready.appendleft(msg)
            elif msg.seq > ready[-1].seq:
                ready.append(msg)
            else:
                keys = [m.seq for m in ready]
                ready.insert(bisect.bisect_left(keys, msg.seq), msg)
        if self.consumers:
            self.dispatch()

    def purge(self) -> list[Message]:
        purged = list(self.ready)
        purged.extend(self.held)
        self.ready.clear()
        self.held.clear()
        self.paged = 0
        self.page_epoch += 1
        self.refilling = False
        return purged

    def get(self) -> Message | None:
        if not self.ready:
            self._unhold()
        msg = self.ready.popleft() if self.ready else None
        if self.paged:
            self.maybe_refill()
        return msg

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: "Consumer") -> None:
        self.had_consumer = True
        if consumer.priority and self.consumers:
            # higher x-priority first; equal priorities keep arrival order
            idx = 0
            for idx, other in enumerate(self.consumers):
                if other.priority < consumer.priority:
                    break
            else:
                idx = len(self.consumers)
            self.consumers.insert(idx, consumer)
        else:
            self.consumers.append(consumer)
        self.dispatch()

    def remove_consumer(self, consumer: "Consumer") -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if not self.consumers:
            if self.flow_blocked:
                self.release_publishers()
            if self.on_empty_consumers is not None:
                self.on_empty_consumers(self)

    def dispatch(self) -> None:
        """Deliver ready messages round-robin to consumers that have credit."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            ready = self.ready
            consumers = self.consumers
            while ready and consumers:
                n = len(consumers)
                for _ in range(n):
                    c = consumers[0]
                    consumers.rotate(-1)
                    if c.can_take():
                        break
                else:
                    return
                msg = ready.popleft()
                self.stats_delivered += 1
                c.channel.deliver(c, msg)
        finally:
            self._dispatching = False
            if self.paged:
                self.maybe_refill()
            if self.flow_blocked and len(self.ready) < FLOW_LOW:
                self.release_publishers()

    def congested(self) -> bool:
        """Backed up because consumers' connections cannot take more (not because of prefetch)."""
        if len(self.ready) <= FLOW_HIGH or not self.consumers:
            return False
        return any(not c.channel.session.writable for c in self.consumers)

    def release_publishers(self) -> None:
        blocked, self.flow_blocked = self.flow_blocked, set()
        for session in blocked:
            session.unthrottle(self)
