#!/usr/bin/env python3
"""Messages per second through an ``on-confirm`` shovel (persistent messages, durable queues):

* between two brokers of this project (``push``: the shovel runs on the source broker and
  publishes to the other; ``pull``: it runs on the destination and consumes from the other);
* ``--rabbitmq``: from the RabbitMQ on 127.0.0.1:5672 (guest/guest) into this broker: the
  migration case (a benchmark only; the tests never use that RabbitMQ).

For each case ``--messages`` messages of ``--size`` bytes are loaded into the source queue first,
then the shovel is declared and the time until the destination queue holds them all is measured
(the figure: messages / that time). Brokers are started here on free ports, each on a store of
its own in a temporary directory; ``--prefetch`` is the shovel's prefetch-count.

    python benchmarks/shovel_bench.py --messages 20000
    python benchmarks/shovel_bench.py --messages 20000 --rabbitmq --json
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, workdir: str, name: str) -> None:
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir)
        self.admin_port = free_port()
        port_file = os.path.join(self.dir, "port")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
             "--port-file", port_file, "--admin-port", str(self.admin_port), "--data-dir", os.path.join(self.dir, "data")],
            stdout=subprocess.DEVNULL, stderr=self.log, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"broker {name} did not start (see {self.dir}/log)")
            time.sleep(0.05)
        self.port = int(open(port_file).read())
        self.wait_admin()

    def wait_admin(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.api("GET", "overview")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def api(self, method: str, path: str, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}/api/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def load(port: int, queue: str, n: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    body, props = b"x" * size, pika.BasicProperties(delivery_mode=2)
    for _ in range(n):
        ch.basic_publish("", queue, body, props)
    conn.close()


def depth(port: int, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if conn.is_open:
            conn.close()


def run_case(runner: Broker, name: str, src_uri: str, src_port: int, dest_uri: str, dest_port: int,
             args) -> float:
    src_q, dest_q = f"bench-{name}-src", f"bench-{name}-dst"
    load(src_port, src_q, args.messages, args.size)
    t0 = time.monotonic()
    runner.api("PUT", f"parameters/shovel/%2F/bench-{name}",
               {"value": {"src-uri": src_uri, "src-queue": src_q, "dest-uri": dest_uri, "dest-queue": dest_q,
                          "prefetch-count": args.prefetch}})
    deadline = t0 + args.timeout
    while depth(dest_port, dest_q) < args.messages:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: not done within {args.timeout} s: {runner.api('GET', 'shovels')}")
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    runner.api("DELETE", f"parameters/shovel/%2F/bench-{name}")
    return args.messages / elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--size", type=int, default=100, help="message body bytes")
    p.add_argument("--prefetch", type=int, default=1000, help="the shovel's prefetch-count")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--rabbitmq", action="store_true", help="also from the RabbitMQ on 127.0.0.1:5672")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="shovel-bench-")
    brokers = []
    results = {}
    try:
        a, b = Broker(workdir, "a"), Broker(workdir, "b")
        brokers += [a, b]
        results["push msg/s"] = run_case(a, "push", "amqp://", a.port, b.uri, b.port, args)
        results["pull msg/s"] = run_case(b, "pull", a.uri, a.port, "amqp://", b.port, args)
        if args.rabbitmq:
            results["rabbitmq->this msg/s"] = run_case(a, "rabbit", "amqp://guest:guest@127.0.0.1:5672", 5672,
                                                       "amqp://", a.port, args)
    finally:
        for br in brokers:
            br.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results = {k: round(v) for k, v in results.items()}
    if args.json:
        print(json.dumps({"messages": args.messages, "size": args.size, "prefetch": args.prefetch, **results}))
    else:
        for k, v in results.items():
            print(f"{k:>22}: {v:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
