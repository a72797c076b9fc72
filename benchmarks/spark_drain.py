#!/usr/bin/env python3
"""Benchmark: drain N messages from a classic queue into Parquet with spark_integration.drain.

For each broker (this project's broker, started here as a subprocess, then RabbitMQ at
127.0.0.1:5672 when reachable) in the same run:

1. declare a fresh queue and publish N messages of --size bytes (publisher confirms,
   pipelined; every body starts with its sequence number);
2. drain it into Parquet, acking each chunk only after its file is written (consume ->
   Arrow -> write -> ack, the next chunk fetched while one is written), timed;
3. verify with Spark: the Parquet output holds N rows, N distinct bodies, and the queue is
   empty.

``--engine arrow`` (the default, ``auto``) writes each chunk with pyarrow from the driver;
``--engine spark`` runs one Spark job per chunk.  Reported: messages per second for the
drain (and its consume / write split), plus the publish rate for reference.  One
SparkSession (local[*]) serves both runs; a small warm-up drain runs first.

    python benchmarks/spark_drain.py                      # N = 1,000,000
    python benchmarks/spark_drain.py --count 200000 --engine spark --json
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

import spark_common as C

from spark_integration.drain import run_drain  # noqa: E402


def bench_broker(spark, name: str, url: str, args, tmp: str) -> dict:
    out = os.path.join(tmp, f"out-{name}")
    with C.fresh_queue(url, "spark-drain-bench") as queue:
        print(f"[{name}] publishing {args.count:,} x {args.size} B ...", file=sys.stderr)
        pub_rate = C.publish(url, queue, args.count, args.size)
        if C.depth(url, queue) != args.count:
            raise RuntimeError(f"[{name}] queue does not hold {args.count} messages")
        print(f"[{name}] draining into Parquet ({args.engine}) ...", file=sys.stderr)
        stats = run_drain(url, queue, out, "parquet", spark=spark, chunk_size=args.chunk_size,
                          engine=args.engine)
        df = spark.read.parquet(out)
        rows = df.count()
        distinct = df.select("body").distinct().count()
        left = C.depth(url, queue)
    shutil.rmtree(out, ignore_errors=True)
    ok = stats.messages == rows == distinct == args.count and left == 0
    return {"broker": name, "version": C.version(url), "messages": stats.messages,
            "seconds": round(stats.seconds, 2), "msgs_per_s": round(stats.rate),
            "consume_s": round(stats.consume_seconds, 2),
            "write_s": round(stats.write_seconds, 2), "chunks": stats.chunks,
            "publish_msgs_per_s": round(pub_rate), "verified": ok,
            "rows": rows, "distinct_bodies": distinct, "left_in_queue": left}


def warm_up(spark, url: str, tmp: str, engine: str) -> None:
    with C.fresh_queue(url, "spark-drain-warmup") as q:
        C.publish(url, q, 20000, 100)
        run_drain(url, q, os.path.join(tmp, "warmup"), "parquet", spark=spark,
                  chunk_size=10000, engine=engine)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_common_args(ap, 1_000_000)
    ap.add_argument("--chunk-size", type=int, default=100_000)
    ap.add_argument("--engine", default="auto", choices=("auto", "arrow", "spark"))
    args = ap.parse_args()
    results = []
    with C.brokers(args) as (tmp, targets):
        spark = C.spark_session(args.master, "spark-drain-bench")
        warm_up(spark, targets[0][1], tmp, args.engine)
        for name, url in targets:
            results.append(bench_broker(spark, name, url, args, tmp))
        spark.stop()
    return C.report(args, f"drain {args.count:,} x {args.size} B messages into Parquet (chunks "
                          f"of {args.chunk_size:,}, engine {args.engine}, ack after write)",
                    results, [("msgs_per_s", "drain msgs/s"), ("seconds", "seconds"),
                              ("consume_s", "consume s*"), ("write_s", "write s*"),
                              ("publish_msgs_per_s", "publish msgs/s"), ("verified", "verified")],
                    {"chunk_size": args.chunk_size, "engine": args.engine},
                    "* consume and write overlap (the next chunk is fetched while one is written)")


if __name__ == "__main__":
    sys.exit(main())
