"""drain(): consume -> write (Spark) -> ack, against a real broker and the shared SparkSession."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import spark_integration.drain as D
from spark_integration.rows import spark_schema


def data_files(path):
    return sorted(f for f in os.listdir(path) if f.startswith("part-"))


def props(i):
    return {"headers": {"n": i, "tag": "x"}, "message_id": f"id-{i}", "timestamp": 1_700_000_000}


def test_drain_parquet_in_chunks(spark, amqp_url, amqp, classic_queue, tmp_path):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(250)], props)
    out = str(tmp_path / "out")
    df = D.drain(amqp_url, classic_queue, out, spark=spark, chunk_size=100)
    assert amqp.depth(classic_queue) == 0
    assert len(data_files(out)) == 3                      # one output part per chunk
    assert df.schema == spark_schema()
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(250))
    assert len({r.properties.message_id for r in rows}) == 250
    r = next(r for r in rows if r.body == b"m7")
    assert r.headers == {"n": "7", "tag": "x"} and r.redelivered is False
    assert spark.read.parquet(out).count() == 250


@pytest.mark.parametrize("fmt", ["json", "orc"])
def test_drain_other_formats_round_trip(spark, amqp_url, amqp, classic_queue, tmp_path, fmt):
    amqp.publish(classic_queue, [bytes([0, 255, i]) for i in range(5)], props)
    out = str(tmp_path / fmt)
    df = D.drain(amqp_url, classic_queue, out, format=fmt, spark=spark)
    rows = sorted(df.collect(), key=lambda r: r.body)
    assert [r.body for r in rows] == [bytes([0, 255, i]) for i in range(5)]   # binary survives
    assert rows[2].headers == {"n": "2", "tag": "x"} and rows[2].properties.message_id == "id-2"
    assert amqp.depth(classic_queue) == 0


def test_arrow_engine_output_cannot_be_created(amqp_url, amqp, classic_queue, tmp_path):
    """engine=arrow checks the output directory before taking any message."""
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(10)])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("occupied")
    with pytest.raises(OSError):
        D.run_drain(amqp_url, classic_queue, str(not_a_dir), engine="arrow", spark=object())
    back = amqp.take_all(classic_queue, 10)
    assert [d.body for d in back] == [f"m{i}".encode() for i in range(10)]
    assert not any(d.redelivered for d in back)            # none was even delivered


def test_drain_empty_queue(spark, amqp_url, classic_queue, tmp_path):
    df = D.drain(amqp_url, classic_queue, str(tmp_path / "o"), spark=spark)
    assert df.count() == 0 and df.schema == spark_schema()


def test_failed_write_leaves_every_message_in_the_queue(spark, amqp_url, amqp, classic_queue,
                                                        tmp_path):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(60)])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("occupied")                      # Spark cannot write under a file
    with pytest.raises(Exception) as info:  # noqa: B017 - whatever Spark raises for it
        D.drain(amqp_url, classic_queue, str(not_a_dir), spark=spark, chunk_size=25,
                engine="spark")
    assert "file" in str(info.value).lower() or "exist" in str(info.value).lower()
    back = amqp.take_all(classic_queue, 60)
    assert [d.body for d in back] == [f"m{i}".encode() for i in range(60)]   # nothing acked
    assert all(d.redelivered for d in back[:25])          # chunk 1 was delivered and came back


def test_task_failure_in_second_chunk(spark, amqp_url, amqp, classic_queue, tmp_path,
                                      monkeypatch):
    """The second chunk's Spark job fails in an executor task: chunk 1 stays written and
    acked exactly once, chunk 2 goes back to the queue, nothing is duplicated or lost."""
    from pyspark.sql import functions as F
    real = D.spark_chunk_writer

    def poisoned(spark_, output, fmt="parquet", write_options=None):
        write = real(spark_, output, fmt, write_options)

        def maybe_fail(table, index):
            if index == 1:
                (spark_.createDataFrame(table)
                 .withColumn("body", F.expr("raise_error('simulated executor failure')"))
                 .write.mode("append").parquet(output))
            return write(table, index)
        return maybe_fail

    monkeypatch.setattr(D, "spark_chunk_writer", poisoned)
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(250)])
    out = str(tmp_path / "out")
    with pytest.raises(Exception, match="simulated executor failure"):
        D.drain(amqp_url, classic_queue, out, spark=spark, chunk_size=100, engine="spark")
    written = sorted(r.body for r in spark.read.parquet(out).collect())
    assert written == sorted(f"m{i}".encode() for i in range(100))
    back = amqp.take_all(classic_queue, 150)
    assert [d.body for d in back] == [f"m{i}".encode() for i in range(100, 250)]
    assert all(d.redelivered for d in back[:100])         # chunk 2 (chunk 3 maybe prefetched)


def test_cli_main(spark, amqp_url, amqp, classic_queue, tmp_path, capsys):
    amqp.publish(classic_queue, [f"m{i}".encode() for i in range(50)])
    out = str(tmp_path / "cli")
    rc = D.main(["--url", amqp_url, "--queue", classic_queue, "--output", out,
                 "--format", "parquet", "--max-messages", "30", "--chunk-size", "20"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["messages"] == 30 and report["chunks"] == 2 and report["files"] == 2
    assert spark.read.parquet(out).count() == 30
    assert amqp.depth(classic_queue) == 20


def test_cli_errors(amqp_url, tmp_path):
    """`python -m spark_integration.drain` rejects bad arguments before starting Spark."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "spark_integration.drain", *args],
                              capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    base = ["--url", amqp_url, "--queue", "q", "--output", str(tmp_path / "x")]
    bad = run(*base, "--format", "csv")
    assert bad.returncode == 2 and "invalid choice: 'csv'" in bad.stderr
    missing = run("--url", amqp_url, "--output", "o")
    assert missing.returncode == 2 and "--queue" in missing.stderr
    url = run("--url", "http://nope", "--queue", "q", "--output", "o")
    assert url.returncode == 2 and "amqp://" in url.stderr
    # broker-side problems are found before Spark starts
    gone = run("--url", amqp_url, "--queue", "no-such-queue", "--output", str(tmp_path / "x"))
    assert gone.returncode == 1 and "queue 'no-such-queue' not found" in gone.stderr
    down = run("--url", "amqp://guest:guest@127.0.0.1:1/", "--queue", "q", "--output", "o")
    assert down.returncode == 1 and "cannot connect to AMQP broker at 127.0.0.1:1" in down.stderr
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        D.drain(amqp_url, "q", "o", format="xml", spark=object())
