"""The loop every mover runs between two open channels: consume from a source queue, publish
each message to the destination, settle it at the source as ``ack-mode`` says.

``on-confirm`` acks at the source only once the destination confirmed (at least once: nothing is
lost when either end goes away); ``on-publish`` acks once published; ``no-ack`` consumes without
acks. ``properties(delivery)`` gives the raw properties to publish, or None to drop the message
(acked, not published: a federation link's hop limit); ``target(delivery)`` the exchange and
routing key. :meth:`Forwarding.run` returns once ``limit`` messages moved and raises what ended it
otherwise; cancelled, it stops consuming and waits for the last confirms (a planned stop sends
nothing twice).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from exchange_broker.movers.amqp import Delivery, LinkError

DRAIN_TIMEOUT = 5.0  # seconds a stopping mover waits for its last confirms


def _set_failed(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # retrieved: a future nobody awaits any more is not reported


class Forwarding:
    def __init__(self, ack_mode: str, prefetch: int) -> None:
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.forwarded = 0  # moved (confirmed, or published without confirms) since the mover began
        self.dropped = 0    # acked at the source without publishing (properties() gave None)
        self.pending = 0    # published, waiting for the destination's confirm
        self.src_ch = None
        self.queue = ""
        self.tag = ""
        self._done: asyncio.Future | None = None
        self._on_delivery = self._on_cancel = None
        self._prefetch_now = prefetch

    async def run(self, src, dest, src_ch, dest_ch, queue: str, *, target: Callable, properties: Callable,
                  on_running: Callable[[], None], limit: int | None = None, consume: bool = True) -> None:
        confirming = self.ack_mode == "on-confirm"
        if confirming:
            await dest_ch.confirm_select()
        done = self._done = asyncio.get_running_loop().create_future()
        src.on_lost.append(lambda exc: _set_failed(done, exc))
        dest.on_lost.append(lambda exc: _set_failed(done, exc))
        taken = 0  # deliveries handled in this run (no more than ``limit``)

        start = self.forwarded

        def moved() -> None:
            self.forwarded += 1
            if limit is not None and self.forwarded - start >= limit and not done.done():
                done.set_result(None)

        def settled(fut: asyncio.Future, tag: int) -> None:
            if fut.cancelled() or fut.exception() is not None:
                _set_failed(done, fut.exception() or LinkError("publish cancelled"))
                return
            self.pending -= 1
            try:
                if fut.result():
                    src_ch.ack(tag)
                    moved()
                else:
                    src_ch.nack(tag, requeue=True)
            except LinkError as exc:
                _set_failed(done, exc)

        def on_delivery(d: Delivery) -> None:
            nonlocal taken
            if done.done() or (limit is not None and taken >= limit):
                return  # neither published nor acked: the source has it again once we close
            taken += 1
            try:
                props = properties(d)
                if props is None:
                    self.dropped += 1
                    if self.ack_mode != "no-ack":
                        src_ch.ack(d.delivery_tag)
                    return
                exchange, key = target(d)
                fut = dest_ch.publish(exchange, key, props, d.body)
                if confirming:
                    self.pending += 1
                    fut.add_done_callback(lambda f, tag=d.delivery_tag: settled(f, tag))
                    return
                if self.ack_mode == "on-publish":
                    src_ch.ack(d.delivery_tag)
            except LinkError as exc:
                _set_failed(done, exc)
                return
            moved()

        def on_cancel(_tag: str, error) -> None:
            _set_failed(done, error or LinkError("the source cancelled the consumer (its queue was deleted?)"))

        self.src_ch, self.queue, self.tag = src_ch, queue, ""
        self._on_delivery, self._on_cancel = on_delivery, on_cancel
        self._prefetch_now = self.prefetch if limit is None else max(1, min(self.prefetch or limit, limit))
        if consume:
            await self.resume()
        on_running()
        try:
            # shielded: cancelling this task must not cancel ``done`` (the drain below waits for the
            # last confirms only while ``done`` is not done, i.e. both ends are still there)
            await asyncio.shield(done)  # raises the failure; returns once ``limit`` is reached
        except asyncio.CancelledError:  # stopped (deleted, restarted, broker shutting down)
            await self._drain(done)
            raise
        finally:
            self.pending, self.tag, self.src_ch = 0, "", None

    async def resume(self) -> None:
        """Consume (again) from the source queue."""
        if not self.tag and self.src_ch is not None:
            self.tag = "pending"
            try:
                self.tag = await self.src_ch.consume(self.queue, self._on_delivery, prefetch=self._prefetch_now,
                                                     no_ack=self.ack_mode == "no-ack", on_cancel=self._on_cancel)
            except BaseException:
                self.tag = ""
                raise

    async def pause(self) -> None:
        """Stop consuming (what was delivered is still published and settled)."""
        tag, self.tag = self.tag, ""
        if tag and tag != "pending":
            await self.src_ch.cancel(tag)

    async def _drain(self, done: asyncio.Future) -> None:
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await self.pause()
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while self.pending > 0 and not done.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        except (LinkError, asyncio.TimeoutError):
            pass

    def fail(self, exc: BaseException) -> None:
        """End the current run with ``exc`` (the mover's own checks)."""
        if self._done is not None:
            _set_failed(self._done, exc)
