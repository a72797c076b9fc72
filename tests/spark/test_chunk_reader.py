"""Stream ranges read as the store's chunks through the admin API (spark_integration/chunk_reader.py,
streamRead): the same rows as an AMQP read of the same offsets, retention and fallbacks handled.
A real broker process with a SQLite store and its admin API; real Spark for the end-to-end read."""

from __future__ import annotations

import threading

import pika
import pytest

from eb_support import close_quietly, free_port, pika_connect, wait_until
from spark_integration import reader as R
from spark_integration.chunk_reader import ChunksUnavailable
from spark_integration.options import SourceOptions


def _props(i: int):
    kinds = i % 4
    if kinds == 0:
        return pika.BasicProperties()
    if kinds == 1:
        return pika.BasicProperties(headers={"n": i, "s": "x", "nested": {"a": [1, "b"]}})
    if kinds == 2:
        return pika.BasicProperties(content_type="text/plain", message_id=f"id-{i}", priority=3,
                                    timestamp=1_700_000_000 + i, delivery_mode=2)
    return pika.BasicProperties(headers={"x-stream-offset": 12345}, app_id="republisher")


@pytest.fixture
def stored(spawn_broker, workdir):
    admin = free_port()
    proc = spawn_broker("--data-dir", str(workdir / "data"), "--admin-port", str(admin))
    assert wait_until(lambda: _up(admin), 10)
    return proc, f"http://127.0.0.1:{admin}"


def _up(port: int) -> bool:
    import urllib.request
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health/checks/alarms", timeout=1)
    except Exception as exc:  # noqa: BLE001 - 401 means it is up
        return "401" in str(exc)
    return True


def _publish(port: int, queue: str, n: int, arguments: dict | None = None) -> None:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream", **(arguments or {})})
        ch.confirm_delivery()
        exchanges = ("", "amq.direct")
        if n > 10:
            ch.queue_bind(queue, "amq.direct", routing_key="rk")
        for i in range(n):
            ex = exchanges[i % 2 if n > 10 else 0]
            ch.basic_publish(ex, queue if ex == "" else "rk", b"body-%d" % i, _props(i))
    finally:
        close_quietly(conn)


def _opts(proc, admin_url: str | None, queue: str, **extra) -> SourceOptions:
    options = {"url": proc.url, "queue": queue, "queueType": "stream", "batchSize": "700"}
    if admin_url:
        options["adminUrl"] = admin_url
    options.update(extra)
    return SourceOptions.parse(options)


def _rows(opts, start: int, end: int) -> list[dict]:
    import pyarrow as pa
    got = list(R.read_stream(opts, start, end))
    return pa.Table.from_batches(got).to_pylist() if got else []


def test_chunk_reads_give_the_rows_an_amqp_read_gives(stored):
    proc, admin_url = stored
    _publish(proc.port, "events", 3000)
    amqp = _opts(proc, admin_url, "events", streamRead="amqp")
    chunks = _opts(proc, admin_url, "events", streamRead="chunks")
    for start, end in ((0, 3000), (123, 2101), (2999, 3000)):
        via_chunks = _rows(chunks, start, end)
        assert via_chunks == _rows(amqp, start, end)
        assert [r["offset"] for r in via_chunks] == list(range(start, end))
    row = _rows(chunks, 2, 3)[0]
    assert row["properties"]["message_id"] == "id-2" and row["properties"]["priority"] == 3
    assert row["timestamp"].timestamp() == 1_700_000_002
    assert dict(_rows(chunks, 3, 4)[0]["headers"]) == {"x-stream-offset": "3"}  # replaced
    assert _rows(chunks, 1, 2)[0]["exchange"] == "amq.direct"


def test_offsets_not_committed_yet_come_over_amqp_and_auto_falls_back(stored):
    proc, admin_url = stored
    _publish(proc.port, "tail", 50)
    auto = _opts(proc, admin_url, "tail")
    # [40, 60): the store covers 40-49; 50-59 are published while the read waits for them
    it = R.read_stream(auto, 40, 60)
    threading.Timer(0.5, lambda: _publish(proc.port, "tail", 10)).start()
    import pyarrow as pa
    rows = pa.Table.from_batches(list(it)).to_pylist()
    assert [r["offset"] for r in rows] == list(range(40, 60))
    # no chunks from this admin URL (not this broker's API): auto reads over AMQP, chunks fails
    bogus = f"http://127.0.0.1:{free_port()}"
    assert [r["offset"] for r in _rows(_opts(proc, bogus, "tail"), 0, 5)] == list(range(5))
    with pytest.raises(ChunksUnavailable):
        _rows(_opts(proc, bogus, "tail", streamRead="chunks"), 0, 5)


