"""Classic queue: ready messages in order, round-robin dispatch to consumers with credit."""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

from .message import Message

if TYPE_CHECKING:
    from .consumer import Consumer


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

    # -- state ---------------------------------------------------------------------------------
    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.ready)

    @property
    def ready_bytes(self) -> int:
        return sum(len(m.body) for m in self.ready)

    # -- enqueue / requeue -----------------------------------------------------------------------
    def push(self, msg: Message) -> None:
        msg.seq = self.next_seq
        self.next_seq += 1
        msg.queue = self
        self.stats_published += 1
        self.ready.append(msg)
        if self.consumers and not self._dispatching:
            self.dispatch()

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
        self.ready.clear()
        return purged

    def get(self) -> Message | None:
        return self.ready.popleft() if self.ready else None

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
        if not self.consumers and self.on_empty_consumers is not None:
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
