"""AMQP delivery -> row conversion.  No JVM: pure Python + pyarrow."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

pa = pytest.importorskip("pyarrow")

from spark_integration.amqp import EMPTY_PROPERTIES, Delivery, Properties  # noqa: E402
from spark_integration.reader import batches  # noqa: E402
from spark_integration.rows import (COLUMNS, PROPERTY_FIELDS, arrow_schema,  # noqa: E402
                                    delivery_to_row, render_headers, render_value,
                                    timestamp_micros, to_record_batch, to_table)

UTC = dt.timezone.utc


def d(tag=1, body=b"x", props=EMPTY_PROPERTIES, redelivered=False, exchange="", key="q"):
    return Delivery(tag, redelivered, exchange, key, props, body, "ctag")


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("text", "text"),
    ("", ""),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-42, "-42"),
    (2 ** 63 - 1, "9223372036854775807"),
    (1.5, "1.5"),
    (0.1, "0.1"),
    (float("nan"), "NaN"),
    (float("inf"), "Infinity"),
    (float("-inf"), "-Infinity"),
    (decimal.Decimal("12.50"), "12.50"),
    (decimal.Decimal("1E+2"), "100"),
    (dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC), "2024-05-01T12:00:00Z"),
    (dt.datetime(2024, 5, 1, 12, 0, 0, 250000), "2024-05-01T12:00:00.25Z"),   # naive = UTC
    (dt.datetime(2024, 5, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
     "2024-05-01T12:00:00Z"),
    (b"bytes", "bytes"),
    (bytearray(b"\xc3\xa9"), "\u00e9"),
    (b"\xff\x00", "/wA="),                       # not UTF-8: base64
    ([1, "a", True, None, 1.5], '[1,"a",true,null,1.5]'),
    ({"k": {"n": 1}, "l": [b"x"]}, '{"k":{"n":1},"l":["x"]}'),
    ([dt.datetime(2020, 1, 1, tzinfo=UTC), decimal.Decimal("1.0")], '["2020-01-01T00:00:00Z","1.0"]'),
    ({"\u00e9": "\u00fc"}, '{"\u00e9":"\u00fc"}'),
])
def test_render_value(value, expected):
    assert render_value(value) == expected


def test_render_headers_keeps_order_and_nulls():
    assert render_headers(None) is None
    assert render_headers({}) == []
    assert render_headers({"b": 1, "a": None}) == [("b", "1"), ("a", None)]


def test_timestamp_seconds_and_millisecond_heuristic():
    assert timestamp_micros(None) is None
    assert timestamp_micros(0) == 0
    assert timestamp_micros(1_700_000_000) == 1_700_000_000_000_000
    # a publisher that put milliseconds in the (seconds) timestamp property
    assert timestamp_micros(1_700_000_000_123) == 1_700_000_000_123_000


def test_delivery_to_row_full():
    props = Properties(content_type="application/json", content_encoding="gzip",
                       headers={"x-stream-offset": 7, "n": 1, "flag": True},
                       delivery_mode=2, priority=5, correlation_id="c-1", reply_to="rq",
                       expiration="60000", message_id="m-1", timestamp=1_700_000_000,
                       type="order.created", user_id="guest", app_id="shop", cluster_id="x")
    row = delivery_to_row(d(9, b"{}", props, True, "orders", "o.new"), "q1", stream=True)
    assert list(row) == list(COLUMNS)
    assert row["body"] == b"{}" and row["queue"] == "q1"
    assert row["exchange"] == "orders" and row["routing_key"] == "o.new"
    assert row["delivery_tag"] == 9 and row["redelivered"] is True
    assert row["offset"] == 7
    assert row["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert row["headers"] == {"x-stream-offset": "7", "n": "1", "flag": "true"}
    assert row["properties"] == {
        "content_type": "application/json", "content_encoding": "gzip", "delivery_mode": 2,
        "priority": 5, "correlation_id": "c-1", "reply_to": "rq", "expiration": "60000",
        "message_id": "m-1", "type": "order.created", "user_id": "guest", "app_id": "shop"}
    # offset only for stream reads
    assert delivery_to_row(d(props=props), "q")["offset"] is None


def test_delivery_to_row_empty_properties():
    row = delivery_to_row(d(), "q")
    assert row["headers"] is None and row["timestamp"] is None and row["offset"] is None
    assert set(row["properties"]) == set(PROPERTY_FIELDS)
    assert all(v is None for v in row["properties"].values())


def test_record_batch_matches_pyspark_arrow_schema():
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_integration.rows import spark_schema
    # Spark validates a data source's RecordBatches against exactly this schema
    assert to_arrow_schema(spark_schema(), timezone="UTC").equals(arrow_schema())
    assert spark_schema().fieldNames() == list(COLUMNS)


def test_record_batch_values_equal_row_conversion():
    props = [EMPTY_PROPERTIES,
             Properties(headers={"a": [1, 2], "x-stream-offset": 11}, timestamp=5, priority=1),
             Properties(content_type="text/plain", delivery_mode=1)]
    ds = [d(i + 1, f"b{i}".encode(), p, i == 1, "ex", f"k{i}") for i, p in enumerate(props)]
    batch = to_record_batch(ds, "q", stream=True)
    assert batch.schema.equals(arrow_schema())
    got = batch.to_pylist()
    want = [delivery_to_row(x, "q", stream=True) for x in ds]
    for g, w in zip(got, want, strict=True):
        g["headers"] = None if g["headers"] is None else dict(g["headers"])
        assert g == w
    assert got[0]["offset"] is None and got[1]["offset"] == 11


def test_record_batch_fast_paths():
    empty = to_record_batch([], "q")
    assert empty.num_rows == 0 and empty.schema.equals(arrow_schema())
    plain = to_record_batch([d(i, b"x" * 100) for i in range(1, 1001)], "q")
    assert plain.num_rows == 1000
    assert plain.column("headers").null_count == 1000
    assert plain.column("delivery_tag").to_pylist()[-1] == 1000


def test_batches_split_by_rows_and_table():
    ds = [d(i, b"x") for i in range(1, 26)]
    parts = list(batches(ds, "q", False, 10))
    assert [b.num_rows for b in parts] == [10, 10, 5]
    table = to_table(ds, "q", batch_rows=7)
    assert table.num_rows == 25 and table.schema.equals(arrow_schema())
    assert table.column("delivery_tag").to_pylist() == list(range(1, 26))


def test_batches_split_by_bytes(monkeypatch):
    import spark_integration.reader as R
    monkeypatch.setattr(R, "MAX_BATCH_BYTES", 250)
    parts = list(R.batches([d(i, b"x" * 100) for i in range(1, 8)], "q", False, 1000))
    assert [b.num_rows for b in parts] == [3, 3, 1]
