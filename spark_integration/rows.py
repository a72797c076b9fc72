"""AMQP delivery -> DataFrame row conversion.  Pure Python + pyarrow: no JVM needed.

Row schema (also in README.md)::

    body          binary
    queue         string
    exchange      string
    routing_key   string
    delivery_tag  bigint      (per channel; only meaningful within one read)
    redelivered   boolean
    offset        bigint      (stream queues: the x-stream-offset; null otherwise)
    timestamp     timestamp   (basic property timestamp, UTC; null when absent)
    headers       map<string,string>   (typed AMQP values rendered as strings, see render_value)
    properties    struct<content_type, content_encoding: string, delivery_mode, priority: int,
                         correlation_id, reply_to, expiration, message_id, type, user_id,
                         app_id: string>
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
from typing import Any, Iterable, Sequence

from .amqp import EMPTY_PROPERTIES, Delivery, DeliveryBatch
from .amqp.batch import offset_properties

COLUMNS = ("body", "queue", "exchange", "routing_key", "delivery_tag", "redelivered", "offset",
           "timestamp", "headers", "properties")
PROPERTY_FIELDS = ("content_type", "content_encoding", "delivery_mode", "priority",
                   "correlation_id", "reply_to", "expiration", "message_id", "type", "user_id",
                   "app_id")
_INT_PROPERTIES = ("delivery_mode", "priority")
# index of each PROPERTY_FIELDS entry in amqp.Properties
_PROP_INDEX = (0, 1, 3, 4, 5, 6, 7, 8, 10, 11, 12)

DDL = ("body BINARY, queue STRING, exchange STRING, routing_key STRING, delivery_tag BIGINT, "
       "redelivered BOOLEAN, offset BIGINT, timestamp TIMESTAMP, headers MAP<STRING, STRING>, "
       "properties STRUCT<" + ", ".join(
           f"{f}: {'INT' if f in _INT_PROPERTIES else 'STRING'}" for f in PROPERTY_FIELDS) + ">")

STREAM_OFFSET_HEADER = "x-stream-offset"
# AMQP timestamps are seconds; some publishers put milliseconds there.  Anything past this
# (year ~5138) is read as milliseconds rather than failing the whole read.
_MAX_SECONDS = 10 ** 11
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


# ---------------------------------------------------------------------------- header values
def _iso(value: _dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    value = value.astimezone(_dt.timezone.utc)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def _float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _bytes(value: bytes | bytearray | memoryview) -> str:
    raw = bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _float(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return render_value(value)


def render_value(value: Any) -> str | None:
    """Render one typed AMQP field-table value as a string.

    * void -> null; strings as is; booleans -> ``true``/``false``; integers -> decimal digits
    * floats -> shortest round-trip repr (``NaN``, ``Infinity``, ``-Infinity``)
    * decimals -> plain notation (``12.50``)
    * timestamps -> ISO-8601 UTC (``2024-05-01T12:00:00Z``)
    * byte arrays -> UTF-8 text when valid, else base64
    * arrays / nested tables -> compact JSON (nested scalars keep their JSON type)
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, _dt.datetime):
        return _iso(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False)
    return str(value)


def render_headers(headers: dict | None) -> list[tuple[str, str | None]] | None:
    if headers is None:
        return None
    return [(str(k), render_value(v)) for k, v in headers.items()]


def timestamp_micros(seconds: int | None) -> int | None:
    if seconds is None:
        return None
    if seconds >= _MAX_SECONDS:       # milliseconds
        return seconds * 1000
    return seconds * 1_000_000


def stream_offset(headers: dict | None) -> int | None:
    if not headers:
        return None
    value = headers.get(STREAM_OFFSET_HEADER)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


# ---------------------------------------------------------------------------- rows
def delivery_to_row(d: Delivery, queue: str, stream: bool = False) -> dict:
    """One delivery as a plain dict in schema order (for tests and small reads)."""
    p = d.properties
    micros = timestamp_micros(p.timestamp)
    return {
        "body": bytes(d.body),
        "queue": queue,
        "exchange": d.exchange,
        "routing_key": d.routing_key,
        "delivery_tag": d.delivery_tag,
        "redelivered": d.redelivered,
        "offset": stream_offset(p.headers) if stream else None,
        "timestamp": None if micros is None else _EPOCH + _dt.timedelta(microseconds=micros),
        "headers": None if p.headers is None else dict(render_headers(p.headers)),
        "properties": {f: p[i] for f, i in zip(PROPERTY_FIELDS, _PROP_INDEX, strict=True)},
    }


