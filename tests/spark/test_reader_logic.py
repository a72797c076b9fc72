"""Reader / drain logic against a real broker, without a JVM.

The classic-queue reader, the drain loop (with a plain-Python writer standing in for
Spark), the crash behaviour (failing writer, SIGKILL mid-write) and the stream reader's
offset planning all run here in plain Python.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("pyarrow")

from spark_integration import amqp as A  # noqa: E402
from spark_integration import reader as R  # noqa: E402
from spark_integration.drain import DrainStats, check_format, drain_queue  # noqa: E402
from spark_integration.rows import rows_from_batches  # noqa: E402


def bodies(n, prefix="m"):
    return [f"{prefix}{i}".encode() for i in range(n)]


def params(url):
    return A.ConnectionParams.from_url(url)


# ------------------------------------------------------------------------------- client
def test_consume_limited_spreads_large_prefetch_over_consumers(amqp, classic_queue, monkeypatch):
    monkeypatch.setattr(A.connection, "MAX_PREFETCH", 4)
    amqp.publish(classic_queue, bodies(20))
    with amqp.connect() as c:
        tags = c.consume_limited(classic_queue, 10)      # 4 + 4 + 2
        assert len(tags) == 3
        got = c.take_exactly(20, 0.5)
        assert len(got) == 10                            # never more than the limit unacked
        assert {d.consumer_tag for d in got} == set(tags)
        c.cancel_all()
        assert c.consumer_tags == []
    assert amqp.depth(classic_queue) == 20               # closed without acking: all back


def test_close_requeues_and_never_nacks(amqp, classic_queue):
    amqp.publish(classic_queue, bodies(5))
    c = amqp.connect()
    c.consume_limited(classic_queue, 5)
    assert len(c.take_exactly(5, 1.0)) == 5
    c.close()
    got = amqp.take_all(classic_queue, 5)
    assert [d.body for d in got] == bodies(5)           # same order
    assert all(d.redelivered for d in got)


def test_unreachable_broker_and_missing_queue_messages(amqp_url, amqp):
    with pytest.raises(A.ConnectionFailed, match="cannot connect to AMQP broker at 127.0.0.1:1"):
        A.Connection.connect("amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(A.ConnectionFailed, match="ACCESS_REFUSED|403"):
        A.Connection.connect(amqp_url.replace("guest:guest", "guest:wrong"))
    with pytest.raises(R.QueueNotFound, match="queue 'no-such-queue' not found in vhost '/'"):
        R.inspect_queue(params(amqp_url), "no-such-queue")


# ------------------------------------------------------------------------------- classic
def test_plan_budgets():
    assert R.plan_budgets(10, None, 1) == [10]
    assert R.plan_budgets(10, None, 3) == [4, 3, 3]
    assert R.plan_budgets(10, 4, 3) == [2, 1, 1]
    assert R.plan_budgets(2, None, 4) == [1, 1, 0, 0]
    assert R.plan_budgets(0, None, 2) == [0, 0]


def test_inspect_queue_types(amqp_url, amqp, classic_queue):
    p = params(amqp_url)
    assert R.inspect_queue(p, classic_queue, "classic") == R.QueueInfo("classic", 0)
    assert R.inspect_queue(p, classic_queue, "auto", probe_timeout=0.2).type == "classic"
    amqp.publish(classic_queue, bodies(3))
    assert R.inspect_queue(p, classic_queue, "auto") == R.QueueInfo("classic", 3)
    assert amqp.depth(classic_queue) == 3                # the probe put its message back


def test_peek_reads_everything_and_leaves_the_queue_intact(amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, bodies(30))
    rows = rows_from_batches(R.read_classic(params(amqp_url), classic_queue, 30, "peek",
                                            batch_rows=7, idle_timeout=1.0))
    assert [r["body"] for r in rows] == bodies(30)
    assert all(r["queue"] == classic_queue for r in rows)
    assert amqp.depth(classic_queue) == 30
    again = amqp.take_all(classic_queue, 30)
    assert [d.body for d in again] == bodies(30) and all(d.redelivered for d in again)


def test_peek_budget_touches_only_that_many(amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, bodies(20))
    rows = rows_from_batches(R.read_classic(params(amqp_url), classic_queue, 8, "peek"))
    assert len(rows) == 8
    after = amqp.take_all(classic_queue, 20)
    assert [d.redelivered for d in after] == [True] * 8 + [False] * 12


def test_on_read_acks_exactly_what_was_handed_over(amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, bodies(30))
    rows = rows_from_batches(R.read_classic(params(amqp_url), classic_queue, 25, "onread",
                                            batch_rows=10))
    assert [r["body"] for r in rows] == bodies(30)[:25]
    rest = amqp.take_all(classic_queue, 30, timeout=1.0)
    assert [d.body for d in rest] == bodies(30)[25:]
    assert not any(d.redelivered for d in rest)          # no overshoot: never delivered


def test_on_read_batch_not_taken_is_not_acked(amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, bodies(30))
    gen = R.read_classic(params(amqp_url), classic_queue, 30, "onread", batch_rows=10)
    first = next(gen)                                     # Spark got batch 1 ...
    assert first.num_rows == 10
    second = next(gen)                                    # ... asked for more: batch 1 acked
    assert second.num_rows == 10
    gen.close()                                           # ... then stopped: batch 2 not acked
    assert amqp.depth(classic_queue) == 20
    rest = amqp.take_all(classic_queue, 20)
    assert [d.body for d in rest] == bodies(30)[10:]
    assert [d.redelivered for d in rest] == [True] * 10 + [False] * 10


def test_zero_budget_reads_nothing_without_connecting():
    assert list(R.read_classic(params("amqp://guest:guest@127.0.0.1:1/"), "q", 0)) == []


# ------------------------------------------------------------------------------- drain loop
class Recorder:
    """Stands in for the Spark writer; records what was acked while each chunk is written."""

    def __init__(self, amqp, queue, stats, fail_at=None):
        self.amqp, self.queue, self.stats, self.fail_at = amqp, queue, stats, fail_at
        self.chunks = []

    def __call__(self, table, index):
        self.chunks.append((table.column("body").to_pylist(), self.amqp.depth(self.queue),
                            self.stats.messages))
        if index == self.fail_at:
            raise OSError("disk full (simulated)")
        return [f"part-{index}"]


PIPELINE = pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])


@PIPELINE
def test_drain_in_chunks_acks_after_each_write(amqp_url, amqp, classic_queue, pipeline):
    amqp.publish(classic_queue, bodies(250))
    stats = DrainStats(classic_queue)
    rec = Recorder(amqp, classic_queue, stats)
    drain_queue(amqp_url, classic_queue, rec, chunk_size=100, pipeline=pipeline, stats=stats)
    assert [len(b) for b, _, _ in rec.chunks] == [100, 100, 50]
    assert [b for chunk, _, _ in rec.chunks for b in chunk] == bodies(250)
    acked_during_write = [a for _, _, a in rec.chunks]
    if pipeline:   # chunk k is never acked while written; k-1 may still be in flight
        assert all(a in (100 * k, 100 * (k - 1)) for k, a in enumerate(acked_during_write))
    else:
        assert acked_during_write == [0, 100, 200]
        assert [q for _, q, _ in rec.chunks] == [150, 50, 0]    # ready while writing
    assert stats.messages == 250 and stats.chunks == 3
    assert stats.files == ["part-0", "part-1", "part-2"]
    assert amqp.depth(classic_queue) == 0


@PIPELINE
def test_drain_failed_write_requeues_the_chunk(amqp_url, amqp, classic_queue, pipeline):
    amqp.publish(classic_queue, bodies(250))
    stats = DrainStats(classic_queue)
    rec = Recorder(amqp, classic_queue, stats, fail_at=1)
    with pytest.raises(OSError, match="disk full"):
        drain_queue(amqp_url, classic_queue, rec, chunk_size=100, pipeline=pipeline,
                    stats=stats)
    assert rec.chunks[0][0] == bodies(250)[:100]          # chunk 0: written and acked
    assert stats.messages == 100
    assert amqp.depth(classic_queue) == 150               # chunk 1 back, chunk 2 too
    rest = amqp.take_all(classic_queue, 150)
    assert [d.body for d in rest] == bodies(250)[100:]    # nothing lost, order kept
    assert all(d.redelivered for d in rest[:100])
    if not pipeline:
        assert not any(d.redelivered for d in rest[100:])  # never fetched


@PIPELINE
def test_drain_failing_first_write_leaves_every_message(amqp_url, amqp, classic_queue, pipeline):
    amqp.publish(classic_queue, bodies(40))
    stats = DrainStats(classic_queue)
    with pytest.raises(OSError):
        drain_queue(amqp_url, classic_queue, Recorder(amqp, classic_queue, stats, fail_at=0),
                    chunk_size=10, pipeline=pipeline, stats=stats)
    assert stats.messages == 0
    rest = amqp.take_all(classic_queue, 40)
    assert [d.body for d in rest] == bodies(40)          # nothing acked
    assert all(d.redelivered for d in rest[:10])


@PIPELINE
def test_drain_max_messages_is_exact(amqp_url, amqp, classic_queue, pipeline):
    amqp.publish(classic_queue, bodies(200))
    stats = DrainStats(classic_queue)
    rec = Recorder(amqp, classic_queue, stats)
    drain_queue(amqp_url, classic_queue, rec, chunk_size=50, max_messages=120,
                pipeline=pipeline, stats=stats)
    assert [len(b) for b, _, _ in rec.chunks] == [50, 50, 20] and stats.messages == 120
    rest = amqp.take_all(classic_queue, 80)
    assert [d.body for d in rest] == bodies(200)[120:]
    assert not any(d.redelivered for d in rest)           # nothing beyond the limit delivered


def test_drain_empty_queue_returns_at_once(amqp_url, classic_queue):
    t0 = time.monotonic()
    stats = drain_queue(amqp_url, classic_queue, lambda t, i: pytest.fail("no chunk expected"))
    assert stats.messages == 0 and time.monotonic() - t0 < 1.0


def test_drain_bad_arguments(amqp_url):
    with pytest.raises(ValueError, match="chunk_size"):
        drain_queue(amqp_url, "q", lambda t, i: None, chunk_size=0)
    with pytest.raises(R.QueueNotFound):
        drain_queue(amqp_url, "no-such-queue", lambda t, i: None)
    with pytest.raises(ValueError, match="unknown output format 'csv'"):
        check_format("csv")
    assert DrainStats("q", messages=10, seconds=2.0).rate == 5.0


def test_drain_connection_survives_a_long_write(amqp_url, amqp, classic_queue):
    """Heartbeats keep the connection (and its unacked chunk) alive while Spark writes."""
    amqp.publish(classic_queue, bodies(10))
    url = amqp_url + ("&" if "?" in amqp_url else "?") + "heartbeat=1"

    def slow_write(table, index):
        time.sleep(3.5)          # > 2 heartbeat intervals without any other traffic
        return None

    stats = drain_queue(url, classic_queue, slow_write, chunk_size=100)
    assert stats.messages == 10 and amqp.depth(classic_queue) == 0


KILLED_DRAIN = textwrap.dedent("""
    import sys, time
    from spark_integration.drain import drain_queue
    url, queue, marker = sys.argv[1:4]
    def write(table, index):
        open(marker, "w").write(str(table.num_rows))
        time.sleep(120)          # "writing" when SIGKILL arrives
    drain_queue(url, queue, write, chunk_size=1000)
