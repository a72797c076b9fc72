"""``format("amqp-super-stream")``: a super stream into Spark, one Spark partition per stream
partition (and offset ranges inside it), batch and Structured Streaming.

    from spark_integration.super_stream import register
    register(spark)
    df = (spark.read.format("amqp-super-stream").option("url", url)
          .option("superStream", "orders").load())
    (spark.readStream.format("amqp-super-stream").option("url", url).option("superStream", "orders")
          .option("startingOffsets", "earliest").load()
          .writeStream.format("parquet").option("path", out).option("checkpointLocation", chk).start())

A super stream's partitions are the stream queues ``<name>-0 .. <name>-(N-1)`` (RabbitMQ's naming
too); they are found over AMQP with passive declares, so this works against any broker with super
streams. Each partition is read exactly as a single stream is (``reader.read_stream_range``): a
read is a pure function of an offset range, so streaming is exactly-once through Spark's
checkpoint, whose offsets are ``{"partitions": [next offset of partition 0, 1, ...]}``. A
partition added later (the super stream grew) is read from its first offset. Options are those of
``format("amqp")`` for streams, with ``superStream`` instead of ``queue``; ``numPartitions``
splits each partition's range further; ``maxOffsetsPerTrigger`` is shared out between partitions.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from . import reader as R
from .amqp import ChannelClosed
from .options import SourceOptions
from .rows import spark_schema

try:  # PySpark >= 4.2: admission control (maxOffsetsPerTrigger)
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
except ImportError:  # pragma: no cover - PySpark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None

MAX_PARTITIONS = 1024


class PartitionRange(InputPartition):
    """Offsets [start, end) of one stream partition (a queue)."""

    def __init__(self, queue: str, start: int, end: int) -> None:
        super().__init__((queue, start, end))
        self.queue, self.start, self.end = queue, start, end

    def __repr__(self) -> str:
        return f"PartitionRange({self.queue!r}, {self.start}, {self.end})"


def discover(opts: SourceOptions) -> list[str]:
    """The partition queues ``name-0, name-1, ...`` that exist (ValueError: none)."""
    found = []
    for i in range(MAX_PARTITIONS):
        queue = f"{opts.queue}-{i}"
        try:
            with R.connect(opts.params) as conn:
                conn.queue_declare(queue, passive=True)
        except ChannelClosed as exc:
            if exc.code != 404:
                raise
            break
        found.append(queue)
    if not found:
        p = opts.params
        raise ValueError(f"amqp-super-stream: no super stream '{opts.queue}' in vhost '{p.vhost}' "
                         f"on {p.host}:{p.port} (no partition queue '{opts.queue}-0')")
    return found


def parse(options) -> SourceOptions:
    opts = dict(options)
    name = next((v for k, v in opts.items() if str(k).lower() == "superstream"), None)
    if not name:
        raise ValueError("amqp-super-stream: option 'superStream' is required (the super stream's "
                         "name; its partitions are the stream queues <name>-0, <name>-1, ...)")
    rest = {k: v for k, v in opts.items() if str(k).lower() not in ("superstream", "queue")}
    return SourceOptions.parse({**rest, "queue": name, "queueType": "stream"})


def ranges(queues: list[str], start: list[int], end: list[int], split: int) -> list[PartitionRange]:
    out = []
    for q, a, b in zip(queues, start, end):
        out += [PartitionRange(q, x, y) for x, y in R.split_range(a, b, split)]
    return out


class SuperStreamDataSource(DataSource):
    """format("amqp-super-stream")."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self.opts = parse(options)

    @classmethod
    def name(cls) -> str:
        return "amqp-super-stream"

    def schema(self):
        discover(self.opts)  # a wrong url or name fails at load() with a clear message
        return spark_schema()

    def reader(self, schema) -> DataSourceReader:
        return SuperStreamBatchReader(self.opts)

    def streamReader(self, schema) -> DataSourceStreamReader:
        return SuperStreamReader(self.opts)


def _resolve(opts: SourceOptions, queue: str, spec) -> int:
    found = R.resolve_offset(opts.params, queue, spec, max(opts.probe_timeout, 5.0))
    return found if found is not None else 0


class SuperStreamBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self):
        o = self.opts
        queues = discover(o)
        start = [_resolve(o, q, o.starting_offsets or "earliest") for q in queues]
        end = [_resolve(o, q, "latest") for q in queues]
        if o.ending_offsets != "latest":
            end = [min(e, int(o.ending_offsets)) for e in end]
        return ranges(queues, start, end, o.num_partitions) or [PartitionRange(queues[0], 0, 0)]

    def read(self, partition):
        o = self.opts
        return R.read_stream_range(o.params, partition.queue, partition.start, partition.end,
                                   o.batch_size, o.read_timeout, o.fail_on_data_loss,
                                   reconnect_timeout=o.reconnect_timeout)


class SuperStreamReader(DataSourceStreamReader):
    """Micro-batches: per partition [its offset in the previous end, its tail)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.queues = discover(opts)

    def initialOffset(self) -> dict:
        spec = self.opts.starting_offsets if self.opts.starting_offsets is not None else "latest"
        return {"partitions": [_resolve(self.opts, q, spec) for q in self.queues]}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        o = self.opts
        self.queues = discover(o)   # the super stream may have grown: new partitions from 0
        begin = list((start or {}).get("partitions", []))
        begin += [0] * (len(self.queues) - len(begin))
        tails = [R.probe_stream(o.params, q, "last", o.probe_timeout) for q in self.queues]
        end = [max(b, t or 0) for b, t in zip(begin, tails)]
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            share = -(-int(limit.max_rows) // len(self.queues))
            end = [min(e, b + share) for b, e in zip(begin, end)]
        return {"partitions": end}

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def partitions(self, start: dict, end: dict):
        a = list(start["partitions"])
        b = list(end["partitions"])
        a += [0] * (len(b) - len(a))
        queues = [f"{self.opts.queue}-{i}" for i in range(len(b))]
        return ranges(queues, a, b, self.opts.num_partitions)

    def read(self, partition):
        o = self.opts
        return R.read_stream_range(o.params, partition.queue, partition.start, partition.end,
                                   o.batch_size, o.read_timeout, o.fail_on_data_loss,
                                   reconnect_timeout=o.reconnect_timeout)

    def commit(self, end: dict) -> None:
        pass  # Spark's checkpoint is the source of truth; streams keep their messages


def register(spark) -> None:
    """Register ``format("amqp-super-stream")`` on a SparkSession."""
    spark.dataSource.register(SuperStreamDataSource)
