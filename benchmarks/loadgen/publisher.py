"""The publisher loop: pre-encoded publishes written in batches, within TCP back-pressure,
the confirm window, an optional rate and an optional backlog limit."""
from __future__ import annotations

import asyncio

from .client import Connection
from .wire import _U64


class Publisher:
    def __init__(self, conn: Connection, message: bytes, batch: int,
                 window: int = 0, limit: int = 0, seq_offset: int = -1,
                 rate: float = 0.0, consumer: Connection | None = None,
                 max_backlog: int = 0):
        if rate:
            # keep writes ~10 ms apart at the target rate
            batch = max(1, min(batch, int(rate / 100)))
        self.rate = rate
        self.consumer = consumer
        self.max_backlog = max_backlog
        if max_backlog and consumer is not None:
            consumer.delivery_event = asyncio.Event()
        self.conn = conn
        self.message = message
        self.batch = batch
        self.batch_bytes = message * batch
        self.window = window          # max unconfirmed (0 = unlimited)
        self.limit = limit            # total messages to publish (0 = forever)
        self.seq_offset = seq_offset  # where to stamp the sequence (verify)
        self.published = 0
        self.stopped = False

    def _chunk(self, k: int) -> bytes:
        if self.seq_offset < 0:
            return self.batch_bytes if k == self.batch else self.message * k
        out = bytearray(self.message * k)
        step = len(self.message)
        off = self.seq_offset
        seq = self.published
        pack_into = _U64.pack_into
        for i in range(k):
            seq += 1
            pack_into(out, off, seq)
            off += step
        return out

    async def run(self) -> None:
        conn = self.conn
        transport = conn.transport
        writable = conn.writable
        confirm_event = conn.confirm_event
        window = self.window
        limit = self.limit
        sleep = asyncio.sleep
        rate = self.rate
        loop = asyncio.get_running_loop()
        t_start = loop.time()
        max_backlog = self.max_backlog
        consumer = self.consumer
        while not self.stopped and conn.error is None:
            if max_backlog:
                room = max_backlog - (self.published - consumer.deliveries)
                if room <= 0:
                    consumer.delivery_event.clear()
                    await consumer.delivery_event.wait()
                    continue
            if rate:
                ahead = t_start + self.published / rate - loop.time()
                if ahead > 0:
                    await sleep(ahead)
                    continue
            if not writable.is_set():
                await writable.wait()
                continue
            k = self.batch
            if limit:
                k = min(k, limit - self.published)
                if k <= 0:
                    return
            if window:
                room = window - (self.published - conn.confirmed - conn.nacked)
                if room <= 0:
                    confirm_event.clear()
                    await confirm_event.wait()
                    continue
                k = min(k, room)
            if max_backlog:
                k = min(k, max_backlog - (self.published - consumer.deliveries))
            transport.write(self._chunk(k))
            self.published += k
            # let the consumer's reads (same loop) run between batches
            await sleep(0)
        if conn.error is not None and not conn.closing:
            raise conn.error