""")


def test_drain_killed_mid_write_acks_nothing(amqp_url, amqp, classic_queue, tmp_path):
    amqp.publish(classic_queue, bodies(300))
    marker = tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRAIN, amqp_url, classic_queue,
                             str(marker)], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "drain process died early"
            assert time.monotonic() < deadline, "drain never started writing"
            time.sleep(0.05)
        assert amqp.depth(classic_queue) == 0             # all 300 held unacked by the drain
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    deadline = time.monotonic() + 15
    while amqp.depth(classic_queue) != 300:               # broker notices the dead socket
        assert time.monotonic() < deadline
        time.sleep(0.05)
    rest = amqp.take_all(classic_queue, 300)
    assert [d.body for d in rest] == bodies(300) and all(d.redelivered for d in rest)


# ------------------------------------------------------------------------------- streams
def test_split_range():
    assert R.split_range(0, 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert R.split_range(5, 7, 4) == [(5, 6), (6, 7)]
    assert R.split_range(3, 3, 2) == []
    assert R.split_range(9, 3, 2) == []


class FakeTail:
    def __init__(self, tail, first=0):
        self.tail, self.first, self.calls = tail, first, []

    def __call__(self, params, queue, where, timeout=2.0, **kw):
        self.calls.append(where)
        return self.first if where == "first" else self.tail


@pytest.fixture
def stream_reader(monkeypatch):
    pytest.importorskip("pyspark")
    from spark_integration.options import SourceOptions
    from spark_integration.source import AmqpStreamReader

    def make(tail, first=0, **opts):
        fake = FakeTail(tail, first)
        monkeypatch.setattr(R, "probe_stream", fake)
        o = {"url": "amqp://127.0.0.1:1/", "queue": "s", "queueType": "stream"}
        o.update({k: str(v) for k, v in opts.items()})
        return AmqpStreamReader(SourceOptions.parse(o)), fake
    return make


def test_stream_initial_offsets(stream_reader):
    r, _ = stream_reader(tail=50, first=10, startingOffsets="earliest")
    assert r.initialOffset() == {"offset": 10}
    r, _ = stream_reader(tail=50, first=10)                        # streaming default: latest
    assert r.initialOffset() == {"offset": 50}
    r, _ = stream_reader(tail=50, startingOffsets="42")
    assert r.initialOffset() == {"offset": 42}
    r, _ = stream_reader(tail=None, startingOffsets="latest")        # empty stream
    assert r.initialOffset() == {"offset": 0}


def test_stream_latest_offset_respects_limits(stream_reader):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    r, _ = stream_reader(tail=100, maxOffsetsPerTrigger=30)
    assert r.getDefaultReadLimit() == ReadMaxRows(30)
    assert r.latestOffset({"offset": 10}, ReadMaxRows(30)) == {"offset": 40}
    assert r.latestOffset({"offset": 90}, ReadMaxRows(30)) == {"offset": 100}
    assert r.latestOffset({"offset": 10}, ReadAllAvailable()) == {"offset": 100}
    start = {"offset": 100}
    assert r.latestOffset(start, ReadAllAvailable()) is start       # no new data
    r, _ = stream_reader(tail=None)
    assert r.latestOffset({"offset": 3}, ReadAllAvailable()) == {"offset": 3}
    assert isinstance(stream_reader(tail=1)[0].getDefaultReadLimit(), ReadAllAvailable)


def test_stream_available_now_stops_at_the_tail_seen_at_start(stream_reader):
    from pyspark.sql.streaming.datasource import ReadMaxRows
    r, fake = stream_reader(tail=25, maxOffsetsPerTrigger=10)
    r.prepareForTriggerAvailableNow()
    fake.tail = 1000                                                 # data keeps arriving
    ends, start = [], {"offset": 0}
    while True:
        end = r.latestOffset(start, ReadMaxRows(10))
        if end == start:
            break
        ends.append(end["offset"])
        start = end
    assert ends == [10, 20, 25]
    assert fake.calls == ["last"]                                   # probed once, at start


def test_stream_partitions_are_offset_ranges(stream_reader):
    r, _ = stream_reader(tail=0, numPartitions=3)
    parts = r.partitions({"offset": 100}, {"offset": 110})
    assert [(p.start, p.end) for p in parts] == [(100, 104), (104, 107), (107, 110)]
    assert r.partitions({"offset": 5}, {"offset": 5}) == []


def test_stream_range_reads_exactly_the_range(amqp_url, amqp, stream_queue):
    amqp.publish(stream_queue, bodies(40, "s"))
    p = params(amqp_url)
    assert R.probe_stream(p, stream_queue, "first") == 0
    assert R.probe_stream(p, stream_queue, "last") == 40
    assert R.inspect_queue(p, stream_queue, "auto").type == "stream"
    for start, end in [(0, 40), (5, 17), (39, 40), (0, 1)]:
        rows = rows_from_batches(R.read_stream_range(p, stream_queue, start, end, batch_rows=8))
        assert [r["offset"] for r in rows] == list(range(start, end))
        assert [r["body"] for r in rows] == bodies(40, "s")[start:end]
    assert amqp.depth(stream_queue) in (0, 40)            # reading a stream removes nothing


def test_stream_range_on_a_classic_queue_is_an_error(amqp_url, amqp, classic_queue):
    amqp.publish(classic_queue, bodies(2))
    with pytest.raises(A.AMQPError, match="not a stream queue"):
        list(R.read_stream_range(params(amqp_url), classic_queue, 0, 2, read_timeout=2))
    assert amqp.depth(classic_queue) == 2


def test_stream_range_survives_its_node_dying(amqp_url, amqp, stream_queue, node_proxy, caplog):
    """url = node through a proxy, then the live node: the proxy dies after the first batch;
    the read reconnects and resumes after the last offset it kept (nothing twice, no gap)."""
    amqp.publish(stream_queue, bodies(3000, "s"))        # more than one credit window (1000)
    live = params(amqp_url).nodes()[0]
    proxy = node_proxy(live)
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port},{live[0]}:{live[1]}/%2F"
    reader = R.read_stream_range(params(url), stream_queue, 20, 2900, batch_rows=50)
    first = next(reader)
    proxy.kill()
    offsets = first.column("offset").to_pylist() + [
        o for b in reader for o in b.column("offset").to_pylist()]
    assert offsets == list(range(20, 2900))
    assert "connection lost at offset" in caplog.text                 # it did reconnect