def test_retention_is_data_loss_unless_allowed(stored):
    proc, admin_url = stored
    _publish(proc.port, "short", 400, {"x-max-length-bytes": 4000,
                                       "x-stream-max-segment-size-bytes": 1000})
    with pytest.raises(R.DataLossError):
        _rows(_opts(proc, admin_url, "short", streamRead="chunks"), 0, 400)
    kept = _rows(_opts(proc, admin_url, "short", streamRead="chunks", failOnDataLoss="false"), 0, 400)
    assert kept and kept[-1]["offset"] == 399 and kept[0]["offset"] > 0
    assert [r["offset"] for r in kept] == list(range(kept[0]["offset"], 400))


def test_spark_reads_a_stored_stream_through_chunks(spark, stored):
    proc, admin_url = stored
    _publish(proc.port, "big", 2000)
    df = (spark.read.format("amqp").option("url", proc.url).option("queue", "big")
          .option("adminUrl", admin_url).option("streamRead", "chunks")
          .option("numPartitions", "3").load())
    got = df.select("offset", "body").collect()
    assert sorted(r.offset for r in got) == list(range(2000))
    assert {bytes(r.body) for r in got} == {b"body-%d" % i for i in range(2000)}


def test_stream_read_option_is_checked():
    with pytest.raises(ValueError, match="streamRead"):
        SourceOptions.parse({"url": "amqp://h", "queue": "q", "streamRead": "sideways"})
    with pytest.raises(ValueError, match="adminUrl"):
        SourceOptions.parse({"url": "amqp://h", "queue": "q", "streamRead": "chunks"})


def test_plain_messages_in_big_chunks_are_sliced_exactly(stored):
    """Messages without properties published in bursts: chunks of many, read as Arrow slices of
    the blobs; any range, cutting chunks anywhere, gives the AMQP read's rows."""
    proc, admin_url = stored
    conn = pika_connect(proc.port)
    try:
        ch = conn.channel()
        ch.queue_declare("plain", durable=True, arguments={"x-queue-type": "stream"})
        for burst in range(5):
            for i in range(1000):  # no confirms: published without waiting, many per commit
                ch.basic_publish("", "plain", b"p-%d-%d" % (burst, i))
    finally:
        close_quietly(conn)
    import urllib.request
    from base64 import b64encode

    from persistence.stream_chunks import read_frames

    def answer():
        req = urllib.request.Request(f"{admin_url}/api/stream-chunks/%2F/plain", headers={
            "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.headers["X-Stream-To"], resp.read()
    assert wait_until(lambda: answer()[0] == "5000", 10)  # all committed
    sizes = [c.n for _first, c in read_frames(answer()[1])]
    assert sum(sizes) == 5000 and max(sizes) > 1  # chunks of many (how many depends on timing)
    amqp = _opts(proc, admin_url, "plain", streamRead="amqp")
    chunks = _opts(proc, admin_url, "plain", streamRead="chunks")
    for start, end in ((0, 5000), (777, 4321), (1999, 2001)):
        assert _rows(chunks, start, end) == _rows(amqp, start, end)


def test_an_answer_that_breaks_off_is_finished_over_amqp(stored):
    """The admin API's answer stops halfway (its node died): the read goes on over AMQP from
    the offset after the last row it kept; nothing twice, nothing missing. A real HTTP server in
    front of the broker's admin API cuts the answer off."""
    import http.server
    import urllib.request
    from base64 import b64encode

    proc, admin_url = stored
    _publish(proc.port, "cut", 1200)

    class Cutter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            req = urllib.request.Request(admin_url + self.path, headers={
                "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
            with urllib.request.urlopen(req, timeout=10) as resp:
                body = resp.read()
                self.send_response(200)
                for name in ("Content-Type", "X-Stream-From", "X-Stream-To"):
                    self.send_header(name, resp.headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])  # then the connection closes
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cutter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cut_url = f"http://127.0.0.1:{server.server_address[1]}"
        rows = _rows(_opts(proc, cut_url, "cut", streamRead="chunks"), 0, 1200)
        expected = _rows(_opts(proc, admin_url, "cut", streamRead="amqp"), 0, 1200)
        assert [r["offset"] for r in rows] == list(range(1200))
        for r in rows + expected:  # tags count from 1 again in the read that takes over
            r.pop("delivery_tag")
        assert rows == expected
    finally:
        server.shutdown()
        server.server_close()
