#!/usr/bin/env python3
"""One load process of the leaders-mode cluster benchmark (``cluster_leaders_bench.py``): one
producer and one consumer connected to ``--port``, on a durable queue that already exists (it was
declared on its leader node, which may be another node: then every publish and delivery crosses a
link between the nodes).

amqp_load.py's persistent scenario with its usual settings (100-byte persistent messages, confirms
with at most 500 unconfirmed, batches of 256, basic.qos 200, acks multiple every 50), timed:
consumed msg/s over ``--seconds`` after ``--warmup``. Each body carries its sequence number; after
the window the producer stops, every publish is settled, and the run waits until every confirmed
message was consumed at least once (``missing`` counts the ones that never came).

    python benchmarks/leaders_load.py --port 40123 --queue bench-0 --seconds 8
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from leaders_clients import (MAX_UNCONFIRMED, SeqConsumer, TrackingProducer, check_open,  # noqa: E402
                             consumed_all, open_pair, publish_template)
from loadgen.client import AMQPError, run_loop  # noqa: E402
from loadgen.publisher import Publisher  # noqa: E402
from loadgen.waits import confirmed  # noqa: E402


async def run(opts) -> dict:
    loop = asyncio.get_running_loop()
    nacked: list[int] = []
    prod = TrackingProducer("producer", lambda tags, acked: None if acked else nacked.extend(tags))
    cons = SeqConsumer("consumer")
    try:
        await open_pair(opts.port, opts.queue, prod, cons)
        message, offset = publish_template(opts.queue, min(prod.frame_max, cons.frame_max))
        batch = max(1, min(opts.batch, (256 * 1024) // len(message)))
        pub = Publisher(prod, message, batch, window=MAX_UNCONFIRMED, seq_offset=offset)
        task = asyncio.ensure_future(pub.run())
        samples = []
        t0 = loop.time()
        for mark in (opts.warmup, opts.seconds):
            done, _ = await asyncio.wait({task}, timeout=max(0.0, t0 + mark - loop.time()))
            if done:
                task.result()
                raise AMQPError("the publisher stopped")
            check_open(prod, cons)
            samples.append((loop.time(), pub.published, cons.deliveries, prod.confirmed))
        pub.stopped = True
        await asyncio.wait_for(task, 10)
        await confirmed(prod, pub.published, "leaders_load")
        lost = set(nacked)
        wanted = [s for s in range(1, pub.published + 1) if s not in lost]
        missing = await consumed_all(cons, wanted, opts.stall)
        (ta, pa, ca, fa), (tb, pb, cb, fb) = samples
        dt = tb - ta
        return {"port": opts.port, "queue": opts.queue, "window_s": round(dt, 3),
                "consumed_per_s": round((cb - ca) / dt, 1), "published_per_s": round((pb - pa) / dt, 1),
                "confirmed_per_s": round((fb - fa) / dt, 1), "published": pub.published,
                "confirmed": prod.confirmed, "nacked": prod.nacked, "consumed": cons.deliveries,
                "distinct": cons.seen.distinct, "redelivered": cons.seen.repeats, "missing": len(missing),
                "missing_first": missing[:10], "verify_ok": not missing and not prod.nacked,
                "client_cpu_s": round(time.process_time(), 3)}
    finally:
        for c in (cons, prod):
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--queue", required=True, help="a durable queue that exists on the node of --port")
    p.add_argument("--seconds", type=float, default=8.0, help="run time including the warm-up")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--stall", type=float, default=30.0,
                   help="give up waiting for the confirmed messages after this many seconds without one")
    opts = p.parse_args(argv)
    if opts.seconds - opts.warmup < 0.5:
        print("--seconds must exceed --warmup by at least 0.5", file=sys.stderr)
        return 2
    try:
        result = run_loop(run(opts))
    except (AMQPError, OSError, asyncio.TimeoutError) as exc:
        print(f"error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
