"""--rabbit-private: a throwaway RabbitMQ node started for a benchmark, next to the machine's
RabbitMQ service and never touching it. Real rabbitmq-server, real sockets; skipped when
RabbitMQ is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pika
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from loadgen.procs import open_files_limit  # noqa: E402
from loadgen.rabbit_node import RESERVED_PORTS, PrivateRabbit, find_server  # noqa: E402
from loadgen.rabbit_node import alive as _alive  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_server() is None,
                       reason="rabbitmq-server is not installed "
                              "(/usr/lib/rabbitmq/bin/rabbitmq-server or on PATH)"),
]


def _epmd_names() -> str:
    try:
        return subprocess.run(["epmd", "-names"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def test_private_node_starts_with_its_own_limit_ports_and_files_and_goes_away():
    node = PrivateRabbit(nofile=4096)
    try:
        node.start()
        assert node.pid and node.pid != node.proc.pid
        with open(f"/proc/{node.pid}/comm") as fh:
            assert fh.read().strip() == "beam.smp"
        assert open_files_limit(node.pid) == 4096
        assert node.port not in RESERVED_PORTS and node.dist_port not in RESERVED_PORTS
        assert node.version
        short = node.node.split("@")[0]
        assert f"name {short} at port {node.dist_port}" in _epmd_names()
        # a guest (loopback) client can use it
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
        try:
            ch = conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", q, b"hello")
            method, _, body = ch.basic_get(q, auto_ack=True)
            assert body == b"hello"
        finally:
            conn.close()
        tmpdir, beam, script = node.tmpdir, node.pid, node.proc.pid
        assert os.path.isdir(os.path.join(tmpdir, "mnesia"))
    finally:
        node.stop()
    assert not os.path.exists(tmpdir)
    assert not _alive(beam) and not _alive(script)
    assert f"name {short} " not in _epmd_names()
    node.stop()  # idempotent


def test_many_connections_compares_both_brokers_on_a_private_node():
    out = subprocess.run(
        [sys.executable, str(BENCH / "many_connections.py"), "--rabbit-private",
         "--rabbit-private-nofile", "2048", "--connections", "50", "--seconds", "2",
         "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=240)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no result (exit {out.returncode}):\n{out.stderr[-3000:]}"
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(lines[-1])
    ours, rabbit = result["ours"], result["rabbitmq"]
    for r in (ours, rabbit):
        assert "error" not in r, r
        assert r["connections_open"] == 50 and r["connections"] == 50
        assert r["all_delivered"] is True and r["delivered"] == r["published"] > 0
        assert r["cpu_per_1000"] is not None
    assert rabbit["private_node"].startswith("ebbench-")
    assert rabbit["broker_open_files_limit"] == 2048
    assert rabbit["port"] not in RESERVED_PORTS
    assert not _alive(rabbit["pid"])  # stopped at the end
    assert f"name {rabbit['private_node'].split('@')[0]} " not in _epmd_names()
