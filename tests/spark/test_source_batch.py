"""spark.read.format("amqp") over classic queues, against a real broker."""

from __future__ import annotations

import datetime as dt

import pytest

from spark_integration.rows import spark_schema


def read(spark, url, queue, **options):
    r = spark.read.format("amqp").option("url", url).option("queue", queue)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def props(i):
    return {"headers": {"i": i, "ok": i % 2 == 0, "nested": {"a": [1, "x"]}},
            "message_id": f"id-{i}", "content_type": "text/plain", "delivery_mode": 2,
            "priority": i % 3, "timestamp": 1_700_000_000 + i, "type": "t", "app_id": "tests"}


def test_peek_is_the_default_and_loses_nothing(spark, amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(20)], props)
    df = read(spark, amqp_url, classic_queue)
    assert df.schema == spark_schema()
    rows = sorted(df.collect(), key=lambda r: int(r.headers["i"]))
    assert [r.body for r in rows] == [f"m{i}".encode() for i in range(20)]
    r = rows[3]
    assert r.queue == classic_queue and r.exchange == "" and r.routing_key == classic_queue
    assert r.offset is None and r.redelivered is False
    assert r.timestamp == dt.datetime(2023, 11, 14, 22, 13, 23)       # session time zone: UTC
    assert r.headers == {"i": "3", "ok": "false", "nested": '{"a":[1,"x"]}'}
    p = r.properties
    assert (p.message_id, p.content_type, p.delivery_mode, p.priority, p.type, p.app_id) == \
        ("id-3", "text/plain", 2, 0, "t", "tests")
    assert p.correlation_id is None and p.user_id is None
    # peek: every message is still in the queue
    assert amqp.depth(classic_queue) == 20
    assert df.count() == 20                                           # and can be read again


def test_on_read_with_several_consumers(spark, amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(300)])
    df = read(spark, amqp_url, classic_queue, ackMode="onRead", numPartitions=3, batchSize=50)
    assert df.rdd.getNumPartitions() == 3
    bodies = [r.body for r in df.select("body").collect()]
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(300))   # each exactly once
    assert amqp.depth(classic_queue) == 0


def test_max_messages(spark, amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(50)])
    df = read(spark, amqp_url, classic_queue, maxMessages=15, ackMode="onRead")
    assert [r.body for r in df.select("body").collect()] == [f"m{i}".encode() for i in range(15)]
    assert amqp.depth(classic_queue) == 35


def test_empty_queue_gives_an_empty_dataframe(spark, amqp_url, classic_queue):
    df = read(spark, amqp_url, classic_queue, queueType="classic")
    assert df.count() == 0 and df.schema == spark_schema()


@pytest.mark.parametrize("options, message", [
    ({}, "option 'queue' is required"),
    ({"queue": "no-such-queue"}, "queue 'no-such-queue' not found in vhost '/'"),
    ({"queue": "q", "url": "amqp://guest:guest@127.0.0.1:1/"},
     "cannot connect to AMQP broker at 127.0.0.1:1"),
    ({"queue": "q", "ackMode": "sometimes"}, "option 'ackMode' must be peek or onRead"),
    ({"queue": "q", "maxOfsetsPerTrigger": "5"}, "unknown option(s) maxofsetspertrigger"),
])
def test_bad_options_fail_at_load(spark, amqp_url, options, message):
    r = spark.read.format("amqp").option("url", options.pop("url", amqp_url))
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception) as info:
        r.load()
    assert message in str(info.value)


def test_peek_with_several_partitions_is_refused(spark, amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, [b"x"])
    with pytest.raises(Exception, match="single consumer"):
        read(spark, amqp_url, classic_queue, numPartitions=2, queueType="classic").collect()
    assert amqp.depth(classic_queue) == 1
