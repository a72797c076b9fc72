"""The benchmarks measure what they claim: every tool run end to end against a real broker on an
ephemeral port, with small settings, checking counts and correctness fields (never speed).
RabbitMQ is never contacted (--port / --skip-rabbitmq)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pika
import pytest
from eb_support import SubprocessBroker

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from loadgen.procs import cpu_seconds, rss_bytes, safe_connections  # noqa: E402
from loadgen.report import median_result, percentile, ratio  # noqa: E402


def run_tool(script: str, *args: str, timeout: float = 60) -> dict:
    out = subprocess.run([sys.executable, str(BENCH / script), *args, "--json"],
                         capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{script} printed no result (exit {out.returncode}):\n{out.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def bench_broker():
    """One broker for the module (each tool declares and deletes its own queues)."""
    workdir = Path(tempfile.mkdtemp(prefix="eb-test-bench-"))
    broker = SubprocessBroker(workdir, ["--data-dir", str(workdir / "data")]).start()
    try:
        yield broker
    finally:
        broker.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def queue_exists(port: int, name: str) -> bool:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.parametrize("scenario,queues", [("transient", 1), ("transient-confirms", 1),
                                             ("confirms", 1), ("fanout", 4)])
def test_amqp_load_verify_every_message_once_in_order(bench_broker, scenario, queues):
    r = run_tool("amqp_load.py", "--scenario", scenario, "--port", str(bench_broker.port),
                 "--verify", "--count", "3000", "--verify-grace", "0.2")
    assert r["verify_problems"] == [] and r["verify_ok"] is True
    assert r["published"] == 3000 and r["consumed"] == 3000 * queues
    if scenario != "transient" and scenario != "fanout":
        assert r["confirmed"] == 3000 and r["nacked"] == 0
    assert not queue_exists(bench_broker.port, r["queue"] if queues == 1 else r["queue"] + "-0")


def test_amqp_load_timed_fanout_counts_every_queue(bench_broker):
    r = run_tool("amqp_load.py", "--scenario", "fanout", "--port", str(bench_broker.port),
                 "--seconds", "1.2", "--warmup", "0.4", "--max-backlog", "2000")
    assert r["mode"] == "timed" and r["queues"] == 4
    assert r["consumed"] > 0 and r["consumed"] <= 4 * r["published"]
    assert r["backlog_at_end"] == 4 * r["published"] - r["consumed"]


def test_latency_times_every_message(bench_broker):
    r = run_tool("latency.py", "--port", str(bench_broker.port), "--rate", "2000",
                 "--seconds", "1.2", "--warmup", "0.4", "--sync-seconds", "0.3")
    assert "error" not in r, r
    assert r["all_delivered"] is True and r["nacked"] == 0
    assert r["confirmed"] >= r["published"] > 0
    assert r["confirm_samples"] > 0 and r["deliver_samples"] > 0 and r["sync_count"] > 0
    for kind in ("confirm", "deliver", "sync"):
        assert 0 < r[f"{kind}_p50_ms"] <= r[f"{kind}_p99_ms"]


def test_memory_counts_the_queue_and_removes_it(bench_broker):
    r = run_tool("memory.py", "--port", str(bench_broker.port), "--pid", str(bench_broker.pid),
                 "--messages", "2000", "--settle", "0.1")
    assert "error" not in r, r
    assert r["queued"] == 2000 and r["all_queued"] is True
    assert r["rss_after_mib"] > 0 and r["rss_before_mib"] > 0
    assert r["bytes_per_message"] == pytest.approx(
        (r["rss_after_mib"] - r["rss_before_mib"]) * 2**20 / 2000, abs=60)
    assert not queue_exists(bench_broker.port, r["queue"])


def test_many_connections_delivers_everything_and_reads_cpu(bench_broker):
    r = run_tool("many_connections.py", "--port", str(bench_broker.port),
                 "--pid", str(bench_broker.pid), "--connections", "20", "--seconds", "1",
                 "--warmup", "0.5")
    assert "error" not in r, r
    assert r["connections_open"] == 20 and "warning" not in r
    assert r["all_delivered"] is True and r["delivered"] == r["published"] > 0
    assert r["cpu_seconds"] >= 0 and r["cpu_per_1000"] is not None


def test_stream_bench_one_broker(bench_broker):
    r = run_tool("stream_bench.py", "--port", str(bench_broker.port), "--pid",
                 str(bench_broker.pid), "--count", "2000", "--prefetch", "200")
    assert r["deliveries"] == [2000, 2000]
    assert r["published_per_s"] > 0 and r["read_per_s"] > 0
    assert r["broker_rss_mb_after_publish"] > 0


def test_compare_runs_our_broker_and_prints_every_row(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "--scenario", "transient,confirms,fanout",
         "--runs", "1", "--skip-rabbitmq", "--load-arg=--verify", "--load-arg=--count",
         "--load-arg=1000", "--load-arg=--verify-grace", "--load-arg=0.1", "--json"],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    for row in ("transient ", "persistent ", "fanout ", "deliveries/s (4 queues)", "skipped"):
        assert row in table
    results = json.loads([ln for ln in table.splitlines() if ln.startswith("{")][-1])
    assert set(results) == {"transient", "persistent", "fanout"}
    assert all(r["ours"]["verify_ok"] and r["rabbitmq"] is None for r in results.values())


def test_compare_rejects_an_unknown_scenario():
    out = subprocess.run([sys.executable, str(BENCH / "compare.py"), "--scenario", "nope"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unknown scenario(s) nope" in out.stderr
    assert "Traceback" not in out.stderr


def test_proc_readings_and_connection_cap_of_this_process():
    me = os.getpid()
    assert rss_bytes(me) > 1 << 20 and cpu_seconds(me) > 0
    n, note = safe_connections(me, 10**9)
    assert 0 < n < 10**9 and "capped" in note
    assert safe_connections(me, 1) == (1, "")


def test_report_helpers():
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 99) == 4
    assert percentile([], 50) is None
    med = median_result([{"x": 1, "s": "a"}, {"x": 5}, {"x": 3}, {"error": "boom"}])
    assert med["x"] == 3 and med["s"] == "a" and len(med["runs"]) == 4
    assert ratio(2.0, 4.0) == 0.5 and ratio(2.0, 4.0, higher_is_better=False) == 2.0
    assert ratio(None, 1.0) is None


def _delivery(seq: int, tag: int, size: int = 16) -> bytes:
    import struct

    from loadgen.wire import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, _frame, _shortstr
    method = (struct.pack(">HH", 60, 60) + _shortstr("ctag") + struct.pack(">QB", tag, 0)
              + _shortstr("") + _shortstr("q"))
    header = struct.pack(">HHQH", 60, 0, size, 0)
    body = struct.pack(">Q", seq) + bytes(size - 8)
    return (_frame(FRAME_METHOD, 1, method) + _frame(FRAME_HEADER, 1, header)
            + _frame(FRAME_BODY, 1, body))


def test_verify_reports_a_duplicate_and_a_gap():
    """The consumer side of --verify, fed raw frames (split at an awkward point) by hand."""
    import asyncio

    from loadgen.client import Connection

    async def feed() -> Connection:
        c = Connection("consumer")
        c.verify, c.v_expected_size = True, 16
        data = b"".join(_delivery(seq, tag) for tag, seq in enumerate([1, 2, 2, 4], 1))
        c.data_received(data[:50])
        c.data_received(data[50:])
        return c

    c = asyncio.run(feed())
    assert c.deliveries == 4 and c.v_completed == 4
    assert c.v_errors == ["delivery #3: sequence 2, expected 3",
                          "delivery #4: sequence 4, expected 3"]


def test_super_stream_bench_reads_every_message_through_a_group():
    out = subprocess.run([sys.executable, str(BENCH / "super_stream_bench.py"), "--count", "3000",
                          "--rounds", "1", "--partitions", "3", "--prefetch", "200", "--json"],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("[")][-1])
    assert [r["target"] for r in results] == ["stream", "ss-3"]
    for r in results:
        assert sum(r["per_reader"]) == 3000 and r["published_per_s"] > 0 and r["read_per_s"] > 0
    assert len(results[1]["per_reader"]) == 3  # the group's three members shared the partitions


@pytest.mark.parametrize("mode", ["transient", "confirms", "fanout", "stream"])
def test_hot_path_measures_each_mode(mode):
    out = subprocess.run([sys.executable, str(BENCH / "hot_path.py"), mode, "--rounds", "4"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"{mode}: ") and float(out.stdout.split()[1]) > 0
