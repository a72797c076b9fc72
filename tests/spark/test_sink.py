"""df.write.format("amqp") / writeStream.format("amqp"): rows into exchanges with confirms."""

from __future__ import annotations

import pytest

from spark_integration.amqp import Connection

# what a read -> write round trip must keep (queue, routing key and tag belong to the read)
KEPT = ("body", "exchange", "timestamp", "headers", "properties")


def props(i):
    return {"headers": {"n": i, "tag": "x", "ok": i % 2 == 0}, "message_id": f"id-{i}",
            "correlation_id": f"c{i}", "content_type": "text/plain", "delivery_mode": 2,
            "priority": i % 4, "timestamp": 1_700_000_000 + i, "type": "t", "app_id": "tests",
            "reply_to": "r", "expiration": "600000", "content_encoding": "utf-8"}


@pytest.fixture
def queues(amqp_url, queue_name):
    names = [f"{queue_name}-{i}" for i in range(3)]
    with Connection.connect(amqp_url) as c:
        for n in names:
            c.queue_declare(n)
    yield names
    with Connection.connect(amqp_url) as c:
        for n in names:
            c.queue_delete(n)


def read(spark, url, queue):
    return spark.read.format("amqp").option("url", url).option("queue", queue).load()


def test_read_write_round_trip_keeps_the_message(spark, amqp_url, amqp, queues):
    src, dst, _ = queues
    amqp.publish(src, [bytes([0, 255, i]) + b"body" for i in range(20)], props)
    df = read(spark, amqp_url, src)
    (df.write.format("amqp").option("url", amqp_url).option("routingKey", dst)
     .mode("append").save())
    before = sorted(df.select(*KEPT).collect(), key=lambda r: r.body)
    after = sorted(read(spark, amqp_url, dst).select(*KEPT).collect(), key=lambda r: r.body)
    assert len(after) == 20 and after == before
    assert after[5].headers == {"n": "5", "tag": "x", "ok": "false"}
    assert after[5].properties.priority == 1 and after[5].properties.message_id == "id-5"


def test_columns_route_each_row_from_parallel_partitions(spark, amqp_url, amqp, queues):
    a, b, c = queues
    with Connection.connect(amqp_url) as conn:
        conn.queue_bind(c, "amq.direct", "to-c")
    route = [("amq.direct", "to-c"), ("", a), ("", b)]       # i % 3 -> (exchange, key)
    rows = [(f"r{i}".encode(), *route[i % 3]) for i in range(3000)]
    df = spark.createDataFrame(rows, "body binary, exchange string, routing_key string")
    df.repartition(3).write.format("amqp").option("url", amqp_url).mode("append").save()
    got = {q: sorted(d.body for d in amqp.take_all(q, 1000)) for q in (c, a, b)}
    expect = {q: sorted(f"r{i}".encode() for i in range(k, 3000, 3)) for k, q in enumerate((c, a, b))}
    assert got == expect and all(amqp.depth(q) == 0 for q in queues)


def test_mandatory_unroutable_row_fails_the_task(spark, amqp_url, amqp, queues):
    df = spark.createDataFrame([(b"ok", queues[0]), (b"lost", "no-such-queue")],
                               "body binary, routing_key string")
    w = df.coalesce(1).write.format("amqp").option("url", amqp_url).mode("append")
    with pytest.raises(Exception, match="returned as unroutable.*312 NO_ROUTE"):
        w.option("mandatory", "true").save()
    w.option("mandatory", "false").save()          # without mandatory the row is dropped
    assert amqp.depth(queues[0]) == 2              # (the failed attempts published 'ok' too)


def test_nacked_publish_fails_the_task(spark, amqp_url, amqp, queue_name):
    full = f"{queue_name}-full"
    with Connection.connect(amqp_url) as c:
        c.queue_declare(full, arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    try:
        df = spark.createDataFrame([(f"m{i}".encode(),) for i in range(8)], "body binary")
        with pytest.raises(Exception, match="nacked"):
            (df.coalesce(1).write.format("amqp").option("url", amqp_url)
             .option("routingKey", full).mode("append").save())
        assert amqp.depth(full) == 5
    finally:
        with Connection.connect(amqp_url) as c:
            c.queue_delete(full)


def test_write_stream_from_a_queue_into_an_exchange(spark, amqp_url, amqp, queues, tmp_path):
    src, dst, _ = queues
    amqp.publish(src, [f"s{i}".encode() for i in range(50)], props)
    q = (spark.readStream.format("amqp").option("url", amqp_url).option("queue", src)
         .option("maxMessagesPerTrigger", "20").load()
         .writeStream.format("amqp").option("url", amqp_url).option("routingKey", dst)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(180) and q.exception() is None
    moved = amqp.take_all(dst, 50, timeout=2)
    assert sorted(d.body for d in moved) == sorted(f"s{i}".encode() for i in range(50))
    assert moved[0].properties.message_id.startswith("id-") and amqp.depth(src) == 0


@pytest.mark.parametrize("ddl, options, message", [
    ("n int", {}, "needs a 'body' column of type binary or string"),
    ("body binary, headers map<string,int>", {}, "column 'headers' must be map<string,string>"),
    ("body string, properties struct<colour: string>", {}, "unknown field properties.colour"),
    ("body string", {"exchnage": "x"}, "unknown option(s) exchnage"),
    ("body string", {"mandatory": "perhaps"}, "must be true or false"),
])
def test_bad_sink_input_fails_before_publishing(spark, amqp_url, ddl, options, message):
    df = spark.createDataFrame([], ddl)
    w = df.write.format("amqp").option("url", amqp_url).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception) as info:
        w.save()
    assert message in str(info.value)
