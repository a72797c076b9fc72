"""Structured Streaming from classic and quorum queues, acked when Spark has committed.

Where things run: Spark keeps one Python process per query on the driver for the source
(``initialOffset``, ``latestOffset``, ``partitions``, ``commit``); ``read`` runs in executor
tasks.  The source's process holds ONE long-lived AMQP connection (``HeldBatches``):

* ``latestOffset(start)`` takes up to ``maxMessagesPerTrigger`` deliveries and keeps them
  **unacked**.  The offset is ``{"messages": N}``, a count of deliveries taken into batches
  (it has no meaning on the broker; Spark's checkpoint numbers the batches with it).
* ``partitions(start, end)`` hands the held rows to the executors inside the partitions
  (Arrow IPC, split in ``numPartitions``); ``read`` only decodes them.
* The batch is acked (``basic.ack`` multiple, then a round trip) once Spark has committed it.
  Spark calls ``commit(end)`` only when it plans the *next* batch (and never for the last
  batch of a run), but it calls ``latestOffset(start)`` only after the batch ending at
  ``start`` is in its commit log, i.e. after the sink committed it.  So both ack: whichever
  comes first.
* A failed batch, a stopped or killed driver, or a lost connection acks nothing: the broker
  requeues the messages (flagged redelivered).  Spark replays an unfinished batch after a
  restart, but the messages are back in the queue, not with us: the replay is **empty**
  and the messages come in the next batch.  At-least-once: a batch the sink committed just
  before the crash (before the ack) is written again.
* ``dedupe=messageId`` makes it exactly-once for messages that carry a ``message_id``
  (``dedupe.DedupeLog``): replays return the rows first planned, redeliveries are dropped.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .amqp import AMQPError, ChannelClosed, Connection, ConnectionClosed, DeliveryBatch
from .failover import connect_retrying
from .options import SourceOptions
from .reader import QueueNotFound, declare_passive
from .rows import arrow_schema, to_table

try:  # PySpark >= 4.2
    from pyspark.sql.streaming.datasource import (ReadMaxRows, SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - PySpark 4.0/4.1
    ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

__all__ = ["QueueStreamReader", "HeldBatches", "HeldPartition"]

# Rows of one partition are shipped inside the task: stay far below spark.rpc.message.maxSize.
MAX_PARTITION_BYTES = 32 * 1024 * 1024


class HeldPartition(InputPartition):
    """Rows of a micro-batch, shipped to an executor as Arrow IPC bytes."""

    def __init__(self, index: int, ipc_bytes: bytes) -> None:
        super().__init__(index)
        self.ipc = ipc_bytes

    def __repr__(self) -> str:
        return f"HeldPartition({self.value}, {len(self.ipc)} bytes)"


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def split_partitions(table: pa.Table, parts: int) -> list[HeldPartition]:
    """Split a batch's rows into at least ``parts`` partitions (more if one would be too big)."""
    n = table.num_rows
    if n == 0:
        return []
    body_bytes = table.column("body").nbytes if n else 0
    parts = max(parts, -(-body_bytes // MAX_PARTITION_BYTES))
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, at = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(HeldPartition(i, _ipc(table.slice(at, size))))
        at += size
    return out


class HeldBatches:
    """The driver-side connection and the batches it holds unacked (one process per query)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.conn: Connection | None = None
        self.held: dict[int, tuple[int, int, pa.Table]] = {}   # end -> (start, last tag, rows)
        self.dedupe = None
        if opts.dedupe != "none":
            from .dedupe import DedupeLog
            self.dedupe = DedupeLog(opts.state_location, opts.dedupe_window)
        self.dropped = 0            # duplicates dropped (dedupe)
        self.ready_at_connect = 0

    def _connect(self) -> Connection:
        if self.conn is None or self.conn.closed is not None:
            if self.held:
                log.warning("AMQP connection to %s lost: %d held batch(es) were not acked and "
                            "come back redelivered", self.opts.params.redacted(), len(self.held))
                self.held.clear()
            def attach(conn: Connection) -> int:
                ready = declare_passive(conn, self.opts.queue)
                conn.consume_limited(self.opts.queue, self.opts.max_messages_per_trigger)
                return ready

            # a lost connection (a node died, a cluster failing over): the url's nodes are tried
            # again for reconnectTimeoutMs before the query fails
            self.conn, self.ready_at_connect = connect_retrying(
                self.opts.params, self.opts.reconnect_timeout, attach, client_name="spark-amqp-stream")
        return self.conn

    def ready(self) -> int:
        """Messages in the queue (ready, not counting what this source holds or has buffered)."""
        if self.conn is None:
            self._connect()
            return self.ready_at_connect    # counted before our consumer took any
        return self.conn.sync(self.opts.queue) + self.conn.pending()

    def ack_through(self, end: int, planning: bool = False) -> None:
        """Ack every held batch ending at or before ``end`` (Spark committed them)."""
        done = sorted(e for e in self.held if e <= end)
        if done and self.conn is not None:
            last_tag = max(self.held[e][1] for e in done)
            try:
                self.conn.basic_ack(last_tag, multiple=True)
                self.conn.sync(self.opts.queue)          # the broker has processed the ack
            except AMQPError as exc:
                log.warning("ack of %d committed batch(es) up to offset %d failed (%s): their "
                            "messages come back redelivered and are written again", len(done),
                            end, exc)
            for e in done:
                del self.held[e]
        if self.dedupe is not None:
            self.dedupe.committed(end, planning)

    def fetch(self, start: int, limit: int, first_wait: float | None = None) -> int:
        """Take up to ``limit`` deliveries as the batch [start, start + n); returns n.

        Waits ``first_wait`` s (default ``idleTimeoutMs``) for the first delivery, then stops
        after ``idleTimeoutMs`` without one, or after a few idle periods in all."""
        if limit <= 0:
            return 0
        conn = self._connect()
        idle = self.opts.idle(streaming=True)
        wait = idle if first_wait is None else first_wait
        deadline = time.monotonic() + wait + 3 * idle + 0.5  # a trickle must not hold the trigger
        got = DeliveryBatch()
        try:
            while len(got) < limit and time.monotonic() < deadline:
                more = conn.take_batch(limit - len(got), wait if not got else idle)
                if not more:
                    break
                got.extend(more)
        except ChannelClosed as exc:
            if exc.code == 404:
                raise QueueNotFound(f"queue '{self.opts.queue}' was deleted") from None
            raise
        except ConnectionClosed as exc:
            # the node went away: what it delivered and we did not ack comes back; the next
            # trigger reconnects (to another node when the url lists several)
            log.warning("AMQP connection lost while fetching (%s); reconnecting at the next "
                        "trigger", exc)
            got = DeliveryBatch()
        if not got:
            return 0
        rows = got
        if self.dedupe is not None:
            rows, dropped = self.dedupe.filter(got.rows())
            self.dropped += dropped
        table = to_table(rows, self.opts.queue) if rows else arrow_schema().empty_table()
        end = start + len(got)
        if self.dedupe is not None:
            self.dedupe.record(start, end, table)
        self.held[end] = (start, got.last_tag, table)
        return len(got)

    def held_from(self, start: int) -> int | None:
        """End of the held batch that starts at ``start``, if any."""
        for end, (begin, _tag, _rows) in self.held.items():
            if begin == start:
                return end
        return None

    def rows(self, start: int, end: int) -> pa.Table | None:
        held = self.held.get(end)
        if held is not None and held[0] == start:
            return held[2]
        if self.dedupe is not None:
            table = self.dedupe.replay(start, end)
            if table is not None:
                log.info("replaying batch [%d, %d) from the dedupe state", start, end)
                return table
        log.info("batch [%d, %d) is not held (restart): replayed empty; its messages come back "
                 "redelivered in a later batch", start, end)
        return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.abort()      # unacked = not committed: the broker requeues them
            self.conn = None
        self.held.clear()


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """readStream over a classic or quorum queue (see the module docstring)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._state: HeldBatches | None = None
        self._left: int | None = None     # Trigger.AvailableNow: messages still to take
        self._last = 0                    # PySpark < 4.2: end of the last batch handed out

    def __getstate__(self):               # read() runs on executors: never ship the connection
        state = dict(self.__dict__)
        state["_state"] = None
        return state

    @property
    def state(self) -> HeldBatches:
        if self._state is None:
            self._state = HeldBatches(self.opts)
        return self._state

    def initialOffset(self) -> dict:
        return {"messages": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        self._left = self.state.ready()   # what is in the queue now; later arrivals wait

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        begin = self._last if start is None else int(start["messages"])
        again = self.state.held_from(begin)
        if again is not None:            # asked twice for the same batch: the same answer
            return {"messages": again}
        self.state.ack_through(begin, planning=True)    # Spark committed everything <= begin
        want = self.opts.max_messages_per_trigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            want = min(want, int(limit.max_rows))
        if self._left is not None:
            want = min(want, self._left)
        # Trigger.AvailableNow ends at the first empty batch: while messages are known to be
        # left, give the broker time to deliver them (it may be slow to refill after an ack)
        first_wait = self.opts.read_timeout if self._left else None
        n = self.state.fetch(begin, want, first_wait)
        if self._left is not None:
            self._left -= n
        self._last = begin + n
        return {"messages": begin + n}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.opts.max_messages_per_trigger) if ReadMaxRows else None

    def partitions(self, start: dict, end: dict):
        table = self.state.rows(int(start["messages"]), int(end["messages"]))
        if table is None or table.num_rows == 0:
            return []
        return split_partitions(table, self.opts.num_partitions)

    def read(self, partition):
        reader = pa.ipc.open_stream(partition.ipc)
        for batch in reader:
            yield batch

    def commit(self, end: dict) -> None:
        self.state.ack_through(int(end["messages"]))

    def stop(self) -> None:
        if self._state is not None:
            self._state.close()
