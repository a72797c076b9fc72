"""Cluster nodes as real ``exchange-broker serve --cluster`` processes on one throwaway
PostgreSQL database (fixtures in tests/cluster/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pika

from persistence.cluster_store import ClusterStore
from eb_support import REPO, SubprocessBroker, pika_connect, steady_port, subprocess_env, wait_until

# seconds: short enough that failovers keep the tests quick, long enough that a node that gets no
# CPU for a few seconds (a busy 2-core machine, the suite's other xdist workers) is not evicted:
# with 0.2 s / 2 s, nodes starved for 2.2-5 s were evicted in the middle of tests
HEARTBEAT = "0.5"
FAILOVER_TIMEOUT = "5"
# the nodes of a test that fails none over and runs beside other tests at a lower CPU priority
# (tests/conftest.py UNGROUPED): no starving on a busy machine must evict one
STEADY_FAILOVER_TIMEOUT = "20"


class NodeProcess(SubprocessBroker):
    """One node. ``start_node()`` returns once it is active (its log says it is ready) or
    standing by (its log says so). Every node listens (a standby passes its clients to the
    active node): ``port`` is its AMQP port, read from its port file."""

    def __init__(self, workdir: Path, url: str, name: str, *extra: str) -> None:
        self.name = name
        # the same across restarts, as a real node's (clients list it): out of the ephemeral range
        self.admin_port = steady_port()
        self.amqp_port = steady_port()
        mode = [] if "--cluster-mode" in extra else ["--cluster-mode", "active-standby"]  # unless the test says
        super().__init__(workdir, ["--cluster", *mode, "--database-url", url, "--node-name", name, "--port", str(self.amqp_port),
                                   "--cluster-heartbeat", HEARTBEAT, "--cluster-failover-timeout", FAILOVER_TIMEOUT,
                                   "--admin-port", str(self.admin_port), "--admin-host", "127.0.0.1", *extra])
        self.port_file: Path | None = None

    def start_node(self, timeout: float = 30.0) -> "NodeProcess":
        return self.launch().ready(timeout)

    def launch(self) -> "NodeProcess":
        """The process started; ``ready()`` waits for it (several nodes can start at once)."""
        assert not self.alive()
        n = next(self._ids)
        self.port_file = self.workdir / f"port-{self.name}-{n}"
        self.log_path = self.workdir / f"node-{self.name}-{n}.log"
        self.port = 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(self.port_file), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, cwd=str(REPO),
                                         env=subprocess_env(self.env), start_new_session=True)
        return self

    def ready(self, timeout: float = 30.0) -> "NodeProcess":
        """Once it is active (its log says it is ready) or standing by (its log says so)."""
        ready = wait_until(lambda: self.proc.poll() is not None or self.is_active() or
                           (self.listening() and "is standing by" in self.log()), timeout=timeout, interval=0.05)
        if not ready or self.proc.poll() is not None:
            raise RuntimeError(f"node {self.name} did not start (exit {self.proc.poll()}):\n{self.log()[-4000:]}")
        return self

    def listening(self) -> bool:
        """Its port file is written (as a standby or active); ``port`` is set then."""
        try:
            written = self.port_file.read_text().strip()
        except FileNotFoundError:
            return False
        if written:
            self.port = int(written)
        return bool(written)

    def is_active(self) -> bool:
        """Active: it serves the broker itself (its log says it is ready)."""
        return self.listening() and "exchange-broker ready on" in self.log()


def delivered_mark(url: str, queue: str) -> int:
    """The stored delivered mark of ``queue`` (what makes a redelivery "redelivered"; written by the
    leader's next group commit)."""
    from sqlalchemy import create_engine, text
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT delivered_mark FROM queues WHERE name = :q"), {"q": queue}).scalar() or 0
    finally:
        engine.dispose()


def publish_confirmed(port: int, queue: str, bodies: list[bytes]) -> None:
    """Persistent messages into a durable queue, each confirmed (pika raises otherwise)."""
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


def hold_unacked(port: int, queue: str, n: int) -> tuple[pika.BlockingConnection, list[bytes]]:
    """A consumer of ``queue`` with prefetch ``n`` that acks nothing, once it holds ``n``
    deliveries: its connection (the caller closes it) and their bodies."""
    conn = pika_connect(port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=n)
    held: list[bytes] = []
    ch.basic_consume(queue, lambda _ch, _m, _p, body: held.append(body))
    assert wait_until(lambda: (conn.process_data_events(0.05), len(held) == n)[1], timeout=10)
    return conn, held


def drain(port: int, queue: str) -> list[tuple[bytes, bool]]:
    """Every message of ``queue`` by basic.get, with its redelivered flag."""
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        got = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((body, method.redelivered))
    finally:
        conn.close()


def cluster_status(url: str) -> dict[str, dict]:
    """``exchange-broker cluster status --json``, by node name."""
    out = subprocess.run([sys.executable, "-m", "exchange_broker", "cluster", "status", "--database-url", url,
                          "--json"], capture_output=True, text=True, timeout=60, cwd=str(REPO),
                         env=subprocess_env())
    assert out.returncode == 0, out.stderr
    return {n["name"]: n for n in json.loads(out.stdout)}


def wait_for_status(url: str, predicate, timeout: float = 20.0) -> dict[str, dict]:
    """Poll the cluster tables (in this process: the same query as ``cluster status``) until
    ``predicate(nodes)`` holds; returns the last view, by node name (assert on it)."""
    store = ClusterStore(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            nodes = {n["name"]: n for n in store.nodes()}
            if predicate(nodes) or time.monotonic() > deadline:
                return nodes
            time.sleep(0.05)
    finally:
        store.close()
