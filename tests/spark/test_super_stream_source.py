"""format("amqp-super-stream") (spark_integration/super_stream.py): a super stream read with one
Spark partition per stream partition, in batch and as a checkpointed stream (exactly-once over
two runs). Needs a broker with super streams (exchange type x-super-stream)."""

from __future__ import annotations

import uuid

import pytest

pytestmark = [pytest.mark.usefixtures("stream_support"), pytest.mark.slow]


def _publish(amqp, name: str, start: int, n: int) -> None:
    with amqp.connect() as c:
        c.confirm_select()
        for i in range(start, start + n):
            c.publish(name, f"key-{i % 30}", f"m{i}".encode())
        c.wait_for_confirms(30)


@pytest.fixture
def super_stream(amqp_url):
    import pika
    name = f"spark-ss-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        try:
            conn.channel().exchange_declare(name, "x-super-stream", durable=True,
                                            arguments={"x-partitions": 3})
        except pika.exceptions.AMQPError as exc:
            pytest.skip(f"broker has no super streams: {exc}")
        yield name
        conn.channel().exchange_delete(name)   # and its partitions
    finally:
        if conn.is_open:
            conn.close()


def test_batch_and_exactly_once_stream(spark, amqp_url, amqp, super_stream, tmp_path):
    from spark_integration.super_stream import register
    register(spark)
    _publish(amqp, super_stream, 0, 300)
    df = (spark.read.format("amqp-super-stream").option("url", amqp_url)
          .option("superStream", super_stream).load())
    assert df.rdd.getNumPartitions() == 3                      # one per stream partition
    rows = df.select("queue", "offset", "body", "routing_key").collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(300))
    for p in range(3):
        offs = sorted(r.offset for r in rows if r.queue == f"{super_stream}-{p}")
        assert offs == list(range(len(offs))) and offs
    assert all(len({r.queue for r in rows if r.routing_key == k}) == 1
               for k in {r.routing_key for r in rows})          # a key lives in one partition

    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")

    def run():
        q = (spark.readStream.format("amqp-super-stream").option("url", amqp_url)
             .option("superStream", super_stream).option("startingOffsets", "earliest").load()
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", chk)
             .trigger(availableNow=True).start())
        try:
            assert q.awaitTermination(180), "availableNow query did not finish"
        finally:
            q.stop()
        assert q.exception() is None
    run()
    _publish(amqp, super_stream, 300, 150)
    run()                                                      # resumes from the checkpoint
    got = spark.read.parquet(out).select("queue", "offset", "body").collect()
    assert len(got) == 450 and len({(r.queue, r.offset) for r in got}) == 450
    assert sorted(r.body for r in got) == sorted(f"m{i}".encode() for i in range(450))
