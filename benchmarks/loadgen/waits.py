"""Waiting for a benchmark's publishes to be confirmed and its messages to be read, with a stall
guard (a broker that stops answering fails the run with a one-line reason, it does not hang)."""

from __future__ import annotations

import asyncio
from typing import Callable

from loadgen.client import AMQPError, Connection

STALL_SECONDS = 60.0


async def confirmed(prod: Connection, count: int, label: str) -> None:
    """Until ``count`` publishes of ``prod`` are confirmed (or nacked)."""
    while prod.confirmed + prod.nacked < count:
        if prod.error is not None:
            raise prod.error
        prod.confirm_event.clear()
        try:
            await asyncio.wait_for(prod.confirm_event.wait(), STALL_SECONDS)
        except asyncio.TimeoutError:
            raise AMQPError(f"{label}: confirms stalled at {prod.confirmed}") from None


async def read(consumers: list[Connection], done: Callable[[], bool], label: str,
               tick: Callable[[float], None] = lambda now: None) -> None:
    """Until ``done()``, checking the consumers every 10 ms (``tick(now)`` each time)."""
    loop = asyncio.get_running_loop()
    last_progress, last_total = loop.time(), -1
    while not done():
        await asyncio.sleep(0.01)
        now = loop.time()
        for c in consumers:
            if c.error is not None:
                raise c.error
        tick(now)
        total = sum(c.deliveries for c in consumers)
        if total != last_total:
            last_total, last_progress = total, now
        elif now - last_progress > STALL_SECONDS:
            raise AMQPError(f"{label}: consumers stalled at {[c.deliveries for c in consumers]}")
