#!/usr/bin/env python3
"""How fast a standby follows the definitions of the active node (issue 13, shared definitions).

Makes a throwaway PostgreSQL database, starts two ``exchange-broker serve --cluster`` nodes on it
(one active, one standby), then --changes times: declares a durable exchange on the active node
(declare-ok = committed), reads the store's definitions version, and polls ``cluster_nodes`` until
the standby reports it has loaded that version. Prints the median and 95th percentile of those
delays, and the rate of --queues durable queue declares on the active node (each one a definition
write that bumps the version and NOTIFYs).

    python benchmarks/cluster_definitions.py --pg-url postgresql+psycopg://postgres@127.0.0.1/test
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import pika
from sqlalchemy import create_engine, text

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_failover import cluster_parser, start_node, throwaway_cluster, wait_port  # noqa: E402


def wait_standby(engine, version: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            seen = conn.execute(text("SELECT definitions_version FROM cluster_nodes WHERE name = 'b'")).scalar()
            conn.rollback()
            if seen is not None and seen >= version:
                return
            time.sleep(0.002)
    raise RuntimeError(f"the standby did not reach definitions version {version} in {limit} s")


def current_version(engine) -> int:
    with engine.connect() as db:
        return db.execute(text("SELECT value FROM cluster_counters WHERE name = 'definitions'")).scalar() or 0


def run(admin_url: str, args) -> dict:
    with throwaway_cluster(admin_url, "eb-defs-") as (url, workdir, procs):
        engine = create_engine(url)
        try:
            a, a_port_file = start_node(url, "a", workdir, args.heartbeat, 10.0)
            procs.append(a)
            port = wait_port(a_port_file, 30)
            b, _b_port_file = start_node(url, "b", workdir, args.heartbeat, 10.0)
            procs.append(b)
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
            ch = conn.channel()
            ch.exchange_declare("warm-up", "direct", durable=True)
            wait_standby(engine, current_version(engine), 60)  # the standby follows the definitions
            delays = []
            for i in range(args.changes):
                ch.exchange_declare(f"x{i}", "topic", durable=True)
                done = time.monotonic()
                wait_standby(engine, current_version(engine))
                delays.append(time.monotonic() - done)
            start = time.monotonic()
            for i in range(args.queues):
                ch.queue_declare(f"q{i}", durable=True)
            declare_rate = args.queues / (time.monotonic() - start)
            conn.close()
        finally:
            engine.dispose()
    delays.sort()
    return {"standby_follows_ms_median": round(statistics.median(delays) * 1000, 1),
            "standby_follows_ms_p95": round(delays[max(0, int(len(delays) * 0.95) - 1)] * 1000, 1),
            "changes": args.changes, "durable_queue_declares_per_s": round(declare_rate),
            "queues": args.queues, "heartbeat": args.heartbeat}


def main() -> int:
    p = cluster_parser(__doc__)
    p.add_argument("--changes", type=int, default=50)
    p.add_argument("--queues", type=int, default=300)
    args = p.parse_args()
    print(json.dumps(run(args.pg_url, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
