"""The ``amqp`` PySpark data source (Python Data Source API, PySpark 4.x).

    spark.dataSource.register(AmqpDataSource)
    spark.read.format("amqp").option("url", url).option("queue", "q").load()
    spark.readStream.format("amqp").option("url", url).option("queue", "s").load()
    df.write.format("amqp").option("url", url).option("exchange", "x").save()   # sink.py

Readers return Arrow record batches.  The JVM-free logic lives in ``reader.py``.
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)

from . import reader as R
from .options import SourceOptions
from .rows import spark_schema

try:  # PySpark >= 4.2: admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - PySpark 4.0/4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)


class ClassicPartition(InputPartition):
    def __init__(self, index: int, budget: int) -> None:
        super().__init__(index)
        self.index = index
        self.budget = budget

    def __repr__(self) -> str:
        return f"ClassicPartition(index={self.index}, budget={self.budget})"


class StreamRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"StreamRange({self.start}, {self.end})"


def _partition_id() -> int:
    """The Spark partition this task reads (spreads connections over the url's nodes)."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _check_schema(schema) -> None:
    expected = spark_schema()
    if schema is not None and schema != expected:
        raise ValueError("amqp data source: the schema is fixed and cannot be changed with "
                         ".schema(...); select/cast the columns after load() instead")


class AmqpDataSource(DataSource):
    """format("amqp"): AMQP 0-9-1 queues (classic/quorum: batch; stream: batch and streaming)."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self._opts: SourceOptions | None = None

    @property
    def opts(self) -> SourceOptions:
        """Reader options, parsed (and checked) on first use: load() fails fast on them."""
        if self._opts is None:
            self._opts = SourceOptions.parse(self.options)
        return self._opts

    @classmethod
    def name(cls) -> str:
        return "amqp"

    def writer(self, schema, overwrite: bool):
        from .sink import AmqpWriter, SinkOptions, check_sink_schema
        opts = SinkOptions.parse(self.options)
        check_sink_schema(schema, opts)
        return AmqpWriter(opts)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import AmqpStreamWriter, SinkOptions, check_sink_schema
        opts = SinkOptions.parse(self.options)
        check_sink_schema(schema, opts)
        return AmqpStreamWriter(opts)

    def schema(self):
        # Called when load() is evaluated: also check that the broker is reachable and the
        # queue exists, so a wrong url/queue fails there with a clear message.
        R.inspect_queue(self.opts.params, self.opts.queue, "classic")
        return spark_schema()

    def reader(self, schema) -> DataSourceReader:
        _check_schema(schema)
        return AmqpBatchReader(self.opts)

    def streamReader(self, schema) -> DataSourceStreamReader:
        _check_schema(schema)
        o = self.opts
        qtype = o.queue_type
        if qtype == "auto":
            qtype = R.inspect_queue(o.params, o.queue, "auto", o.admin_url, o.probe_timeout).type
        if qtype in ("classic", "quorum"):
            from .queue_stream import QueueStreamReader
            return QueueStreamReader(o)
        if o.dedupe != "none":
            raise ValueError("amqp data source: dedupe only applies to classic/quorum queues "
                             "(a stream queue is replayed by offset and is exactly-once already)")
        return AmqpStreamReader(o)


class AmqpBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self):
        o = self.opts
        info = R.inspect_queue(o.params, o.queue, o.queue_type, o.admin_url, o.probe_timeout)
        o.checked(info.type)
        if info.type == "stream":
            start = R.resolve_offset(o.params, o.queue, o.starting_offsets or "earliest",
                                     o.probe_timeout)
            tail = R.resolve_offset(o.params, o.queue, "latest", o.probe_timeout)
            if start is None or tail is None:
                return [StreamRange(0, 0)]
            end = tail if o.ending_offsets == "latest" else min(int(o.ending_offsets), tail)
            ranges = R.split_range(start, end, o.num_partitions)
            return [StreamRange(a, b) for a, b in ranges] or [StreamRange(0, 0)]
        budgets = R.plan_budgets(info.ready, o.max_messages, o.num_partitions)
        return [ClassicPartition(i, b) for i, b in enumerate(budgets)]

    def read(self, partition):
        o = self.opts
        if isinstance(partition, StreamRange):
            return R.read_stream(o, partition.start, partition.end, prefer=_partition_id())
        return R.read_classic(o.params, o.queue, partition.budget, o.ack_mode, o.batch_size,
                              o.idle(), prefer=partition.index)


class AmqpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader over a stream queue.

    Offsets are ``{"offset": N}`` = the next stream offset to read (exclusive end of the
    previous batch).  Spark's checkpoint (offset log + commit log) is the only record of
    progress; nothing is stored on the broker.  A micro-batch [start, end) is split into
    ``numPartitions`` offset ranges read in parallel.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: int | None = None   # Trigger.AvailableNow: tail when the query started
        self._available_now = False
        self._last = 0                    # PySpark < 4.2 only: last offset handed out

    # -- offsets ------------------------------------------------------------------------
    def _offset(self, n: int) -> dict:
        return {"offset": int(n)}

    def initialOffset(self) -> dict:
        o = self.opts
        spec = o.starting_offsets if o.starting_offsets is not None else "latest"
        # wait longer than a trigger-time probe: resolving "latest" to 0 by mistake would
        # replay the whole stream
        found = R.resolve_offset(o.params, o.queue, spec, max(o.probe_timeout, 5.0))
        return self._offset(found if found is not None else 0)

    def _tail(self) -> int | None:
        if self._available_now:
            return self._target
        return R.probe_stream(self.opts.params, self.opts.queue, "last", self.opts.probe_timeout)

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        tail = self._tail()
        if start is None:  # PySpark < 4.2 calls latestOffset() without arguments
            self._last = max(self._last, tail or 0)
            return self._offset(self._last)
        begin = int(start["offset"])
        if tail is None or tail <= begin:
            return start
        end = tail
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            end = min(end, begin + int(limit.max_rows))
        return self._offset(end)

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._target = R.probe_stream(self.opts.params, self.opts.queue, "last",
                                      max(self.opts.probe_timeout, 5.0))

    def partitions(self, start: dict, end: dict):
        ranges = R.split_range(int(start["offset"]), int(end["offset"]), self.opts.num_partitions)
        return [StreamRange(a, b) for a, b in ranges]

    def read(self, partition):
        return R.read_stream(self.opts, partition.start, partition.end, prefer=_partition_id())

    def commit(self, end: dict) -> None:
        pass  # Spark's checkpoint is the source of truth; a stream keeps its messages

    def stop(self) -> None:
        pass
