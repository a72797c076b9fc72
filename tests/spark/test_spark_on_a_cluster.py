"""Spark against a real cluster of this broker (two ``serve --cluster`` processes on a throwaway
PostgreSQL database): the active node is SIGKILLed while a streaming query holds a batch read
through the standby. Every confirmed message reaches the output (the held batch comes back
redelivered from the node that took over), and the query keeps running."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_support import NodeProcess, drain  # noqa: E402

from eb_support import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


def wait_for(predicate, what, timeout=60.0, every=0.05):
    assert wait_until(predicate, timeout, interval=every), f"timed out waiting for {what}"


@pytest.fixture
def two_nodes(pg_database):
    workdir = Path(tempfile.mkdtemp(prefix="eb-spark-cluster-"))
    made = []
    try:
        for name in ("s1", "s2"):
            # a failover of about 5 s: the query's next trigger falls inside it
            made.append(NodeProcess(workdir, pg_database[1], name, "--cluster-failover-timeout", "5").start_node())
        assert made[0].is_active()
        yield made
    finally:
        for node in made:
            node.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_stream_from_a_classic_queue_survives_the_death_of_the_active_node(spark, two_nodes, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from spark_integration.amqp import Connection, Properties
    from spark_integration.rows import spark_schema

    active, standby = two_nodes
    bodies = [f"c{i}".encode() for i in range(40)]
    with Connection.connect(f"amqp://guest:guest@127.0.0.1:{active.port}/%2F") as c:
        c.queue_declare("spark-ha", durable=True)
        c.confirm_select()
        for body in bodies:
            c.publish("", "spark-ha", body, Properties(delivery_mode=2))
        c.wait_for_confirms()
    gate = str(tmp_path / "killed")  # batch 0 cannot finish (nor be acked) before the kill

    @F.udf(BinaryType())
    def held(b):
        while not os.path.exists(gate):
            time.sleep(0.01)
        return b

    # the driver connects through the standby first (it passes the connection on to the active node)
    url = f"amqp://guest:guest@127.0.0.1:{standby.port},127.0.0.1:{active.port}/%2F"
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = (spark.readStream.format("amqp").option("url", url).option("queue", "spark-ha")
          .option("queueType", "classic").option("maxMessagesPerTrigger", "10").load())
    q = (df.withColumn("body", held("body")).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ck).trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: os.path.exists(os.path.join(ck, "offsets", "0")), "batch 0", 180)
        active.kill()  # SIGKILL while batch 0 is held, unacked
        open(gate, "w").close()
        wait_for(standby.is_active, "the standby to take over", 60)

        def written():
            try:
                return {r.body for r in spark.read.schema(spark_schema()).parquet(out).select("body").collect()}
            except Exception:  # noqa: BLE001 - no file yet
                return set()
        wait_for(lambda: written() == set(bodies), "every message in the output", 180, 0.5)
        # A batch whose ack was lost with the dead node comes back redelivered and is written (and
        # acked) again: the queue is empty, nothing ready and nothing unacked, once that is done.
        wait_for(lambda: queue_totals(standby.admin_port, "spark-ha") == (0, 0),
                 "every message acked after its commit", 120, 0.5)
    finally:
        q.stop()
    assert q.exception() is None
    rows = spark.read.parquet(out).select("body", "redelivered").collect()
    assert {r.body for r in rows} == set(bodies)
    assert any(r.redelivered for r in rows)  # the held batch came back from the node that took over
    with Connection.connect(f"amqp://guest:guest@127.0.0.1:{standby.port}/%2F") as c:
        assert c.queue_declare("spark-ha", passive=True)[1] == 0  # all acked after their commits


def queue_totals(admin_port: int, queue: str) -> tuple[int, int] | None:
    """(ready, unacked) of a queue from a node's admin API; None while it does not answer."""
    import requests
    try:
        got = requests.get(f"http://127.0.0.1:{admin_port}/api/queues/%2F/{queue}", auth=("guest", "guest"), timeout=5)
        body = got.json()
        return body["messages_ready"], body["messages_unacknowledged"]
    except (requests.RequestException, ValueError, KeyError):
        return None


