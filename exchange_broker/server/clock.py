"""The event loop as the broker's clock (``core.clock.Clock``): timers and deferred calls."""

from __future__ import annotations

import asyncio


class LoopClock:
    """``call_later(delay_s, fn, *args)``, ``call_soon(fn, *args)`` (both return the loop's
    cancellable handle) and ``time()`` (the loop's monotonic time, the base of its timers).

    The loop's own bound methods are used directly: ``call_soon`` is on the publish path."""

    __slots__ = ("loop", "call_later", "call_soon", "time")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.call_later = loop.call_later
        self.call_soon = loop.call_soon
        self.time = loop.time

    def __repr__(self) -> str:
        return f"LoopClock({self.loop!r})"
