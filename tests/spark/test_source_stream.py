"""Stream queues: batch reads by offset range, readStream with checkpoints (exactly-once).

Skipped (reason "broker has no stream queues yet") when the broker under test cannot
declare and replay a stream queue.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.usefixtures("stream_support")


def bodies(n, start=0):
    return [f"s{i}".encode() for i in range(start, start + n)]


def stream_df(spark, url, queue, **options):
    r = spark.readStream.format("amqp").option("url", url).option("queue", queue)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(spark, df, out, checkpoint):
    q = (df.writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(180), "availableNow query did not finish"
    finally:
        q.stop()
    assert q.exception() is None
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def offsets_in(spark, out):
    return sorted(r.offset for r in spark.read.parquet(out).select("offset").collect())


def test_batch_read_by_offset_ranges(spark, amqp_url, amqp, stream_queue):
    amqp.publish(stream_queue, bodies(60), lambda i: {"message_id": f"id{i}"})
    df = (spark.read.format("amqp").option("url", amqp_url).option("queue", stream_queue)
          .option("numPartitions", "3").load())                 # queueType auto-detected
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("offset", "body", "properties.message_id").collect()
    assert sorted(r.offset for r in rows) == list(range(60))
    assert all(r.body == f"s{r.offset}".encode() and r.message_id == f"id{r.offset}"
               for r in rows)
    part = (spark.read.format("amqp").option("url", amqp_url).option("queue", stream_queue)
            .option("queueType", "stream").option("startingOffsets", "10")
            .option("endingOffsets", "25").load())
    assert sorted(r.offset for r in part.select("offset").collect()) == list(range(10, 25))


def test_read_stream_available_now_with_limit_and_restart(spark, amqp_url, amqp, stream_queue,
                                                          tmp_path):
    amqp.publish(stream_queue, bodies(45))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_df(spark, amqp_url, stream_queue, startingOffsets="earliest",
                   maxOffsetsPerTrigger=20, numPartitions=2)
    assert run_available_now(spark, df, out, ck) == [20, 20, 5]
    amqp.publish(stream_queue, bodies(10, 45))
    assert run_available_now(spark, df, out, ck) == [10]         # resumes from the checkpoint
    assert run_available_now(spark, df, out, ck) == []           # nothing new: no batch
    assert offsets_in(spark, out) == list(range(55))             # each message exactly once


def test_starting_offsets_latest_reads_only_new_messages(spark, amqp_url, amqp, stream_queue,
                                                         tmp_path):
    amqp.publish(stream_queue, bodies(5))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_df(spark, amqp_url, stream_queue)                # default: latest
    q = (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
         .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 120
        while not q.recentProgress:                              # initial offset recorded
            assert time.monotonic() < deadline
            time.sleep(0.1)
        amqp.publish(stream_queue, bodies(3, 5))
        while sum(p["numInputRows"] for p in q.recentProgress) < 3:
            assert q.exception() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        q.stop()
    assert offsets_in(spark, out) == [5, 6, 7]


def test_query_stopped_mid_batch_restarts_exactly_once(spark, amqp_url, amqp, stream_queue,
                                                       tmp_path):
    """Stop (cancel) the query while a micro-batch runs; restart from the checkpoint."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    @F.udf(BinaryType())
    def slow(b):
        time.sleep(0.05)
        return b

    amqp.publish(stream_queue, bodies(60))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_df(spark, amqp_url, stream_queue, startingOffsets="earliest",
                   maxOffsetsPerTrigger=10).withColumn("body", slow("body"))
    q = (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
         .start())
    try:
        wait_mid_batch(ck, 2)
    finally:
        q.stop()                                                 # interrupts the running batch
    assert not os.path.exists(os.path.join(ck, "commits", "5"))
    run_available_now(spark, df, out, ck)
    assert offsets_in(spark, out) == list(range(60))


def wait_mid_batch(ck, batch, timeout=180):
    """Wait until batch `batch` is planned (offset log) but not committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        planned = os.path.exists(os.path.join(ck, "offsets", str(batch)))
        done = os.path.exists(os.path.join(ck, "commits", str(batch)))
        if planned and not done:
            return
        if done:
            batch += 1
        time.sleep(0.01)
    raise AssertionError("streaming query made no progress")


KILLED_QUERY = textwrap.dedent("""
    import os, sys, time
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession, functions as F
    from pyspark.sql.types import BinaryType
    from spark_integration import register
    url, queue, out, ck = sys.argv[1:5]
    # its scratch space inside the test's directory: a SIGKILLed JVM cannot remove its blockmgr-*
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.local.dir", os.path.join(os.path.dirname(ck), "spark-local"))
             .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={os.path.dirname(ck)} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    register(spark)
    slow = F.udf(lambda b: (time.sleep(0.05), b)[1], BinaryType())
    df = (spark.readStream.format("amqp").option("url", url).option("queue", queue)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10").load()
          .withColumn("body", slow("body")))
    q = (df.writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ck).start())
    q.awaitTermination()
""")


def test_killed_query_restarts_from_checkpoint_exactly_once(spark, amqp_url, amqp,
                                                            stream_queue, tmp_path):
    """SIGKILL the whole driver (Python + JVM) mid-batch, restart here: no loss, no dupes."""
    amqp.publish(stream_queue, bodies(40))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_QUERY, amqp_url, stream_queue, out, ck],
                            start_new_session=True, cwd=os.getcwd(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_mid_batch(ck, 1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not os.path.exists(os.path.join(ck, "commits", "3"))   # killed mid-run
    df = stream_df(spark, amqp_url, stream_queue, startingOffsets="earliest",
                   maxOffsetsPerTrigger=10)
    run_available_now(spark, df, out, ck)
    assert offsets_in(spark, out) == list(range(40))
