"""``amqp_load.py --consumer-process``: each consumer connection in a process of its own.

By default the producer and the consumers share one process and one event loop, so the split of
the client's time between them depends on the broker's timing. With this option each consumer
runs in a child process (multiprocessing, spawn) with its own event loop; the parent reads its
counts from shared memory, refreshed every ``POLL`` seconds (so a sample is at most that stale).
The same for both brokers. Timed runs only (``--verify`` keeps one process)."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod

from pamqp import commands

POLL = 0.005  # s between the child's updates of the shared counters


async def _consume(args, deliveries, acks, ready, stop, errors) -> None:
    from .client import Connection
    host, port, user, password, vhost, heartbeat, timeout, name, q, no_ack, prefetch, every = args
    conn = Connection(name)
    try:
        await conn.open(host, port, user, password, vhost, heartbeat, timeout)
        conn.ack_every = 0 if no_ack else every
        if not no_ack:
            await conn.rpc(commands.Basic.Qos(prefetch_count=prefetch), "Basic.QosOk")
        await conn.rpc(commands.Basic.Consume(queue=q, consumer_tag="amqp-load", no_ack=no_ack),
                       "Basic.ConsumeOk")
        ready.set()
        while not stop.is_set() and conn.error is None:
            deliveries.value = conn.deliveries
            acks.value = conn.acks_sent
            await asyncio.sleep(POLL)
        deliveries.value = conn.deliveries
        acks.value = conn.acks_sent
        if conn.error is not None:
            errors.put(str(conn.error))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        errors.put(f"{name}: {exc or type(exc).__name__}")
        ready.set()
    finally:
        try:
            await conn.close()
        except Exception:  # noqa: BLE001
            pass


def _child(args, deliveries, acks, ready, stop, errors, no_uvloop) -> None:
    from .client import run_loop
    run_loop(_consume(args, deliveries, acks, ready, stop, errors), no_uvloop)


class ConsumerProcess:
    """The parent's view of one consumer in a child process: ``deliveries``, ``acks_sent`` and
    ``error`` like a :class:`~loadgen.client.Connection`'s."""

    def __init__(self, name: str, conn_args: tuple, queue: str, no_ack: bool, prefetch: int,
                 ack_every: int, no_uvloop: bool) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self._deliveries = ctx.RawValue("q", 0)
        self._acks = ctx.RawValue("q", 0)
        self._ready = ctx.Event()
        self._stop = ctx.Event()
        self._errors = ctx.Queue()
        self.error: BaseException | None = None
        args = (*conn_args, name, queue, no_ack, prefetch, ack_every)
        self.proc = ctx.Process(target=_child, daemon=True, args=(
            args, self._deliveries, self._acks, self._ready, self._stop, self._errors, no_uvloop))

    @property
    def deliveries(self) -> int:
        self._check()
        return self._deliveries.value

    @property
    def acks_sent(self) -> int:
        return self._acks.value

    def _check(self) -> None:
        if self.error is None:
            try:
                self.error = RuntimeError(self._errors.get_nowait())
            except queue_mod.Empty:
                if self.proc.exitcode not in (None, 0):
                    self.error = RuntimeError(f"{self.name}: exited {self.proc.exitcode}")

    async def start(self, timeout: float) -> None:
        self.proc.start()
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self._ready.wait, timeout):
            raise RuntimeError(f"{self.name}: no consumer after {timeout:.0f} s")
        self._check()
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self._stop.set()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.proc.join, 10)
        if self.proc.is_alive():
            self.proc.kill()
