"""Ready-message containers: a FIFO deque, and per-priority FIFOs for `x-max-priority` queues.

Both keep messages ordered by their queue sequence within a priority so a
requeued message returns to its original position.
"""

from __future__ import annotations

import bisect
from collections import deque

RUN_COUNT = 64          # messages handed to a consumer in one call at most (``take_run``)
RUN_BYTES = 64 * 1024   # ... and their bodies' bytes (the connection's output budget is checked per run)


def take_run(ready, limit: int, max_bytes: int) -> tuple[list, int]:
    """Up to ``limit`` messages from the head of ``ready``, stopping once their bodies reach
    ``max_bytes``: (the messages, their bodies' bytes)."""
    run = []
    size = 0
    popleft = ready.popleft
    for _ in range(min(len(ready), limit)):
        msg = popleft()
        run.append(msg)
        size += len(msg.body)
        if size >= max_bytes:
            break
    return run, size


class ReadyDeque(deque):
    def insert_by_seq(self, msg) -> None:
        if not self or msg.seq < self[0].seq:
            self.appendleft(msg)
        elif msg.seq > self[-1].seq:
            self.append(msg)
        else:
            keys = [m.seq for m in self]
            self.insert(bisect.bisect_left(keys, msg.seq), msg)


class PriorityReady:
    """Highest priority first; FIFO within a priority. Supports what Queue uses of a deque."""

    def __init__(self, max_priority: int) -> None:
        self.max_priority = max_priority
        self.buckets = [ReadyDeque() for _ in range(max_priority + 1)]
        self._len = 0

    def _bucket(self, msg) -> ReadyDeque:
        return self.buckets[min(msg.priority, self.max_priority)]

    def append(self, msg) -> None:
        self._bucket(msg).append(msg)
        self._len += 1

    def extend(self, msgs) -> None:
        for m in msgs:
            self.append(m)

    def insert_by_seq(self, msg) -> None:
        self._bucket(msg).insert_by_seq(msg)
        self._len += 1

    def appendleft(self, msg) -> None:
        self._bucket(msg).appendleft(msg)
        self._len += 1

    def popleft(self):
        for b in reversed(self.buckets):
            if b:
                self._len -= 1
                return b.popleft()
        raise IndexError("pop from an empty PriorityReady")

    def peek(self):
        for b in reversed(self.buckets):
            if b:
                return b[0]
        return None

    def __getitem__(self, i):
        if i == 0:
            m = self.peek()
            if m is None:
                raise IndexError(i)
            return m
        if i == -1:
            for b in self.buckets:
                if b:
                    return b[-1]
            raise IndexError(i)
        return list(self)[i]

    def clear(self) -> None:
        for b in self.buckets:
            b.clear()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self):
        for b in reversed(self.buckets):
            yield from b
