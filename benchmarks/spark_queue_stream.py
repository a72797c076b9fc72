#!/usr/bin/env python3
"""Benchmark: readStream over a classic queue into Parquet, each micro-batch acked on commit.

For each broker (this project's broker, then RabbitMQ when reachable) in the same run:

1. declare a fresh classic queue and publish N messages of --size bytes (confirms);
2. ``spark.readStream.format("amqp")`` with ``maxMessagesPerTrigger`` M and
   ``trigger(availableNow=True)`` into a Parquet file sink: the source on the driver holds
   each batch unacked on its one connection, ships it to the executors in the partitions and
   acks it once Spark committed it; timed from start() to the end of the query;
3. verify: the output holds N rows with N distinct bodies and the queue is empty.

Reported: msgs/s over the whole query (start-up included) and after the first batch (rows
over the later batches' trigger time, from the query's progress reports).

    python benchmarks/spark_queue_stream.py                   # N = 300,000, M = 50,000
    python benchmarks/spark_queue_stream.py --dedupe          # with dedupe=messageId state
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import spark_common as C


def bench(spark, name: str, url: str, args, tmp: str) -> dict:
    out, ck = os.path.join(tmp, f"out-{name}"), os.path.join(tmp, f"ck-{name}")
    with C.fresh_queue(url, "spark-queue-stream-bench") as queue:
        print(f"[{name}] publishing {args.count:,} x {args.size} B ...", file=sys.stderr)
        C.publish(url, queue, args.count, args.size)
        r = (spark.readStream.format("amqp").option("url", url).option("queue", queue)
             .option("queueType", "classic").option("numPartitions", str(args.partitions))
             .option("maxMessagesPerTrigger", str(args.per_trigger)))
        if args.dedupe:
            r = r.option("dedupe", "messageId").option("stateLocation", f"{tmp}/state-{name}")
        t0 = time.perf_counter()
        q = (r.load().writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination()
        seconds = time.perf_counter() - t0
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        batches = len(progress)
        # after the first batch (query start-up): rows over the batches' trigger time
        later = progress[1:]
        steady = (sum(p["numInputRows"] for p in later) * 1000.0 /
                  max(1, sum(p["durationMs"]["triggerExecution"] for p in later))) if later else 0
        df = spark.read.parquet(out)
        rows, distinct = df.count(), df.select("body").distinct().count()
        left = C.depth(url, queue)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    return {"broker": name, "version": C.version(url), "rows": rows, "batches": batches,
            "seconds": round(seconds, 2), "msgs_per_s": round(rows / seconds),
            "steady_msgs_per_s": round(steady),
            "left_in_queue": left, "verified": rows == distinct == args.count and left == 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_common_args(ap, 300_000)
    ap.add_argument("--per-trigger", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--dedupe", action="store_true")
    args = ap.parse_args()
    results = []
    with C.brokers(args) as (tmp, targets):
        spark = C.spark_session(args.master, "spark-queue-stream-bench")
        for name, url in targets:
            results.append(bench(spark, name, url, args, tmp))
        spark.stop()
    return C.report(args, f"readStream classic queue -> Parquet: {args.count:,} x {args.size} B, "
                          f"{args.per_trigger:,} per trigger, {args.partitions} partitions"
                          f"{', dedupe=messageId' if args.dedupe else ''}, ack on commit",
                    results, [("msgs_per_s", "msgs/s"), ("steady_msgs_per_s", "after batch 0"),
                              ("seconds", "seconds"),
                              ("batches", "batches"), ("left_in_queue", "left"),
                              ("verified", "verified")],
                    {"per_trigger": args.per_trigger, "dedupe": args.dedupe})


if __name__ == "__main__":
    sys.exit(main())
