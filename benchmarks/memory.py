#!/usr/bin/env python3
"""Broker memory per queued message: this broker and RabbitMQ in the same run.

1. open one connection, declare a fresh durable queue, read the broker process's resident
   memory (VmRSS from /proc/<pid>/status; for RabbitMQ the pid of its Erlang VM, beam.smp,
   found with pgrep);
2. publish ``--messages`` persistent messages (delivery_mode 2) of ``--size`` bytes (default
   1,000,000 x 1 KiB) with publisher confirms (at most ``--max-unconfirmed`` in flight) and no
   consumer; wait for the last confirm, check the queue holds them all (queue.declare passive),
   wait ``--settle`` seconds and read RSS again;
3. purge and delete the queue (also when the broker blocks publishers with a resource alarm:
   the run stops at once with an error, so a shared RabbitMQ is not left blocked).

Reported: RSS before and after, and (after - before) / messages in bytes per message. The ratio
is RabbitMQ's bytes per message / ours (>= 1.00: this broker uses no more). RabbitMQ's figure
is the RSS of its whole node, which includes anything other clients do meanwhile.

    python benchmarks/memory.py                            # 1,000,000 x 1 KiB, both brokers
    python benchmarks/memory.py --messages 50000           # a quick run
    python benchmarks/memory.py --port 5672 --pid $(pgrep -x beam.smp) --json
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pamqp import commands  # noqa: E402

from loadgen import standalone  # noqa: E402
from loadgen.client import AMQPError, Connection  # noqa: E402
from loadgen.procs import rss_bytes  # noqa: E402
from loadgen.publisher import Publisher  # noqa: E402
from loadgen.rows import MEMORY  # noqa: E402
from loadgen.wire import encode_publish, server_name  # noqa: E402

METRICS = list(MEMORY)


def _check(prod: Connection) -> None:
    if prod.error is not None:
        raise prod.error
    if prod.blocked:  # give the memory back at once (the queue is deleted on the way out)
        raise AMQPError("the broker blocked publishers (connection.blocked: a resource alarm); "
                        "use fewer --messages")


async def _publish(pub: Publisher, prod: Connection, stall: float) -> None:
    task = asyncio.ensure_future(pub.run())
    loop = asyncio.get_running_loop()
    last, since = -1, loop.time()
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            _check(prod)
            if pub.published != last:
                last, since = pub.published, loop.time()
            elif loop.time() - since > stall:
                raise AMQPError(f"publishing stalled at {last:,} for {stall:.0f} s")
        task.result()
    finally:
        pub.stopped = True
        if not task.done():
            task.cancel()


async def _confirmed(prod: Connection, count: int, stall: float) -> None:
    last, ticks = -1, 0
    while prod.confirmed + prod.nacked < count:
        _check(prod)
        prod.confirm_event.clear()
        try:
            await asyncio.wait_for(prod.confirm_event.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
        done = prod.confirmed + prod.nacked
        ticks = 0 if done != last else ticks + 1
        last = done
        if ticks >= stall:
            why = " (the broker blocked publishers: resource alarm)" if prod.blocked else ""
            raise AMQPError(f"confirms stalled at {done:,}/{count:,}{why}")


async def _delete_queue(host: str, port: int, queue: str, opts) -> None:
    conn = Connection("memory-cleanup")
    try:
        await conn.open(host, port, opts.user, opts.password, opts.vhost, 0, 10.0)
        await conn.rpc(commands.Queue.Delete(queue=queue), "Queue.DeleteOk", timeout=300)
    except Exception as exc:  # noqa: BLE001
        print(f"warning: queue.delete of {queue} failed: {exc}", file=sys.stderr)
    finally:
        try:
            await conn.close()
        except Exception:  # noqa: BLE001
            pass


async def measure(host: str, port: int, pid: int, opts) -> dict:
    queue = f"memory-bench-{uuid.uuid4().hex[:10]}"
    prod = Connection("memory-producer")
    result: dict = {"host": host, "port": port, "pid": pid, "queue": queue,
                    "messages": opts.messages,
                    "size": opts.size, "rss_source": f"/proc/{pid}/status VmRSS"}
    declared = False
    loop = asyncio.get_running_loop()
    try:
        await prod.open(host, port, opts.user, opts.password, opts.vhost, 0, 10.0)
        result["server"] = server_name(prod.server_properties)
        await prod.rpc(commands.Queue.Declare(queue=queue, durable=True), "Queue.DeclareOk")
        declared = True
        await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        message = encode_publish(Connection.CHANNEL, "", queue, bytes(opts.size), 2,
                                 prod.frame_max)
        await asyncio.sleep(opts.settle)
        before = rss_bytes(pid)
        pub = Publisher(prod, message, max(1, min(256, (256 * 1024) // len(message))),
                        window=opts.max_unconfirmed, limit=opts.messages)
        t0 = loop.time()
        await _publish(pub, prod, opts.stall_timeout)
        await _confirmed(prod, opts.messages, opts.stall_timeout)
        took = loop.time() - t0
        if prod.nacked:
            raise AMQPError(f"{prod.nacked} publishes were nacked")
        ok = await prod.rpc(commands.Queue.Declare(queue=queue, durable=True, passive=True),
                            "Queue.DeclareOk")
        await asyncio.sleep(opts.settle)
        after = rss_bytes(pid)
        result.update({
            "queued": ok.message_count, "all_queued": ok.message_count == opts.messages,
            "publish_seconds": round(took, 2), "publish_per_s": round(opts.messages / took, 1),
            "rss_before_mib": round(before / 2**20, 1), "rss_after_mib": round(after / 2**20, 1),
            "bytes_per_message": round((after - before) / opts.messages, 1),
        })
        await prod.rpc(commands.Queue.Purge(queue=queue), "Queue.PurgeOk", timeout=300)
    finally:
        if declared and prod.error is None and not prod.blocked:
            try:
                await prod.rpc(commands.Queue.Delete(queue=queue), "Queue.DeleteOk",
                               timeout=300)
                declared = False
            except Exception as exc:  # noqa: BLE001
                print(f"warning: queue.delete failed: {exc}", file=sys.stderr)
        try:
            await prod.close(2.0)
        except Exception:  # noqa: BLE001
            pass
        if declared:  # a blocked (or failed) producer: delete from a connection of its own
            await _delete_queue(host, port, queue, opts)
    if not result.get("all_queued", True):
        raise AMQPError(f"the queue holds {result['queued']:,} messages, "
                        f"expected {opts.messages:,}")
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="ratio >= 1.00: this broker uses no more memory")
    p.add_argument("--messages", type=int, default=1_000_000,
                   help="persistent messages to queue (default 1,000,000)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--max-unconfirmed", type=int, default=1000,
                   help="publishes in flight awaiting confirm (default 1000)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds to wait before each RSS reading (default 2)")
    p.add_argument("--stall-timeout", type=float, default=60.0,
                   help="give up after this many seconds without progress (default 60)")
    standalone.add_target_args(p)
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.messages < 1 or opts.size < 1:
        print("--messages and --size must be >= 1", file=sys.stderr)
        return 2
    return standalone.run(opts, measure, METRICS, "memory", needs_pid=True)


if __name__ == "__main__":
    sys.exit(main())
