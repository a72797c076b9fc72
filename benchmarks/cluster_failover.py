#!/usr/bin/env python3
"""Failover time of an active/standby cluster: from SIGKILL of the active node to the first
delivery on the node that takes over, as the median of several runs.

Each run makes a throwaway PostgreSQL database, starts two ``exchange-broker serve --cluster``
nodes on it, publishes --messages persistent messages with confirms to the active node, SIGKILLs
it, then connects to the standby (again and again, as a client would, until it serves) and consumes; the run checks every
confirmed message arrived, and reports the seconds from the SIGKILL to the first delivery.

    python benchmarks/cluster_failover.py --pg-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --runs 3 --heartbeat 1 --failover-timeout 8
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import pika
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def start_node(url: str, name: str, workdir: str, heartbeat: float, timeout: float,
               mode: str = "active-standby", extra: list | tuple = ()) -> tuple[subprocess.Popen, str]:
    port_file = os.path.join(workdir, f"port-{name}")
    log = open(os.path.join(workdir, f"{name}.log"), "ab")
    proc = subprocess.Popen([sys.executable, "-m", "exchange_broker", "serve", "--cluster", "--database-url", url,
                             "--node-name", name, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
                             "--admin-port", "0", "--heartbeat", "0", "--cluster-heartbeat", str(heartbeat),
                             "--cluster-failover-timeout", str(timeout), "--cluster-mode", mode, *extra],
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    return proc, port_file


def wait_port(port_file: str, limit: float) -> int:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            written = open(port_file).read().strip()
            if written:
                return int(written)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"no port in {port_file} after {limit}s")


@contextmanager
def throwaway_cluster(admin_url: str, prefix: str) -> Iterator[tuple[str, str, list]]:
    """(url of a new PostgreSQL database, a temp dir, a list for node processes); afterwards the
    processes are killed and the database and directory removed."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"eb_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    workdir = tempfile.mkdtemp(prefix=prefix)
    procs: list = []
    try:
        yield url, workdir, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(workdir, ignore_errors=True)


def one_run(admin_url: str, args) -> float:
    with throwaway_cluster(admin_url, "eb-failover-") as (url, workdir, procs):
        a, a_port_file = start_node(url, "a", workdir, args.heartbeat, args.failover_timeout)
        procs.append(a)
        port = wait_port(a_port_file, 30)
        conn = connect_retry(port, 60)  # a listens at once, and serves once it is active
        b, b_port_file = start_node(url, "b", workdir, args.heartbeat, args.failover_timeout)
        procs.append(b)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("bench", durable=True)
        for i in range(args.messages):
            ch.basic_publish("", "bench", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        time.sleep(args.heartbeat * 2)  # b is standing by (it beats)
        killed = time.monotonic()
        a.send_signal(signal.SIGKILL)
        a.wait()
        b_port = wait_port(b_port_file, 30)  # b listens from its start (a standby passes clients on)
        ch, conn = None, None
        deadline = killed + args.failover_timeout * 3 + 30
        while ch is None:  # as a client would: reconnect until the node serves
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b_port, connection_attempts=1))
                ch = conn.channel()
                ch.queue_declare("bench", durable=True, passive=True)
            except pika.exceptions.AMQPError:
                if conn is not None and conn.is_open:
                    conn.close()
                ch = None
                if time.monotonic() > deadline:
                    raise RuntimeError("node b never served after the SIGKILL of a") from None
                time.sleep(0.02)
        first = None
        got = 0
        while got < args.messages:
            method, _p, _body = ch.basic_get("bench", auto_ack=True)
            if method is None:
                raise RuntimeError(f"only {got} of {args.messages} confirmed messages after the failover")
            if first is None:
                first = time.monotonic() - killed
            got += 1
        conn.close()
        return first


def connect_retry(port: int, limit: float) -> pika.BlockingConnection:
    """A connection to the node on ``port`` once it serves (a node passes clients on, or closes
    them while no node serves)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1))
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no broker serves on port {port} after {limit} s") from None
            time.sleep(0.05)


def cluster_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of every cluster benchmark: --pg-url and --heartbeat."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--pg-url", default=os.environ.get("EB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1/test"),
                   help="a PostgreSQL database to connect to for creating the throwaway ones")
    p.add_argument("--heartbeat", type=float, default=1.0)
    return p


def main() -> int:
    p = cluster_parser(__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--failover-timeout", type=float, default=8.0)
    args = p.parse_args()
    times = [one_run(args.pg_url, args) for _ in range(args.runs)]
    print(json.dumps({"failover_seconds_median": round(statistics.median(times), 3),
                      "runs": [round(t, 3) for t in times], "heartbeat": args.heartbeat,
                      "failover_timeout": args.failover_timeout, "messages": args.messages}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