# ---------------------------------------------------------------------------- schemas
_ARROW_SCHEMA = None


def arrow_schema():
    """The Arrow schema Spark expects for the row schema (== pyspark's to_arrow_schema)."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa
        props = pa.struct([(f, pa.int32() if f in _INT_PROPERTIES else pa.string())
                           for f in PROPERTY_FIELDS])
        _ARROW_SCHEMA = pa.schema([
            ("body", pa.binary()), ("queue", pa.string()), ("exchange", pa.string()),
            ("routing_key", pa.string()), ("delivery_tag", pa.int64()),
            ("redelivered", pa.bool_()), ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("headers", pa.map_(pa.string(), pa.string())), ("properties", props),
        ])
    return _ARROW_SCHEMA


def spark_schema():
    """The row schema as a pyspark StructType (built without a JVM)."""
    from pyspark.sql.types import (BinaryType, BooleanType, IntegerType, LongType, MapType,
                                   StringType, StructField, StructType, TimestampType)
    props = StructType([StructField(f, IntegerType() if f in _INT_PROPERTIES else StringType())
                        for f in PROPERTY_FIELDS])
    return StructType([
        StructField("body", BinaryType()), StructField("queue", StringType()),
        StructField("exchange", StringType()), StructField("routing_key", StringType()),
        StructField("delivery_tag", LongType()), StructField("redelivered", BooleanType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("properties", props),
    ])


def _headers_array(header_col: list):
    """map<string,string> column from header dicts (None = null map), built from flat
    key/value arrays (much cheaper than converting a list of lists of pairs)."""
    import pyarrow as pa
    offsets = [0]
    keys: list[str] = []
    values: list[str | None] = []
    nulls = []
    for h in header_col:
        if h is None:
            nulls.append(True)
        else:
            nulls.append(False)
            for k, v in h.items():
                keys.append(k if type(k) is str else str(k))
                values.append(v if type(v) is str else render_value(v))
        offsets.append(len(keys))
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    return pa.MapArray.from_arrays(pa.array(offsets, type=pa.int32()),
                                   pa.array(keys, type=pa.string()),
                                   pa.array(values, type=pa.string()), mask=mask)


_ARANGE = None


def _arange(n: int):
    """int32 [0, 1, ..., n] (a slice of a cached array)."""
    global _ARANGE
    import pyarrow as pa
    if _ARANGE is None or len(_ARANGE) <= n:
        _ARANGE = pa.array(list(range(max(n + 1, 65537))), type=pa.int32())
    return _ARANGE.slice(0, n + 1)


def _strings(values: list, n: int):
    """A string column; one value repeated (the usual exchange, routing key) costs nothing."""
    import pyarrow as pa
    if values.count(values[0]) == n:
        return pa.repeat(pa.scalar(values[0], pa.string()), n)
    return pa.array(values, type=pa.string())


def _offset_headers(offsets: list):
    """map<string,string> of stream deliveries whose only header is x-stream-offset."""
    import pyarrow as pa
    n = len(offsets)
    return pa.MapArray.from_arrays(_arange(n), pa.repeat(pa.scalar(STREAM_OFFSET_HEADER), n),
                                   pa.array(offsets, type=pa.int64()).cast(pa.string()))


def plain_stream_batch(bodies, exchanges, rkeys, first_tag: int, offsets: list[int], queue: str):
    """Stream rows of messages that had no properties (their only header is x-stream-offset),
    with the bodies, exchanges and routing keys already as Arrow arrays (chunk_reader.py)."""
    n = len(offsets)
    return _record_batch(n, queue, True, bodies, exchanges, rkeys,
                         list(range(first_tag, first_tag + n)), [False] * n, [None] * n, offsets)


def to_record_batch(deliveries: Sequence[Delivery], queue: str, stream: bool = False):
    """Build one Arrow RecordBatch (columnar, one pass per column) from deliveries."""
    import pyarrow as pa
    n = len(deliveries)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())
    tags, redelivered, exchanges, rkeys, props, bodies, _ctags = map(list, zip(*deliveries))
    return _record_batch(n, queue, stream, bodies, _strings(exchanges, n), _strings(rkeys, n),
                         tags, redelivered, props, None)


def batch_to_record_batch(batch: DeliveryBatch, queue: str, stream: bool = False):
    """``to_record_batch`` for deliveries kept as columns (what the readers use)."""
    import pyarrow as pa
    n = len(batch)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())
    names = batch.names
    if names.count(names[0]) == n:
        exchanges = pa.repeat(pa.scalar(names[0][0], pa.string()), n)
        rkeys = pa.repeat(pa.scalar(names[0][1], pa.string()), n)
    else:
        exchanges = pa.array([x[0] for x in names], type=pa.string())
        rkeys = pa.array([x[1] for x in names], type=pa.string())
    return _record_batch(n, queue, stream, batch.bodies, exchanges, rkeys, batch.tags,
                         batch.redelivered, batch.raw_properties, batch.offsets)


def _record_batch(n, queue, stream, bodies, exchanges, rkeys, tags, redelivered, props, offsets):
    """``props``: Properties per delivery, or None where a delivery has none other than the
    ``x-stream-offset`` header, whose value ``offsets`` holds (None: rows, offsets unknown)."""
    import pyarrow as pa
    schema = arrow_schema()
    headers_type = schema.field("headers").type
    ts_type = schema.field("timestamp").type
    prop_type = schema.field("properties").type
    trivial = props.count(None) if offsets is not None else 0
    if trivial == n or props.count(EMPTY_PROPERTIES) == n:
        if offsets is None or offsets.count(None) == n:
            headers = pa.nulls(n, type=headers_type)
            offsets = None
        elif None not in offsets:
            headers = _offset_headers(offsets)
        else:
            headers = _headers_array([None if o is None else {STREAM_OFFSET_HEADER: o}
                                      for o in offsets])
        timestamps = pa.nulls(n, type=ts_type)
        prop_arrays = [pa.nulls(n, type=prop_type.field(f).type) for f in PROPERTY_FIELDS]
    else:
        if trivial:
            props = [offset_properties(o) if p is None else p for p, o in zip(props, offsets)]
        header_col = [p[2] for p in props]
        if header_col.count(None) != n:
            headers = _headers_array(header_col)
            if offsets is None and stream:
                offsets = [stream_offset(h) for h in header_col]
        else:
            headers = pa.nulls(n, type=headers_type)
        ts_col = [p[9] for p in props]
        if ts_col.count(None) != n:
            timestamps = pa.array([timestamp_micros(t) for t in ts_col], type=pa.int64()).cast(ts_type)
        else:
            timestamps = pa.nulls(n, type=ts_type)
        prop_arrays = []
        for f, i in zip(PROPERTY_FIELDS, _PROP_INDEX, strict=True):
            col = [p[i] for p in props]
            t = prop_type.field(f).type
            prop_arrays.append(pa.array(col, type=t) if col.count(None) != n else pa.nulls(n, type=t))
    arrays = [
        pa.array(bodies, type=pa.binary()),
        pa.repeat(pa.scalar(queue, pa.string()), n),
        exchanges,
        rkeys,
        pa.array(tags, type=pa.int64()),
        pa.array(redelivered, type=pa.bool_()),
        pa.array(offsets, type=pa.int64()) if stream and offsets is not None
        else pa.nulls(n, type=pa.int64()),
        timestamps,
        headers,
        pa.StructArray.from_arrays(prop_arrays, fields=list(prop_type)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def to_table(deliveries: Sequence[Delivery] | DeliveryBatch, queue: str, stream: bool = False,
             batch_rows: int = 65536):
    """An Arrow Table made of RecordBatches of at most ``batch_rows`` rows."""
    import pyarrow as pa
    if isinstance(deliveries, DeliveryBatch):
        batches = [batch_to_record_batch(deliveries.slice(i, i + batch_rows), queue, stream)
                   for i in range(0, len(deliveries), batch_rows)]
    else:
        batches = [to_record_batch(deliveries[i:i + batch_rows], queue, stream)
                   for i in range(0, len(deliveries), batch_rows)]
    return pa.Table.from_batches(batches, schema=arrow_schema())


def rows_from_batches(batches: Iterable) -> list[dict]:
    out: list[dict] = []
    for b in batches:
        out.extend(b.to_pylist())
    return out
