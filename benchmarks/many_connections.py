#!/usr/bin/env python3
"""Broker CPU with many connections: this broker and RabbitMQ in the same run.

One client process (asyncio, uvloop when installed, the lean raw-frame client) opens
``--connections`` connections (default 1,000; its open-files limit is raised as needed). Each
declares its own exclusive queue and consumes from it (auto-ack; ``--manual-ack`` to ack each
delivery) on the same channel it publishes on, and publishes ``--per-second`` transient
100-byte messages a second (default 10) to that queue: one timer every 10 ms writes one message
on each connection of a tenth of them, so the load is even. After ``--warmup`` seconds it reads
the broker process's CPU time (utime + stime from /proc/<pid>/stat; for RabbitMQ its Erlang VM,
beam.smp, found with pgrep), runs ``--seconds`` more, reads it again, stops publishing and waits
for the last deliveries.

Reported: broker CPU seconds per 1,000 messages delivered in the window, the share of a core it
used, and published / delivered counts over the whole run (all delivered?). The ratio is
RabbitMQ's CPU per message / ours (>= 1.00: this broker uses no more). RabbitMQ's CPU is that of
its whole node, which includes anything other clients do meanwhile.

    python benchmarks/many_connections.py                        # 1,000 connections, 10 s
    python benchmarks/many_connections.py --connections 200 --seconds 3
    python benchmarks/many_connections.py --port 5672 --pid $(pgrep -x beam.smp) --json
    python benchmarks/many_connections.py --rabbit-private   # RabbitMQ: a private node, 1,000

RabbitMQ's open-files limit caps the connections (the same number for both brokers; see
``loadgen/procs.py safe_connections``). ``--rabbit-private`` measures a throwaway RabbitMQ node
started for the run instead of the one at --rabbit-host:--rabbit-port: the installed
rabbitmq-server with ``--rabbit-private-nofile`` (8192) open files, its own node name, free
ports and temporary directories, stopped and removed at the end (``loadgen/rabbit_node.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pamqp import commands  # noqa: E402

from loadgen import rabbit_node, standalone  # noqa: E402
from loadgen.client import AMQPError, Connection  # noqa: E402
from loadgen.procs import (cpu_seconds, find_rabbit_pid, open_files_limit,  # noqa: E402
                           raise_nofile, safe_connections)
from loadgen.rows import CONNECTIONS  # noqa: E402
from loadgen.wire import encode_publish, server_name  # noqa: E402

TICK = 0.01  # seconds between publishing rounds; each round serves 1/GROUPS of the connections

METRICS = list(CONNECTIONS)


class _Skipped(Exception):
    pass


async def _open_one(i: int, run_id: str, host, port, opts, sem, failed: list):
    async with sem:
        if len(failed) >= opts.max_open_failures:
            raise _Skipped()
        conn = Connection(f"conn-{i}")
        try:
            await conn.open(host, port, opts.user, opts.password, opts.vhost, 0,
                            opts.open_timeout)
            queue = f"many-{run_id}-{i}"
            await conn.rpc(commands.Queue.Declare(queue=queue, exclusive=True, auto_delete=True),
                           "Queue.DeclareOk", timeout=opts.open_timeout)
            if opts.manual_ack:
                conn.ack_every = 1
            await conn.rpc(commands.Basic.Consume(queue=queue, consumer_tag="c",
                                                  no_ack=not opts.manual_ack),
                           "Basic.ConsumeOk", timeout=opts.open_timeout)
        except (AMQPError, OSError, asyncio.TimeoutError) as exc:
            failed.append(f"{conn.name}: {exc}")
            if conn.transport is not None:
                conn.transport.close()
            raise
        return conn, encode_publish(Connection.CHANNEL, "", queue, bytes(opts.size), 1,
                                    conn.frame_max)


async def _close_all(conns: list[Connection]) -> None:
    sem = asyncio.Semaphore(100)

    async def close(c):
        async with sem:
            try:
                await c.close(10)
            except Exception:  # noqa: BLE001
                pass
    await asyncio.gather(*(close(c) for c in conns))


async def measure(host: str, port: int, pid: int, opts) -> dict:
    loop = asyncio.get_running_loop()
    raise_nofile(opts.connections + 256)
    run_id = uuid.uuid4().hex[:8]
    n, capped = safe_connections(pid, opts.connections)
    sem = asyncio.Semaphore(opts.open_concurrency)
    result: dict = {"host": host, "port": port, "pid": pid, "connections": n,
                    "connections_asked": opts.connections,
                    "per_second": opts.per_second, "size": opts.size,
                    "ack": "manual, one per message" if opts.manual_ack else "auto-ack",
                    "cpu_source": f"/proc/{pid}/stat utime+stime"}
    if pid and open_files_limit(pid):
        result["broker_open_files_limit"] = open_files_limit(pid)
    t_open = loop.time()
    failed: list[str] = []
    opened = await asyncio.gather(*(_open_one(i, run_id, host, port, opts, sem, failed)
                                    for i in range(n)), return_exceptions=True)
    pairs = [x for x in opened if not isinstance(x, BaseException)]
    conns = [c for c, _ in pairs]
    result.update({"connections_open": len(conns), "open_seconds": round(loop.time() - t_open, 2)})
    if failed:
        limit = result.get("broker_open_files_limit")
        result["warning"] = (f"only {len(conns)} of {n} connections opened "
                             f"(first failure: {failed[0]}; stopped trying after "
                             f"{len(failed)} failures)"
                             + (f"; the broker's open-files limit is {limit}" if limit else ""))
    if capped:
        result["warning"] = capped + ("; " + result["warning"] if "warning" in result else "")
    try:
        if not conns:
            raise AMQPError(result.get("warning", "no connection opened"))
        result["server"] = server_name(conns[0].server_properties)
        groups = max(1, round(1.0 / (opts.per_second * TICK)))
        rounds = [pairs[g::groups] for g in range(groups)]
        published = 0
        t0 = loop.time()
        marks = {}

        def delivered() -> int:
            return sum(c.deliveries for c in conns)

        ticks = 0
        t_warm, t_end = t0 + opts.warmup, t0 + opts.warmup + opts.seconds
        while True:
            now = loop.time()
            if "start" not in marks and now >= t_warm:
                marks["start"] = (now, cpu_seconds(pid), delivered(), time.process_time())
            if now >= t_end:
                marks["end"] = (now, cpu_seconds(pid), delivered(), time.process_time())
                break
            due = int((now - t0) / TICK)
            while ticks <= due:  # catch up rounds the loop was late for
                for conn, message in rounds[ticks % groups]:
                    if conn.error is not None:
                        raise conn.error
                    conn.transport.write(message)
                    published += 1
                ticks += 1
            await asyncio.sleep(max(0.0, t0 + ticks * TICK - loop.time()))
        caught_up = True
        deadline = loop.time() + opts.drain_timeout
        while delivered() < published:
            if loop.time() > deadline:
                caught_up = False
                break
            await asyncio.sleep(0.02)
        (ta, ca, da, pa), (tb, cb, db, pb) = marks["start"], marks["end"]
        window = tb - ta
        msgs = db - da
        result.update({
            "window_s": round(window, 3), "published": published, "delivered": delivered(),
            "all_delivered": caught_up and delivered() == published,
            "delivered_per_s": round(msgs / window, 1),
            "target_per_s": round(len(conns) / (groups * TICK), 1),
            "cpu_seconds": round(cb - ca, 3), "cpu_share": round((cb - ca) / window, 3),
            "cpu_per_1000": round((cb - ca) / msgs * 1000, 5) if msgs else None,
            "client_cpu_share": round((pb - pa) / window, 3),
        })
    finally:
        await _close_all(conns)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="ratio >= 1.00: this broker uses no more CPU per message")
    p.add_argument("--connections", type=int, default=1000,
                   help="connections, each with its own queue and consumer (default 1,000)")
    p.add_argument("--per-second", type=float, default=10.0,
                   help="messages each connection publishes a second (default 10)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="measured window after the warm-up (default 10)")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="seconds of load before the window (default 2)")
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    p.add_argument("--manual-ack", action="store_true",
                   help="consume with manual acks, one basic.ack per delivery "
                        "(default auto-ack)")
    p.add_argument("--open-concurrency", type=int, default=50,
                   help="connections opened at a time (default 50)")
    p.add_argument("--open-timeout", type=float, default=10.0,
                   help="seconds one connection may take to open (default 10)")
    p.add_argument("--max-open-failures", type=int, default=20,
                   help="stop opening connections after this many failures and measure with "
                        "those open (default 20)")
    p.add_argument("--drain-timeout", type=float, default=10.0,
                   help="seconds to wait for the last deliveries after publishing stops")
    standalone.add_target_args(p)
    rabbit_node.add_args(p.add_argument_group("a private RabbitMQ node"))
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.connections < 1 or opts.per_second <= 0 or opts.per_second > 1 / TICK:
        print(f"--connections must be >= 1 and --per-second in (0, {1 / TICK:.0f}]",
              file=sys.stderr)
        return 2
    if opts.rabbit_private and (opts.port or opts.skip_rabbitmq):
        print("--rabbit-private starts the RabbitMQ to compare with: not with --port or "
              "--skip-rabbitmq", file=sys.stderr)
        return 2
    node = rabbit_node.from_opts(opts) if opts.rabbit_private else None

    def _on_term(signum, frame):  # SIGTERM: leave through the finally (the private node)
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        if node is not None:
            print("[rabbitmq] starting a private node ...", file=sys.stderr, flush=True)
            node.start()
        if not opts.port and not opts.skip_rabbitmq:
            # the same number of connections on both brokers, within RabbitMQ's open-files limit
            pid = node.pid if node else find_rabbit_pid(opts.rabbit_port)
            n, note = safe_connections(pid or 0, opts.connections)
            if note:
                print(f"note: RabbitMQ: {note}; both brokers get {n}", file=sys.stderr)
                opts.connections = n
        return standalone.run(opts, measure, METRICS, "connections", needs_pid=True,
                              rabbit=node)
    except rabbit_node.RabbitNodeFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # don't interrupt the cleanup
        if node is not None:
            node.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
