#!/usr/bin/env python3
"""What clients of a leaders-mode cluster see while its PostgreSQL fails over: three figures.

Three nodes (``--heartbeat``, ``--failover-timeout``: the defaults 1 and 8 s) on a throwaway
primary with a synchronous streaming standby (``tests/cluster/pg_pair.py``: initdb +
pg_basebackup, run as the ``postgres`` user, so run this as root), each node through its own TCP
proxy per server (``tests/cluster/tcp_proxy.py``) and the libpq multi-host URL. One publisher
with confirms and one acking consumer per node work one queue.

1. ``stall_seconds``: every node's database connections hang for ``--hang`` seconds (12: a
   blip longer than the lease), then heal; the longest gap between two confirms.
2. ``rejoin_seconds``: the queue's leader alone is cut off (its proxies hang) for
   ``--cut`` seconds (past the failover timeout: it is evicted), then healed; seconds from the heal
   until it logged that it joined again.
3. ``promotion_to_first_confirm_seconds``: the primary is stopped (``-m immediate``), the standby
   promoted; seconds from ``pg_ctl promote`` returning to the first confirm.

    sudo python benchmarks/db_failover_bench.py --hang 12 --cut 15
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "cluster"), os.path.join(HERE, "..", "tests")]

from cluster_failover import start_node, wait_port  # noqa: E402
from pg_pair import PgPair  # noqa: E402
from tcp_proxy import TcpProxy  # noqa: E402

QUEUE = "db-failover"


class Client(threading.Thread):
    """A publisher with confirms and a consumer on one node, reconnecting whenever theirs ends."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.confirms: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", self.port, heartbeat=0, connection_attempts=1, blocked_connection_timeout=120))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(QUEUE, durable=True)
                sub = conn.channel()
                sub.basic_qos(prefetch_count=50)
                sub.basic_consume(QUEUE, lambda c, m, _p, _b: c.basic_ack(m.delivery_tag))
                while not self.stop.is_set():
                    ch.basic_publish("", QUEUE, b"x" * 100, pika.BasicProperties(delivery_mode=2))
                    self.confirms.append(time.monotonic())
                    conn.process_data_events(0)
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.1)

    def first_after(self, t: float) -> float | None:
        return next((c for c in self.confirms if c > t), None)


def wait_log(path: str, needle: str, after: int, limit: float) -> float | None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(path, errors="replace") as fh:
            if needle in fh.read()[after:]:
                return time.monotonic()
        time.sleep(0.05)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--failover-timeout", type=float, default=8.0)
    p.add_argument("--hang", type=float, default=12.0)
    p.add_argument("--cut", type=float, default=15.0)
    args = p.parse_args()
    pair = PgPair()
    procs, proxies, clients = [], [], []
    try:
        pair.setup()
        for name in ("n1", "n2", "n3"):
            mine = [TcpProxy("127.0.0.1", pair.ports[which]).start() for which in ("standby", "primary")]
            proxies.append(mine)
            proc, port_file = start_node(pair.url_through([x.address for x in mine]), name, str(pair.dir),
                                         args.heartbeat, args.failover_timeout, mode="leaders")
            procs.append((proc, port_file, os.path.join(str(pair.dir), f"{name}.log")))
            wait_port(port_file, 120)
            if name == "n1":  # n1 leads the queue
                conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", wait_port(port_file, 1)))
                conn.channel().queue_declare(QUEUE, durable=True)
                conn.close()
        clients = [Client(wait_port(pf, 1)) for _, pf, _ in procs]
        for c in clients:
            c.start()
        time.sleep(5)
        out = {"heartbeat": args.heartbeat, "failover_timeout": args.failover_timeout}

        start = time.monotonic()
        for mine in proxies:
            for x in mine:
                x.hang()
        time.sleep(args.hang)
        for mine in proxies:
            for x in mine:
                x.heal()
        time.sleep(args.failover_timeout + 5)
        times = sorted(t for c in clients for t in c.confirms if t > start - 2)
        out["hang_seconds"] = args.hang
        out["stall_seconds"] = round(max((b - a for a, b in zip(times, times[1:])), default=float("nan")), 2)

        log_size = os.path.getsize(procs[0][2])
        for x in proxies[0]:
            x.hang()
        time.sleep(args.cut)
        for x in proxies[0]:
            x.heal()
        healed = time.monotonic()
        joined = wait_log(procs[0][2], "and joined again as incarnation", log_size, 120)
        out["cut_seconds"] = args.cut
        out["rejoin_seconds"] = round(joined - healed, 2) if joined else None
        time.sleep(5)

        pair.stop("primary")
        pair.promote()
        promoted = time.monotonic()
        deadline = promoted + 60
        while time.monotonic() < deadline and not any(c.first_after(promoted) for c in clients):
            time.sleep(0.05)
        firsts = [t for t in (c.first_after(promoted) for c in clients) if t]
        out["promotion_to_first_confirm_seconds"] = round(min(firsts) - promoted, 2) if firsts else None
        out["nodes_running"] = sum(proc.poll() is None for proc, _, _ in procs)
        print(json.dumps(out))
        return 0
    finally:
        for c in clients:
            c.stop.set()
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for mine in proxies:
            for x in mine:
                x.close()
        pair.close()


if __name__ == "__main__":
    sys.exit(main())
