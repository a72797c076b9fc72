#!/usr/bin/env python3
"""Stream queue benchmark: this broker against RabbitMQ's stream queues, in the same run.

For each broker:

1. declare a fresh stream queue (``x-queue-type: stream``, durable);
2. publish ``--count`` messages of ``--size`` bytes (default 1,000,000 x 100 B) on one
   connection in confirm mode, at most ``--max-unconfirmed`` in flight; the publish phase
   ends when the last confirm arrives (every message is durably in the log);
3. read the whole stream back from ``x-stream-offset: first`` with ``--consumers``
   (default 2) independent consumers, each on its own connection, with ``basic.qos``
   prefetch ``--prefetch`` and ``basic.ack multiple`` every prefetch/2 deliveries; the
   read phase ends when every consumer has received every message;
4. delete the queue.

Reported: published (confirmed) msgs/s, and read msgs/s = consumers x count / read time
(plus each consumer's own rate). This broker runs as a subprocess on a free port with a
temporary ``--data-dir`` (SQLite); RabbitMQ is expected at ``--rabbit-host:--rabbit-port``
(default 127.0.0.1:5672, guest/guest) and skipped when unreachable.

The client is the lean raw-frame client in ``loadgen/`` (uvloop when installed). With ``--port``
only the broker at ``--host:--port`` is measured and its result printed (``compare.py`` runs it
that way, with ``--pid`` to report the broker's RSS).

Examples::

    python benchmarks/stream_bench.py                         # 1,000,000 messages, both brokers
    python benchmarks/stream_bench.py --count 200000 --json
    python benchmarks/stream_bench.py --no-rabbitmq --count 100000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pamqp import commands  # noqa: E402

from loadgen.brokers import BrokerFailed, OurBroker, port_open  # noqa: E402
from loadgen.client import AMQPError, Connection, run_loop  # noqa: E402
from loadgen.procs import rss_bytes  # noqa: E402
from loadgen.publisher import Publisher  # noqa: E402
from loadgen.wire import encode_publish, server_name  # noqa: E402
from loadgen import waits  # noqa: E402


# --------------------------------------------------------------------------
# One run against one broker
# --------------------------------------------------------------------------
async def run_one(label: str, host: str, port: int, opts, rss=None) -> dict:
    qname = f"stream-bench-{uuid.uuid4().hex[:10]}"
    args = (host, port, opts.user, opts.password, "/", 0, 10.0)
    prod = Connection(f"{label}-producer")
    consumers = [Connection(f"{label}-consumer-{i}") for i in range(opts.consumers)]
    result: dict = {"broker": label, "count": opts.count, "size": opts.size,
                    "consumers": opts.consumers, "prefetch": opts.prefetch,
                    "max_unconfirmed": opts.max_unconfirmed}
    declared = False
    try:
        await prod.open(*args)
        result["server"] = server_name(prod.server_properties)
        await prod.rpc(commands.Queue.Declare(queue=qname, durable=True,
                                              arguments={"x-queue-type": "stream"}),
                       "Queue.DeclareOk")
        declared = True
        await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        message = encode_publish(Connection.CHANNEL, "", qname, bytes(opts.size), 2,
                                 prod.frame_max)
        batch = max(1, min(256, (256 * 1024) // len(message)))
        pub = Publisher(prod, message, batch, window=opts.max_unconfirmed, limit=opts.count)
        loop = asyncio.get_running_loop()

        # -- publish --------------------------------------------------------------------------
        t0 = loop.time()
        await pub.run()
        await waits.confirmed(prod, opts.count, label)
        t_pub = loop.time() - t0
        if prod.nacked:
            raise AMQPError(f"{label}: {prod.nacked} publishes nacked")
        result["publish_seconds"] = round(t_pub, 3)
        result["published_per_s"] = round(opts.count / t_pub, 1)
        if rss is not None:
            result["broker_rss_mb_after_publish"] = rss()

        # -- read back from "first" with independent consumers -----------------------------------
        for c in consumers:
            await c.open(*args)
            await c.rpc(commands.Basic.Qos(prefetch_count=opts.prefetch), "Basic.QosOk")
            c.ack_every = max(1, opts.prefetch // 2)
        t1 = loop.time()
        done_at: dict[int, float] = {}
        for i, c in enumerate(consumers):
            await c.rpc(commands.Basic.Consume(queue=qname, consumer_tag=f"reader-{i}",
                                               arguments={"x-stream-offset": "first"}),
                        "Basic.ConsumeOk")
        peak = 0.0

        def tick(now: float) -> None:
            nonlocal peak
            for i, c in enumerate(consumers):
                if i not in done_at and c.deliveries >= opts.count:
                    done_at[i] = now
            if rss is not None and int(now * 2) != int((now - 0.01) * 2):
                peak = max(peak, rss() or 0.0)

        await waits.read(consumers, lambda: len(done_at) == len(consumers), label, tick)
        t_read = max(done_at.values()) - t1
        result["read_seconds"] = round(t_read, 3)
        result["read_per_s"] = round(opts.count * len(consumers) / t_read, 1)
        result["per_consumer_per_s"] = [round(opts.count / (done_at[i] - t1), 1)
                                        for i in range(len(consumers))]
        result["deliveries"] = [c.deliveries for c in consumers]
        if rss is not None:
            result["broker_rss_mb_peak_read"] = round(peak, 1)
        for c in consumers:
            c._flush_acks()  # noqa: SLF001
    finally:
        for c in consumers:
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
        if declared and prod.error is None:
            try:
                await prod.rpc(commands.Queue.Delete(queue=qname), "Queue.DeleteOk", timeout=60)
            except Exception as exc:  # noqa: BLE001
                print(f"warning: {label}: queue.delete failed: {exc}", file=sys.stderr)
        try:
            await prod.close()
        except Exception:  # noqa: BLE001
            pass
    return result


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1_000_000, help="messages (default 1,000,000)")
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    p.add_argument("--consumers", type=int, default=2, help="independent readers (default 2)")
    p.add_argument("--prefetch", type=int, default=2000, help="consumer prefetch (default 2000)")
    p.add_argument("--max-unconfirmed", type=int, default=10000,
                   help="publishes in flight awaiting confirm (default 10000)")
    p.add_argument("--host", default="127.0.0.1", help="with --port: the broker to measure")
    p.add_argument("--port", type=int, default=0,
                   help="measure only the broker at --host:--port and print its result "
                        "(default: start ours, then RabbitMQ, and compare)")
    p.add_argument("--pid", type=int, default=0,
                   help="with --port: the broker's process id, to report its RSS")
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--rabbit-host", default="127.0.0.1")
    p.add_argument("--rabbit-port", type=int, default=5672)
    p.add_argument("--no-rabbitmq", action="store_true", help="only this broker")
    p.add_argument("--no-ours", action="store_true", help="only RabbitMQ")
    p.add_argument("--broker-arg", action="append", default=[],
                   help="extra argument for `exchange_broker serve` (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-uvloop", action="store_true")
    return p


def _rss_mb(pid: int):
    def read() -> float | None:
        try:
            return round(rss_bytes(pid) / 2**20, 1)
        except (OSError, RuntimeError):
            return None
    return read if pid else None


async def main_async(opts) -> list[dict]:
    if opts.port:
        return [await run_one(opts.host, opts.host, opts.port, opts, rss=_rss_mb(opts.pid))]
    results = []
    if not opts.no_ours:
        ours = OurBroker(["--heartbeat", "0", "--log-level", "WARNING", *opts.broker_arg])
        try:
            ours.start()
            results.append(await run_one("exchange-broker", "127.0.0.1", ours.port, opts,
                                         rss=_rss_mb(ours.pid)))
        except (AMQPError, OSError, asyncio.TimeoutError):
            print(ours.log_tail(), file=sys.stderr)
            raise
        finally:
            ours.stop()
    if not opts.no_rabbitmq:
        if port_open(opts.rabbit_host, opts.rabbit_port, 2.0):
            results.append(await run_one("RabbitMQ", opts.rabbit_host, opts.rabbit_port, opts))
        else:
            print(f"RabbitMQ not reachable at {opts.rabbit_host}:{opts.rabbit_port}: skipped",
                  file=sys.stderr)
    return results


def print_table(results: list[dict]) -> None:
    rabbit = next((r for r in results if r["broker"] == "RabbitMQ"), None)
    print(f"{results[0]['count']:,} messages x {results[0]['size']} B; "
          f"{results[0]['consumers']} consumers from 'first', prefetch {results[0]['prefetch']}; "
          f"publisher confirms, {results[0]['max_unconfirmed']} in flight")
    head = f"{'broker':<26} {'publish msg/s':>14} {'read msg/s':>12} {'per consumer':>22}"
    if rabbit:
        head += f" {'publish ratio':>14} {'read ratio':>11}"
    print(head)
    for r in results:
        per = " / ".join(f"{x:,.0f}" for x in r["per_consumer_per_s"])
        line = (f"{r['server'][:26]:<26} {r['published_per_s']:>14,.0f} {r['read_per_s']:>12,.0f} "
                f"{per:>22}")
        if rabbit:
            line += (f" {r['published_per_s'] / rabbit['published_per_s']:>14.2f}"
                     f" {r['read_per_s'] / rabbit['read_per_s']:>11.2f}")
        print(line)
    for r in results:
        if "broker_rss_mb_peak_read" in r:
            print(f"{r['server']}: RSS {r['broker_rss_mb_after_publish']:.0f} MB after publishing, "
                  f"peak {r['broker_rss_mb_peak_read']:.0f} MB while reading")


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        results = run_loop(main_async(opts), opts.no_uvloop)
    except (AMQPError, OSError, BrokerFailed, asyncio.TimeoutError) as exc:
        if opts.json and opts.port:
            print(json.dumps({"host": opts.host, "port": opts.port, "error": str(exc)}))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not results:
        return 2
    if opts.json:
        print(json.dumps(results[0] if opts.port else results))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
