#!/usr/bin/env python3
"""A durable queue longer than memory: broker RSS with N persistent messages, restart, drain.

Starts the broker as a subprocess on a free port with a temporary data directory (SQLite by
default, or ``--database-url``), then:

1. publishes N persistent messages of --size bytes to a durable queue with publisher confirms
   (at most 1,000 unconfirmed), each body stamped with its sequence number;
2. reads the broker's resident memory (VmRSS, VmHWM from /proc);
3. stops it with SIGKILL and starts it again on the same store, timing start-up and reading
   RSS once it accepts connections;
4. drains the queue with prefetch 200 and multiple-acks, checking every message arrives once and
   in order, and reads the peak RSS.

    python benchmarks/big_queue.py --count 1000000 --size 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pamqp import commands  # noqa: E402

import amqp_load  # noqa: E402

U64_OFFSET = None


def rss(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) // 1024  # MiB
    return out


def start_broker(args, data_dir: str, port_file: str) -> subprocess.Popen:
    if os.path.exists(port_file):
        os.unlink(port_file)
    cmd = [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
           "--port-file", port_file, "--admin-port", "0", "--log-level", "WARNING",
           "--memory-high-watermark", "0"]
    cmd += ["--database-url", args.database_url] if args.database_url else ["--data-dir", data_dir]
    if args.queue_window:
        cmd += ["--queue-window", str(args.queue_window)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(port_file + ".log", "ab"),
                            start_new_session=True)


def wait_port(port_file: str, proc: subprocess.Popen, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"broker exited with {proc.returncode}; see {port_file}.log")
        try:
            port = int(open(port_file).read())
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return port
        except (OSError, ValueError):
            time.sleep(0.05)
    raise SystemExit("broker did not start")


async def publish(port: int, queue: str, count: int, size: int) -> float:
    conn = amqp_load.Connection("producer")
    await conn.open("127.0.0.1", port, "guest", "guest", "/", 0, 10)
    await conn.rpc(commands.Queue.Declare(queue=queue, durable=True), "Queue.DeclareOk")
    await conn.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
    body = bytes(size)
    message = amqp_load.encode_publish(1, "", queue, body, 2, conn.frame_max)
    method_len = 7 + 4 + 2 + 1 + 0 + 1 + len(queue.encode()) + 1 + 1
    seq_offset = method_len + 7 + 15 + 1 + 7
    pub = amqp_load.Publisher(conn, message, max(1, (256 * 1024) // len(message)), window=1000,
                              limit=count, seq_offset=seq_offset)
    t0 = time.monotonic()
    await pub.run()
    while conn.confirmed + conn.nacked < count:
        conn.confirm_event.clear()
        await conn.confirm_event.wait()
    elapsed = time.monotonic() - t0
    if conn.nacked:
        raise SystemExit(f"{conn.nacked} publishes were nacked")
    await conn.close()
    return elapsed


async def drain(port: int, queue: str, count: int, size: int) -> float:
    conn = amqp_load.Connection("consumer")
    await conn.open("127.0.0.1", port, "guest", "guest", "/", 0, 10)
    declare_ok = await conn.rpc(commands.Queue.Declare(queue=queue, durable=True, passive=True),
                                "Queue.DeclareOk")
    if declare_ok.message_count != count:
        raise SystemExit(f"queue holds {declare_ok.message_count} messages after restart, "
                         f"expected {count}")
    await conn.rpc(commands.Basic.Qos(prefetch_count=200), "Basic.QosOk")
    conn.ack_every = 50
    conn.verify = True
    conn.v_expected_size = size
    conn.delivery_event = asyncio.Event()
    t0 = time.monotonic()
    await conn.rpc(commands.Basic.Consume(queue=queue, consumer_tag="drain"), "Basic.ConsumeOk")
    while conn.deliveries < count:
        conn.delivery_event.clear()
        try:
            await asyncio.wait_for(conn.delivery_event.wait(), 30)
        except asyncio.TimeoutError:
            raise SystemExit(f"drain stalled at {conn.deliveries}/{count}") from None
    elapsed = time.monotonic() - t0
    if conn.v_errors:
        raise SystemExit(f"order/size errors: {conn.v_errors[:5]}")
    await conn.close()
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--database-url", default=None)
    p.add_argument("--queue-window", type=int, default=0, help="broker --queue-window (default: its own)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="eb-bigq-")
    port_file = os.path.join(tmp, "port")
    queue = "big-queue"
    result: dict = {"count": args.count, "size": args.size,
                    "store": "postgresql" if args.database_url else "sqlite"}
    proc = None
    try:
        proc = start_broker(args, os.path.join(tmp, "data"), port_file)
        port = wait_port(port_file, proc)
        result["rss_empty_mib"] = rss(proc.pid)["VmRSS"]
        t = asyncio.run(publish(port, queue, args.count, args.size))
        result["publish_s"] = round(t, 1)
        result["publish_per_s"] = round(args.count / t)
        time.sleep(2)
        result["rss_after_publish_mib"] = rss(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        proc = start_broker(args, os.path.join(tmp, "data"), port_file)
        port = wait_port(port_file, proc)
        result["restart_s"] = round(time.monotonic() - t0, 2)
        result["rss_after_restart_mib"] = rss(proc.pid)["VmRSS"]
        t = asyncio.run(drain(port, queue, args.count, args.size))
        result["drain_s"] = round(t, 1)
        result["drain_per_s"] = round(args.count / t)
        result["rss_peak_mib"] = rss(proc.pid)["VmHWM"]
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result) if args.json else "\n".join(f"{k:24} {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
