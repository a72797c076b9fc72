"""Failover of a queue's leader in a leaders-mode cluster, seen by clients on another node (used by
``cluster_leaders_bench.py``).

A producer and a consumer on the survivor-to-be work a queue another node leads (their
connections handed off to that leader, the default; or, with ``--node-arg=--no-cluster-connection-handoff``,
every publish forwarded and every delivery relayed); that leader is SIGKILLed. As a real client would:

* the consumer, cancelled by the broker (consumer-cancel-notify: the relay from the dead leader is
  gone), consumes again after ``RECONSUME_DELAY``, again and again until the survivor leads the
  queue and deliveries come; it reconnects if its connection is lost;
* the producer republishes whatever the broker nacked (publishes to a queue whose leader is gone
  are nacked) after ``RETRY_DELAY``, and what was unconfirmed if its connection is lost.

The figure: seconds from the SIGKILL to the first delivery of a consumer that started after it
(so through the survivor). Then the producer stops, every publish is settled, and the run waits
until every confirmed message was consumed at least once.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from pamqp import commands

from leaders_clients import MAX_UNCONFIRMED, PREFETCH, Seen, SeqConsumer, TrackingProducer, consumed_all, \
    publish_template
from loadgen.client import AMQPError
from loadgen.wire import _U64

RECONSUME_DELAY = 0.05  # s before consuming again after a basic.cancel
RETRY_DELAY = 0.05      # s before republishing after a nack
TICK = 0.01             # s between the producer's batches


class FailoverClients:
    def __init__(self, port: int, queue: str, rate: float) -> None:
        self.port = port
        self.queue = queue
        self.per_tick = max(1, int(rate * TICK))
        self.next_seq = 1
        self.retry: deque[int] = deque()      # nacked (or lost with a connection): publish again
        self.outstanding: dict[int, int] = {}  # delivery tag -> sequence number, on self.prod
        self.next_tag = 1
        self.acked: list[int] = []
        self.nacks = 0
        self.reconnects = 0
        self.hold_until = 0.0
        self.stopping = False  # publish nothing new, only what must be republished
        self.prod: TrackingProducer | None = None
        self.cons: SeqConsumer | None = None
        self.seen = Seen()
        self.consume_count = 0
        self.killed_at: float | None = None
        self.first_after_kill: float | None = None
        self.got_first = asyncio.Event()
        self.loop = asyncio.get_running_loop()

    # -- producer ------------------------------------------------------------------------------------
    def _settled(self, prod, tags: list[int], acked: bool) -> None:
        if prod is not self.prod:
            return
        for t in tags:
            seq = self.outstanding.pop(t, None)
            if seq is None:
                continue
            if acked:
                self.acked.append(seq)
            else:
                self.nacks += 1
                self.retry.append(seq)
                self.hold_until = self.loop.time() + RETRY_DELAY

    async def _connect_producer(self) -> TrackingProducer:
        if self.prod is not None:  # lost: what it never confirmed goes again
            self.reconnects += 1
            self.retry.extend(sorted(self.outstanding.values()))
            self.outstanding.clear()
            try:
                await self.prod.close(1)
            except Exception:  # noqa: BLE001
                pass
        prod = TrackingProducer("producer", None)
        prod.on_settled = lambda tags, acked, p=prod: self._settled(p, tags, acked)
        self.prod = prod
        await prod.open("127.0.0.1", self.port, "guest", "guest", "/", 0, 10.0)
        await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        self.next_tag = 1
        return prod

    @property
    def settled(self) -> bool:
        return self.stopping and not self.retry and not self.outstanding

    async def publish(self) -> None:
        prod = await self._connect_producer()
        message, offset = publish_template(self.queue, prod.frame_max)
        while not self.settled:
            # (closing: the leader it was handed off to is gone; connection_lost comes next turn)
            if prod.error is not None or prod.transport.is_closing():
                try:
                    prod = await self._connect_producer()
                except (AMQPError, OSError, asyncio.TimeoutError):
                    await asyncio.sleep(0.1)
                    continue
            await asyncio.sleep(max(TICK, self.hold_until - self.loop.time()))
            room = MAX_UNCONFIRMED - len(self.outstanding)
            k = min(room, self.per_tick if not self.stopping else len(self.retry))
            if k <= 0 or not prod.writable.is_set() or prod.transport.is_closing():
                continue
            out = bytearray(message * k)
            at = offset
            for _ in range(k):
                if self.retry:
                    seq = self.retry.popleft()
                else:
                    seq, self.next_seq = self.next_seq, self.next_seq + 1
                _U64.pack_into(out, at, seq)
                self.outstanding[self.next_tag] = seq
                self.next_tag += 1
                at += len(message)
            prod.transport.write(out)

    # -- consumer ------------------------------------------------------------------------------------
    async def _consume(self) -> tuple[int, int, float]:
        """A new basic.consume (reconnecting when the connection is gone): the consumer's cancels
        and deliveries so far, and the time, just before it."""
        while True:
            try:
                if self.cons is None or self.cons.error is not None:
                    if self.cons is not None:
                        self.reconnects += 1
                    self.cons = SeqConsumer("consumer", self.seen)
                    self.cons.delivery_event = asyncio.Event()
                    await self.cons.open("127.0.0.1", self.port, "guest", "guest", "/", 0, 10.0)
                    await self.cons.rpc(commands.Basic.Qos(prefetch_count=PREFETCH), "Basic.QosOk")
                self.consume_count += 1
                before = self.cons.cancels, self.cons.deliveries, self.loop.time()
                await self.cons.consume(self.queue, f"c{self.consume_count}")
                return before
            except (AMQPError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(RECONSUME_DELAY)

    async def consume(self) -> None:
        cancels, base, started = await self._consume()
        while True:
            cons = self.cons
            cons.delivery_event.clear()
            try:
                await asyncio.wait_for(cons.delivery_event.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
            now = self.loop.time()
            if cons.deliveries > base and self.killed_at is not None and started > self.killed_at \
                    and self.first_after_kill is None:
                self.first_after_kill = now - self.killed_at
                self.got_first.set()
            if cons.error is not None or cons.cancels > cancels:
                await asyncio.sleep(RECONSUME_DELAY)
                cancels, base, started = await self._consume()


async def failover_run(port: int, queue: str, kill: Callable[[], None], *, rate: float, warm: float,
                       limit: float, stall: float) -> dict:
    """Clients on ``port`` (a node that does not lead ``queue``); ``kill()`` SIGKILLs the leader."""
    fc = FailoverClients(port, queue, rate)
    tasks = [asyncio.ensure_future(fc.publish()), asyncio.ensure_future(fc.consume())]
    try:
        await asyncio.sleep(warm)
        for t in tasks:
            if t.done():
                t.result()
                raise AMQPError("a failover client stopped before the SIGKILL")
        before = fc.seen.distinct
        if not before:
            raise AMQPError(f"nothing consumed in {warm} s before the SIGKILL")
        fc.killed_at = fc.loop.time()
        kill()
        try:
            await asyncio.wait_for(fc.got_first.wait(), limit)
        except asyncio.TimeoutError:
            raise AMQPError(f"no delivery through the survivor {limit} s after the SIGKILL "
                            f"(consumed {fc.seen.distinct}, nacked {fc.nacks})") from None
        await asyncio.sleep(1.0)  # publishing goes on through the new leader
        fc.stopping = True
        deadline = fc.loop.time() + stall
        while not fc.settled:
            if tasks[0].done():
                tasks[0].result()
            if fc.loop.time() > deadline:
                raise AMQPError(f"publishes not settled {stall} s after stopping "
                                f"({len(fc.outstanding)} unconfirmed, {len(fc.retry)} to republish)")
            await asyncio.sleep(0.02)
        missing = await consumed_all(fc.cons, sorted(fc.acked), stall)
        return {"failover_s": round(fc.first_after_kill, 3), "published": fc.next_seq - 1,
                "confirmed": len(fc.acked), "nacked_and_republished": fc.nacks,
                "consumed_before_kill": before, "consumed": fc.seen.distinct,
                "redelivered": fc.seen.repeats, "consumes": fc.consume_count, "reconnects": fc.reconnects,
                "missing": len(missing), "missing_first": missing[:10]}
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in (fc.prod, fc.cons):
            if c is not None:
                try:
                    await c.close(1)
                except Exception:  # noqa: BLE001
                    pass
