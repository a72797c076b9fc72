#!/usr/bin/env python3
"""Super stream benchmark: publish and consumer-group read rates for super streams of 1, 3 and 6
partitions against a single stream queue, in the same run on one broker.

For each target (``stream`` = one stream queue, ``ss-N`` = a super stream of N partitions):

1. declare it (durable; the super stream with ``x-partitions: N``);
2. publish ``--count`` messages of ``--size`` bytes (default 100,000 x 100 B) on one connection
   in confirm mode, ``--max-unconfirmed`` in flight, routing keys cycling over ``--keys``
   (default 256) fixed-width keys so the super stream spreads them over its partitions; the
   phase ends with the last confirm;
3. read everything from ``x-stream-offset: first``: the stream queue with one consumer (a stream
   cannot be split between consumers), a super stream with ``--members`` (default 3) members of
   one consumer group (``x-consumer-group``), each on its own connection, prefetch
   ``--prefetch``, ``basic.ack multiple`` every prefetch/2; the phase ends when every message
   was delivered once (the group's deliveries are counted together);
4. delete it.

Every target runs ``--rounds`` times (default 3), the order rotated each round; the table shows
the median rates and lists every run (the machine's other load makes single runs noisy).

This broker runs as a subprocess on a free port with a temporary ``--data-dir`` (SQLite). The
client is the lean raw-frame client of ``amqp_load.py``.

Examples::

    python benchmarks/super_stream_bench.py
    python benchmarks/super_stream_bench.py --count 100000 --partitions 1,3,6 --json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pamqp import commands  # noqa: E402

from loadgen import waits  # noqa: E402
from loadgen.brokers import OurBroker  # noqa: E402
from loadgen.client import AMQPError, Connection, run_loop  # noqa: E402
from loadgen.publisher import Publisher  # noqa: E402
from loadgen.wire import encode_publish, server_name  # noqa: E402


class KeyedPublisher(Publisher):
    """Publisher whose messages cycle over ``keys`` pre-encoded publishes (one per routing key)."""

    def __init__(self, conn: Connection, messages: list[bytes], batch: int, **kw) -> None:
        super().__init__(conn, messages[0], batch, **kw)
        self.n = len(messages)
        self.step = len(messages[0])
        self.ring = b"".join(messages[i % self.n] for i in range(batch + self.n))

    def _chunk(self, k: int) -> bytes:
        start = (self.published % self.n) * self.step
        return self.ring[start:start + k * self.step]


async def run_one(target: str, partitions: int, port: int, opts) -> dict:
    name = f"ssb-{target}-{uuid.uuid4().hex[:8]}"
    args = ("127.0.0.1", port, opts.user, opts.password, "/", 0, 10.0)
    prod = Connection(f"{target}-producer")
    readers = 1 if partitions == 0 else opts.members
    members = [Connection(f"{target}-member-{i}") for i in range(readers)]
    result = {"target": target, "partitions": partitions, "readers": readers, "count": opts.count}
    await prod.open(*args)
    result["server"] = server_name(prod.server_properties)
    try:
        if partitions:
            await prod.rpc(commands.Exchange.Declare(exchange=name, exchange_type="x-super-stream",
                                                     durable=True, arguments={"x-partitions": partitions}),
                           "Exchange.DeclareOk")
        else:
            await prod.rpc(commands.Queue.Declare(queue=name, durable=True,
                                                  arguments={"x-queue-type": "stream"}), "Queue.DeclareOk")
        await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        body = bytes(opts.size)
        if partitions:
            msgs = [encode_publish(Connection.CHANNEL, name, f"key-{i:06d}", body, 2, prod.frame_max)
                    for i in range(opts.keys)]
        else:  # the default exchange to the stream queue (same frame size: the key is its name)
            msgs = [encode_publish(Connection.CHANNEL, "", name, body, 2, prod.frame_max)]
        batch = max(1, min(256, (256 * 1024) // len(msgs[0])))
        pub = KeyedPublisher(prod, msgs, batch, window=opts.max_unconfirmed, limit=opts.count)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await pub.run()
        await waits.confirmed(prod, opts.count, target)
        t_pub = loop.time() - t0
        result["published_per_s"] = round(opts.count / t_pub, 1)

        for c in members:
            await c.open(*args)
            await c.rpc(commands.Basic.Qos(prefetch_count=opts.prefetch), "Basic.QosOk")
            c.ack_every = max(1, opts.prefetch // 2)
        t1 = loop.time()
        consume_args = {"x-stream-offset": "first"}
        if partitions:
            consume_args["x-consumer-group"] = "bench"
        for i, c in enumerate(members):
            await c.rpc(commands.Basic.Consume(queue=name, consumer_tag=f"m-{i}", arguments=consume_args),
                        "Basic.ConsumeOk")
        await waits.read(members, lambda: sum(c.deliveries for c in members) >= opts.count, target)
        t_read = loop.time() - t1
        result["read_per_s"] = round(opts.count / t_read, 1)
        result["per_reader"] = [c.deliveries for c in members]
        for c in members:
            c._flush_acks()  # noqa: SLF001
    finally:
        for c in members:
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
        try:
            if partitions:
                await prod.rpc(commands.Exchange.Delete(exchange=name), "Exchange.DeleteOk", timeout=60)
            else:
                await prod.rpc(commands.Queue.Delete(queue=name), "Queue.DeleteOk", timeout=60)
            await prod.close()
        except Exception as exc:  # noqa: BLE001
            print(f"warning: {target}: clean-up failed: {exc}", file=sys.stderr)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000, help="messages per target (default 100,000)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every target, medians reported (default 3)")
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    p.add_argument("--keys", type=int, default=256, help="distinct routing keys (default 256)")
    p.add_argument("--partitions", default="1,3,6", help="super stream sizes (default 1,3,6)")
    p.add_argument("--members", type=int, default=3, help="consumer group members (default 3)")
    p.add_argument("--prefetch", type=int, default=2000, help="per member (default 2000)")
    p.add_argument("--max-unconfirmed", type=int, default=10000)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--broker-arg", action="append", default=[],
                   help="extra argument for `exchange_broker serve` (repeatable)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-uvloop", action="store_true")
    return p


async def main_async(opts) -> list[dict]:
    """Every target ``--rounds`` times on one broker, the order rotated each round (so no target
    always runs first); per target the median rates, with the runs."""
    broker = OurBroker(opts.broker_arg).start()
    targets = [("stream", 0)] + [(f"ss-{n}", n) for n in
                                 (int(x) for x in opts.partitions.split(",") if x.strip())]
    runs: dict[str, list[dict]] = {t: [] for t, _n in targets}
    try:
        for r in range(opts.rounds):
            k = r % len(targets)
            for target, n in targets[k:] + targets[:k]:
                runs[target].append(await run_one(target, n, broker.port, opts))
    except Exception:
        print(broker.log_tail(), file=sys.stderr)
        raise
    finally:
        broker.stop()
    results = []
    for target, _n in targets:
        got = runs[target]
        out = dict(got[0])
        for key in ("published_per_s", "read_per_s"):
            values = sorted(g[key] for g in got)
            out[key] = values[len(values) // 2]
            out[key.replace("_per_s", "_runs")] = [g[key] for g in got]
        results.append(out)
    return results


def print_table(results: list[dict], opts) -> None:
    print(f"{opts.count:,} messages x {opts.size} B, {opts.keys} routing keys, confirms "
          f"({opts.max_unconfirmed} in flight); read from 'first', prefetch {opts.prefetch}; "
          f"medians of {opts.rounds} rounds")
    base = results[0]
    print(f"{'target':<20} {'readers':>7} {'publish msg/s':>14} {'read msg/s':>11} {'vs stream':>16}  per reader")
    for r in results:
        what = "1 stream queue" if not r["partitions"] else f"{r['partitions']} partitions"
        ratio = f"{r['published_per_s'] / base['published_per_s']:.2f} / {r['read_per_s'] / base['read_per_s']:.2f}"
        print(f"{what:<20} {r['readers']:>7} {r['published_per_s']:>14,.0f} {r['read_per_s']:>11,.0f} "
              f"{ratio:>16}  {r['per_reader']}")
    print("runs (publish / read msg/s):")
    for r in results:
        print(f"  {r['target']:<8} " + ", ".join(f"{p:,.0f} / {q:,.0f}" for p, q in
                                               zip(r["published_runs"], r["read_runs"])))


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        results = run_loop(main_async(opts), opts.no_uvloop)
    except (AMQPError, OSError, RuntimeError, asyncio.TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        print(json.dumps(results))
    else:
        print_table(results, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
