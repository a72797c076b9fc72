"""The event loop as the broker's clock (``core.clock.Clock``): timers and deferred calls."""

from __future__ import annotations

import asyncio
import time


class LoopClock:
    """``call_later(delay_s, fn, *args)``, ``call_soon(fn, *args)`` (both return the loop's
    cancellable handle), ``time()`` (the loop's monotonic time, the base of its timers) and
    ``wall()`` (the system's wall clock, seconds since the epoch).

    The loop's own bound methods are used directly: ``call_soon`` is on the publish path."""

    __slots__ = ("loop", "call_later", "call_soon", "time", "wall")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.call_later = loop.call_later
        self.call_soon = loop.call_soon
        self.time = loop.time
        self.wall = time.time

    def __repr__(self) -> str:
        return f"LoopClock({self.loop!r})"
