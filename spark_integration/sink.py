"""The ``amqp`` sink: ``df.write.format("amqp")`` and ``df.writeStream.format("amqp")``.

Every Spark task opens its own connection (partitions publish in parallel, each from its
executor), publishes its rows with publisher confirms and returns only when the broker has
confirmed all of them.  A nack, or a ``mandatory`` publish returned as unroutable, fails the
task (``PublishFailed``); Spark retries it, so delivery is at-least-once: rows confirmed
before the failure are published again by the retry.  The columns are in ``publish_rows``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from .amqp import Connection, ConnectionParams
from .failover import connect_retrying
from .options import _bool, _int, normalized
from .publish_rows import publish_batches
from .rows import PROPERTY_FIELDS

try:  # PySpark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - PySpark 4.0: rows instead of Arrow batches
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase

log = logging.getLogger(__name__)

__all__ = ["SinkOptions", "AmqpWriter", "AmqpStreamWriter", "check_sink_schema"]

SINK_OPTIONS = {
    "url": "amqp[s]://user:pass@host:port/vhost (required)",
    "exchange": "exchange for every row (overrides the 'exchange' column; default: the "
                "column, else the default exchange '')",
    "routingkey": "routing key for every row (overrides the 'routing_key' column)",
    "mandatory": "true: a row no queue takes fails the task (default false)",
    "confirmwindow": "publishes in flight before waiting for confirms (default 20000)",
    "publishtimeoutms": "longest wait for confirms (default 120000)",
    "reconnecttimeoutms": "after a lost connection, how long a task keeps trying the url's nodes (a cluster "
                          "failing over) before it fails; unconfirmed rows are published again (default 30000)",
}

# options Spark itself passes to a streaming sink
SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")


@dataclass(frozen=True)
class SinkOptions:
    url: str
    params: ConnectionParams
    exchange: str | None = None
    routing_key: str | None = None
    mandatory: bool = False
    confirm_window: int = 20000
    timeout: float = 120.0
    reconnect_timeout: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SinkOptions":
        opts, params = normalized(options, SINK_OPTIONS, "amqp sink", SPARK_OPTIONS)
        url = opts["url"]
        try:
            return cls(url=str(url), params=params, exchange=opts.get("exchange"),
                       routing_key=opts.get("routingkey"),
                       mandatory=_bool(opts, "mandatory", False),
                       confirm_window=_int(opts, "confirmwindow", 20000),
                       timeout=_int(opts, "publishtimeoutms", 120000) / 1000.0,
                       reconnect_timeout=_int(opts, "reconnecttimeoutms", 30000, minimum=0) / 1000.0)
        except ValueError as exc:
            raise ValueError(str(exc).replace("amqp data source:", "amqp sink:")) from None


def check_sink_schema(schema, opts: SinkOptions) -> None:
    """Fail on the driver, before any task runs, when the columns cannot be published."""
    from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, ShortType,
                                   StringType, StructType, TimestampNTZType, TimestampType,
                                   ByteType)
    fields = {f.name: f.dataType for f in schema.fields}
    body = fields.get("body")
    if not isinstance(body, (BinaryType, StringType)):
        raise ValueError("amqp sink: the DataFrame needs a 'body' column of type binary or "
                         f"string (columns: {', '.join(fields) or 'none'})")
    for name in ("exchange", "routing_key"):
        if name in fields and not isinstance(fields[name], StringType):
            raise ValueError(f"amqp sink: column '{name}' must be a string, not "
                             f"{fields[name].simpleString()}")
    headers = fields.get("headers")
    if headers is not None and not (isinstance(headers, MapType)
                                    and isinstance(headers.keyType, StringType)
                                    and isinstance(headers.valueType, StringType)):
        raise ValueError("amqp sink: column 'headers' must be map<string,string>, not "
                         f"{headers.simpleString()}")
    stamp = fields.get("timestamp")
    if stamp is not None and not isinstance(stamp, (TimestampType, TimestampNTZType)):
        raise ValueError(f"amqp sink: column 'timestamp' must be a timestamp, not "
                         f"{stamp.simpleString()}")
    props = fields.get("properties")
    if props is not None:
        if not isinstance(props, StructType):
            raise ValueError("amqp sink: column 'properties' must be a struct with fields among "
                             f"{', '.join(PROPERTY_FIELDS)}")
        for f in props.fields:
            if f.name not in PROPERTY_FIELDS:
                raise ValueError(f"amqp sink: unknown field properties.{f.name}; known: "
                                 f"{', '.join(PROPERTY_FIELDS)}")
            ints = (IntegerType, LongType, ShortType, ByteType)
            want = ints if f.name in ("delivery_mode", "priority") else (StringType,)
            if not isinstance(f.dataType, want):
                raise ValueError(f"amqp sink: properties.{f.name} must be "
                                 f"{'an integer' if want is ints else 'a string'}, not "
                                 f"{f.dataType.simpleString()}")
    if opts.exchange is None and "exchange" not in fields:
        log.info("amqp sink: no exchange option or column: publishing to the default exchange")


@dataclass
class PublishedMessage(WriterCommitMessage):
    partition: int
    rows: int
    seconds: float


def _publish(opts: SinkOptions, iterator) -> PublishedMessage:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else 0
    def connect() -> Connection:
        # the url's nodes, tried again for reconnectTimeoutMs (a cluster failing over)
        return connect_retrying(opts.params, opts.reconnect_timeout, prefer=part, client_name="spark-amqp-sink")[0]

    conn = connect()
    try:
        stats = publish_batches(conn, iterator, opts.exchange, opts.routing_key, opts.mandatory,
                                window=opts.confirm_window, timeout=opts.timeout, reconnect=connect)
    except BaseException:
        conn.abort()
        raise
    if stats.reconnects:
        log.warning("amqp sink: partition %d reconnected %d time(s); rows not yet confirmed were published "
                    "again (at least once)", part, stats.reconnects)
    stats.conn.close()
    return PublishedMessage(part, stats.rows, stats.seconds)


class AmqpWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator) -> PublishedMessage:
        return _publish(self.opts, iterator)

    def commit(self, messages) -> None:
        rows = sum(m.rows for m in messages if m is not None)
        log.info("amqp sink: %d rows published and confirmed", rows)


class AmqpStreamWriter(_StreamWriterBase):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator) -> PublishedMessage:
        if _StreamWriterBase.__name__ == "DataSourceStreamWriter":   # PySpark 4.0: rows
            iterator = _rows_to_batches(iterator)
        return _publish(self.opts, iterator)

    def commit(self, messages, batchId) -> None:
        rows = sum(m.rows for m in messages if m is not None)
        log.info("amqp sink: batch %d: %d rows published and confirmed", batchId, rows)

    def abort(self, messages, batchId) -> None:
        log.warning("amqp sink: batch %d aborted; rows already confirmed stay published (Spark "
                    "retries the batch: at-least-once)", batchId)


def _rows_to_batches(rows, size: int = 10000):  # pragma: no cover - PySpark 4.0 only
    import pyarrow as pa
    chunk = []
    for row in rows:
        chunk.append(row.asDict(recursive=True))
        if len(chunk) >= size:
            yield pa.RecordBatch.from_pylist(chunk)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk)
