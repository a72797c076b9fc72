"""Shovels in a cluster with per-queue leaders (two real node processes on one throwaway
PostgreSQL database; the shovel's ends are queues of a third, standalone broker): the shovel runs
on exactly one node, a node that did not declare it follows the stored parameter, and when the
node running it is SIGKILLed the other takes it over and the messages keep moving (none lost)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pika
import pytest

from eb_support import SubprocessBroker, close_quietly, pika_connect, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "admin"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "movers"))
from admin_helpers import Api  # noqa: E402
from mover_support import depth, publish  # noqa: E402

# longer beats than cluster_support's: a loaded machine must not evict the surviving node
LEADERS = ("--cluster-mode", "leaders", "--cluster-heartbeat", "0.5", "--cluster-failover-timeout", "6")
N, PREFETCH = 2000, 50

pytestmark = pytest.mark.slow


def running_on(node) -> list[str]:
    code, body = Api(f"http://127.0.0.1:{node.admin_port}").get("/api/shovels")
    return [s["name"] for s in body if s["state"] == "running"] if code == 200 else []


def test_a_shovel_runs_on_one_node_and_moves_when_it_dies(nodes, workdir):
    (workdir / "ends").mkdir()
    ends = SubprocessBroker(workdir / "ends").start()
    try:
        n1, n2 = nodes("n1", *LEADERS), nodes("n2", *LEADERS)
        publish(ends.port, "src", N)
        value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{ends.port}", "src-queue": "src",
                 "dest-uri": f"amqp://guest:guest@127.0.0.1:{ends.port}", "dest-queue": "dst",
                 "prefetch-count": PREFETCH, "reconnect-delay": 0.5}
        api = Api(f"http://127.0.0.1:{n1.admin_port}")
        assert api.put("/api/parameters/shovel/%2F/move", {"value": value})[0] == 201
        assert wait_until(lambda: running_on(n1) + running_on(n2) == ["move"], 30)
        owner, other = (n1, n2) if running_on(n1) else (n2, n1)
        # the other node knows the parameter (it follows the store) but does not run it
        assert Api(f"http://127.0.0.1:{other.admin_port}").ok("GET", "/api/parameters/shovel/%2F/move")["value"] == value
        assert wait_until(lambda: depth(ends.port, "dst") >= N // 4, 60)
        owner.kill()
        assert wait_until(lambda: running_on(other) == ["move"], 40)
        assert wait_until(lambda: depth(ends.port, "src") == 0 and depth(ends.port, "dst") >= N, 60)
        conn = pika_connect(ends.port)
        try:
            ch, ids = conn.channel(), Counter()
            while True:
                method, props, _body = ch.basic_get("dst", auto_ack=True)
                if method is None:
                    break
                ids[props.message_id] += 1
        finally:
            close_quietly(conn)
        assert set(ids) == {str(i) for i in range(N)}  # none lost
        assert sum(ids.values()) - N <= PREFETCH  # at least once: only what was in flight came twice
    finally:
        ends.kill()
