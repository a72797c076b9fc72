#!/usr/bin/env python3
"""Benchmark: drain N messages from a queue into Parquet with spark_integration.drain.

For each broker (this project's broker, started here as a subprocess, then RabbitMQ at
127.0.0.1:5672 when reachable) in the same run:

1. declare a fresh queue and publish N messages of --size bytes (publisher confirms,
   pipelined; every body starts with its sequence number);
2. drain it into Parquet (consume -> Arrow -> Spark write -> ack, per chunk), timed;
3. verify: the Parquet output holds N rows, N distinct bodies, and the queue is empty.

Reported: messages per second for the drain (and its consume / write split), plus the
publish rate for reference.  One SparkSession (local[*]) serves both runs; a small
warm-up drain runs first so JVM start-up and first-job costs are not counted.

    python benchmarks/spark_drain.py                      # N = 1,000,000
    python benchmarks/spark_drain.py --count 200000 --json
    python benchmarks/spark_drain.py --no-rabbitmq --broker-url amqp://guest:guest@host:5673/%2F
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_integration.amqp import Connection, ConnectionParams  # noqa: E402
from spark_integration.drain import run_drain  # noqa: E402

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def start_broker(tmp: str) -> tuple[subprocess.Popen, str]:
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--host", "127.0.0.1",
         "--port", "0", "--port-file", port_file, "--admin-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("broker did not start")
        time.sleep(0.05)
    port = int(open(port_file).read().strip())
    return proc, f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def reachable(url: str) -> bool:
    p = ConnectionParams.from_url(url)
    try:
        socket.create_connection((p.host, p.port), timeout=2).close()
        return True
    except OSError:
        return False


def publish(url: str, queue: str, count: int, size: int, batch: int = 2000,
            window: int = 50000) -> float:
    """Publish ``count`` messages, pipelined with publisher confirms; returns msgs/s."""
    conn = Connection.connect(url)
    conn.confirm_select()
    template = conn.publish_frames("", queue, b"\0" * size)
    body_at = template.rindex(b"\0" * size)           # prefix = method + header + body hdr
    prefix, suffix = template[:body_at], template[body_at + size:]
    if len(suffix) != 1 or size + 8 > conn.frame_max:
        raise SystemExit("--size must fit in one frame")
    pad = b"x" * max(0, size - 12)
    t0 = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        frames = b"".join(prefix + (b"%012d" % i)[:size] + pad + suffix
                          for i in range(sent, sent + n))
        conn.publish_raw(frames, n)
        sent += n
        conn.wait_for_confirms(300, max_outstanding=window)
    conn.wait_for_confirms(300)
    rate = count / (time.perf_counter() - t0)
    conn.close()
    return rate


def bench_broker(spark, name: str, url: str, args, tmp: str) -> dict:
    queue = f"spark-drain-bench-{uuid.uuid4().hex[:8]}"
    out = os.path.join(tmp, f"out-{name}")
    with Connection.connect(url) as c:
        c.queue_declare(queue, durable=False)
    try:
        print(f"[{name}] publishing {args.count:,} x {args.size} B ...", file=sys.stderr)
        pub_rate = publish(url, queue, args.count, args.size)
        with Connection.connect(url) as c:
            depth = c.queue_declare(queue, passive=True)[1]
        if depth != args.count:
            raise RuntimeError(f"[{name}] queue holds {depth}, expected {args.count}")
        print(f"[{name}] draining into Parquet ...", file=sys.stderr)
        stats = run_drain(url, queue, out, "parquet", spark=spark, chunk_size=args.chunk_size)
        df = spark.read.parquet(out)
        rows = df.count()
        distinct = df.select("body").distinct().count()
        with Connection.connect(url) as c:
            left = c.queue_declare(queue, passive=True)[1]
        ok = stats.messages == rows == distinct == args.count and left == 0
        version = ""
        with Connection.connect(url) as c:
            v = c.server_properties.get("version")
            version = v.decode() if isinstance(v, bytes) else str(v or "")
        return {"broker": name, "version": version, "messages": stats.messages,
                "seconds": round(stats.seconds, 2), "msgs_per_s": round(stats.rate),
                "consume_s": round(stats.consume_seconds, 2),
                "write_s": round(stats.write_seconds, 2), "chunks": stats.chunks,
                "publish_msgs_per_s": round(pub_rate), "verified": ok,
                "rows": rows, "distinct_bodies": distinct, "left_in_queue": left}
    finally:
        with Connection.connect(url) as c:
            c.queue_delete(queue)
        shutil.rmtree(out, ignore_errors=True)


def warm_up(spark, url: str, tmp: str) -> None:
    q = f"spark-drain-warmup-{uuid.uuid4().hex[:8]}"
    with Connection.connect(url) as c:
        c.queue_declare(q)
    publish(url, q, 20000, 100)
    run_drain(url, q, os.path.join(tmp, "warmup"), "parquet", spark=spark, chunk_size=10000)
    with Connection.connect(url) as c:
        c.queue_delete(q)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--chunk-size", type=int, default=100_000)
    ap.add_argument("--broker-url", default=None,
                    help="use this broker instead of starting exchange_broker")
    ap.add_argument("--rabbitmq-url", default=RABBITMQ_URL)
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="spark-drain-bench-")
    proc = None
    results = []
    try:
        if args.broker_url:
            ours = args.broker_url
        else:
            proc, ours = start_broker(tmp)
        spark = (SparkSession.builder.master(args.master).appName("spark-drain-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        warm_up(spark, ours, tmp)
        results.append(bench_broker(spark, "exchange-broker", ours, args, tmp))
        if not args.no_rabbitmq:
            if reachable(args.rabbitmq_url):
                results.append(bench_broker(spark, "RabbitMQ", args.rabbitmq_url, args, tmp))
            else:
                print(f"RabbitMQ not reachable at {args.rabbitmq_url}; skipped", file=sys.stderr)
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    if args.json:
        print(json.dumps({"count": args.count, "size": args.size,
                          "chunk_size": args.chunk_size, "results": results}, indent=2))
    else:
        print(f"\ndrain {args.count:,} x {args.size} B messages into Parquet "
              f"(chunks of {args.chunk_size:,}, Spark {args.master})")
        head = f"{'broker':<22}{'drain msgs/s':>14}{'seconds':>10}{'consume s':>11}" \
               f"{'write s':>9}{'publish msgs/s':>16}  verified"
        print(head)
        print("-" * len(head))
        for r in results:
            label = f"{r['broker']} {r['version']}".strip()
            print(f"{label:<22}{r['msgs_per_s']:>14,}{r['seconds']:>10}{r['consume_s']:>11}"
                  f"{r['write_s']:>9}{r['publish_msgs_per_s']:>16,}  {r['verified']}")
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
