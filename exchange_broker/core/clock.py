"""The core's clock: timers without an event loop in sight.

The core never imports asyncio. It is given a :class:`Clock` at construction; the server gives it
one over its event loop (``server/clock.py``), tests may drive a :class:`ManualClock` by hand, and a
broker built with no clock (:class:`NoClock`) simply has no timers: TTL expiry, ``x-expires`` and the
delayed exchange then act only when something else touches them, as the in-process broker always did.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Protocol


class Handle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def call_later(self, delay: float, fn: Callable, *args) -> Handle | None:
        """Run ``fn(*args)`` after ``delay`` seconds; None when this clock has no timers."""

    def call_soon(self, fn: Callable, *args) -> Handle | None:
        """Run ``fn(*args)`` once the current event has been handled."""

    def time(self) -> float:
        """Monotonic seconds: the base ``call_later`` counts from."""

    def wall(self) -> float:
        """Wall-clock seconds since the epoch: what is stored or shown (message timestamps, TTL
        deadlines, delayed messages' due times). It advances with ``time()``."""


class NoClock:
    """No timers at all (nothing is ever called back); the system's wall clock."""

    wall = staticmethod(time.time)

    def call_later(self, delay: float, fn: Callable, *args) -> None:
        return None

    def call_soon(self, fn: Callable, *args) -> None:
        return None

    def time(self) -> float:
        return 0.0


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock a test advances by hand: ``advance(seconds)`` runs what fell due, in order.

    Both of its times move only with ``advance``: ``time()`` from ``start``, ``wall()`` from
    ``wall_start`` (a fixed date by default, 2023-11-14, so that tests are repeatable)."""

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.wall_offset = wall_start - start
        self._heap: list = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_offset

    def call_later(self, delay: float, fn: Callable, *args) -> _ManualHandle:
        handle = _ManualHandle()
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._order), handle, fn, args))
        return handle

    def call_soon(self, fn: Callable, *args) -> _ManualHandle:
        return self.call_later(0.0, fn, *args)

    def advance(self, seconds: float = 0.0) -> int:
        """Move time forward and run every callback due by then; returns how many ran."""
        until = self.now + seconds
        ran = 0
        while self._heap and self._heap[0][0] <= until:
            at, _, handle, fn, args = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            if not handle.cancelled:
                fn(*args)
                ran += 1
        self.now = until
        return ran