def test_connecting_during_a_failover_waits_for_the_node_that_takes_over(two_nodes):
    from spark_integration.amqp import ConnectionFailed, ConnectionParams
    from spark_integration.failover import connect_retrying

    active, standby = two_nodes
    params = ConnectionParams.from_url(f"amqp://guest:guest@127.0.0.1:{standby.port},127.0.0.1:{active.port}/%2F")
    conn, ready = connect_retrying(params, 5, lambda c: c.queue_declare("ha-probe", durable=True)[1])
    conn.close()
    active.kill()
    with pytest.raises(ConnectionFailed):  # no retrying: nobody serves during the failover
        connect_retrying(params, 0)
    conn, ready = connect_retrying(params, 60, lambda c: c.queue_declare("ha-probe", passive=True)[1])
    try:
        assert ready == 0 and standby.is_active()  # the node that took over answers
    finally:
        conn.close()


def _rows(i: int, n: int):
    """Batch ``i``: n persistent rows (transient messages would die with the active node)."""
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({
        "body": [f"b{i}-r{j}".encode() for j in range(n)],
        "properties": [{"delivery_mode": 2}] * n})


def test_sink_publishing_reconnects_and_publishes_again_what_was_not_confirmed(two_nodes):
    import threading

    from spark_integration.amqp import Connection, ConnectionParams
    from spark_integration.failover import connect_retrying
    from spark_integration.publish_rows import publish_batches

    active, standby = two_nodes
    url = f"amqp://guest:guest@127.0.0.1:{standby.port},127.0.0.1:{active.port}/%2F"
    params = ConnectionParams.from_url(url)
    with Connection.connect(url) as c:
        c.queue_declare("sink-ha", durable=True)

    def batches_killing_the_active():
        for i in range(40):  # 40,000 persistent rows
            if i == 10:
                threading.Thread(target=active.kill).start()  # SIGKILL mid-write
            yield _rows(i, 1000)

    conn = Connection.connect(params)
    stats = publish_batches(conn, batches_killing_the_active(), "", "sink-ha", window=4000, chunk=1000,
                            reconnect=lambda: connect_retrying(params, 60)[0])
    stats.conn.close()
    assert stats.reconnects >= 1 and stats.rows == 40_000
    got = [body for body, _ in drain(standby.port, "sink-ha")]
    assert set(got) == {f"b{i}-r{j}".encode() for i in range(40) for j in range(1000)}  # every row
    assert len(got) >= 40_000  # at least once: what was not confirmed was published again


def test_a_stream_range_read_resumes_on_the_node_that_takes_over(two_nodes):
    from spark_integration.amqp import Connection, ConnectionParams, Properties
    from spark_integration.reader import read_stream_range

    active, standby = two_nodes
    url = f"amqp://guest:guest@127.0.0.1:{standby.port},127.0.0.1:{active.port}/%2F"
    with Connection.connect(f"amqp://guest:guest@127.0.0.1:{active.port}/%2F") as c:
        c.queue_declare("ha-stream", durable=True, arguments={"x-queue-type": "stream"})
        c.confirm_select()
        for i in range(20_000):
            c.publish("", "ha-stream", f"s{i}".encode(), Properties(delivery_mode=2))
        c.wait_for_confirms()
    offsets = []
    for n, batch in enumerate(read_stream_range(ConnectionParams.from_url(url), "ha-stream", 0, 20_000,
                                                batch_rows=1000, reconnect_timeout=60)):
        offsets.extend(batch.column("offset").to_pylist())
        if n == 2:
            active.kill()  # SIGKILL in the middle of the read
    assert offsets == list(range(20_000))  # every offset once, in order, across the failover
    assert standby.is_active()
