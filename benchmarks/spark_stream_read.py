#!/usr/bin/env python3
"""Benchmark: a stream queue read in parallel offset ranges by the executors, into Parquet.

For each broker (this project's broker with a data directory, then RabbitMQ when reachable)
in the same run:

1. declare a fresh stream queue and publish N messages of --size bytes (confirms);
2. ``spark.read.format("amqp").option("numPartitions", P)``: P tasks, each consuming its own
   offset range on its own connection, then ``.write.parquet(...)`` in the same tasks; timed
   from the start of the action (planning, which locates the head and tail of the stream,
   included);
3. verify: the Parquet output holds N rows with N distinct offsets.

A warm-up read (``--warm-up`` messages, 50,000 by default, not timed) runs first, so neither
broker's figure includes the first job's costs (JIT compilation in the JVM, the Python
workers importing pyspark and this package); without it the first broker measured paid them.

    python benchmarks/spark_stream_read.py                    # N = 500,000, P = 4
    python benchmarks/spark_stream_read.py --count 1000000 --partitions 8 --json
    python benchmarks/spark_stream_read.py --stream-read amqp    # ours over AMQP too

This broker's stream is read as the store's chunks through its admin API (``streamRead``, see
spark_integration/README.md) unless ``--stream-read amqp``; RabbitMQ's over AMQP (its
management API serves no chunks).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import spark_common as C


def bench(spark, name: str, url: str, args, tmp: str) -> dict:
    out = os.path.join(tmp, f"out-{name}")
    with C.fresh_queue(url, "spark-stream-bench", {"x-queue-type": "stream"}, True) as queue:
        print(f"[{name}] publishing {args.count:,} x {args.size} B ...", file=sys.stderr)
        pub = C.publish(url, queue, args.count, args.size)
        time.sleep(1.0)       # let the stream settle (RabbitMQ commits chunks asynchronously)
        print(f"[{name}] reading into Parquet with {args.partitions} partitions ...",
              file=sys.stderr)
        t0 = time.perf_counter()
        reader = (spark.read.format("amqp").option("url", url).option("queue", queue)
                  .option("queueType", "stream").option("numPartitions", str(args.partitions))
                  .option("batchSize", str(args.batch_size)))
        admin = C.ADMIN_URLS.get(url)  # this broker's admin API (RabbitMQ's has no chunks)
        if admin and args.stream_read != "amqp":
            reader = reader.option("adminUrl", admin).option("streamRead", args.stream_read)
        df = reader.load()
        df.write.mode("overwrite").parquet(out)
        seconds = time.perf_counter() - t0
        back = spark.read.parquet(out)
        rows = back.count()
        distinct = back.select("offset").distinct().count()
    shutil.rmtree(out, ignore_errors=True)
    return {"broker": name, "version": C.version(url), "rows": rows, "seconds": round(seconds, 2),
            "read_via": "chunks" if C.ADMIN_URLS.get(url) and args.stream_read != "amqp" else "amqp",
            "msgs_per_s": round(rows / seconds), "publish_msgs_per_s": round(pub),
            "verified": rows == distinct == args.count}


def warm_up(spark, url: str, count: int, tmp: str) -> None:
    with C.fresh_queue(url, "spark-stream-warmup", {"x-queue-type": "stream"}, True) as queue:
        C.publish(url, queue, count, 100)
        (spark.read.format("amqp").option("url", url).option("queue", queue)
         .option("queueType", "stream").option("numPartitions", "2").load()
         .write.mode("overwrite").parquet(os.path.join(tmp, "warm-up")))
    shutil.rmtree(os.path.join(tmp, "warm-up"), ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_common_args(ap, 500_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=20000)
    ap.add_argument("--stream-read", choices=("auto", "chunks", "amqp"), default="auto",
                    help="how this broker's stream is read: auto (default: the store's chunks "
                         "through its admin API), chunks, or amqp (as RabbitMQ's always is)")
    ap.add_argument("--warm-up", type=int, default=50000,
                    help="messages read (untimed) before the measured runs; 0: none")
    args = ap.parse_args()
    results = []
    with C.brokers(args, durable=True) as (tmp, targets):
        spark = C.spark_session(args.master, "spark-stream-read-bench")
        if args.warm_up > 0:
            print(f"warm-up: reading {args.warm_up:,} messages (not timed) ...", file=sys.stderr)
            warm_up(spark, targets[0][1], args.warm_up, tmp)
        for name, url in targets:
            results.append(bench(spark, name, url, args, tmp))
        spark.stop()
    return C.report(args, f"stream queue -> Parquet: {args.count:,} x {args.size} B, "
                          f"{args.partitions} offset ranges, Spark {args.master}", results,
                    [("msgs_per_s", "read msgs/s"), ("seconds", "seconds"),
                     ("publish_msgs_per_s", "publish/s"), ("verified", "verified")],
                    {"partitions": args.partitions, "warm_up": args.warm_up})


if __name__ == "__main__":
    sys.exit(main())
