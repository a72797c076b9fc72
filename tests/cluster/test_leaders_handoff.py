"""Connection hand-off (leaders mode's default) on real node processes (one throwaway PostgreSQL
database): clients of n2 working a queue n1 leads are handed to n1, which lists them as its own
clients; SIGKILL of n1 closes their connections, they reconnect to n2 (which now leads the queue)
and no confirmed message is lost."""

from __future__ import annotations

import time

import pytest
import requests
from cluster_load import finish_load, run_load
from cluster_support import FAILOVER_TIMEOUT, wait_for_status

from eb_support import pika_connect, wait_until

HANDOFF = ("--cluster-mode", "leaders")  # hands connections off by default

pytestmark = pytest.mark.slow


def connections_on(node) -> list[dict]:
    got = requests.get(f"http://127.0.0.1:{node.admin_port}/api/connections", auth=("guest", "guest"), timeout=10)
    return got.json() if got.status_code == 200 else []


def led_by(url: str, queue: str) -> str | None:
    view = wait_for_status(url, lambda v: True)
    return next((name for name, node in view.items() if node["alive"] and
                 any(q["name"] == queue for q in node["queues"])), None)


def test_handed_off_clients_are_the_leaders_and_reconnect_when_it_is_killed(nodes, cluster_url):
    n1, n2 = nodes.together(("n1", *HANDOFF), ("n2", *HANDOFF))
    conn = pika_connect(n1.port)
    conn.channel().queue_declare("orders", durable=True)
    conn.close()
    assert wait_until(lambda: led_by(cluster_url, "orders") == "n1", timeout=20)
    publishers, consumers = run_load([n2.port], "orders")
    try:
        assert wait_until(lambda: all(len(p.confirmed) > 50 for p in publishers) and
                          all(len(c.got) > 20 for c in consumers), timeout=30)
        # every load client's connection was handed to n1: n1 lists them, n2 passes bytes only
        assert wait_until(lambda: len(connections_on(n1)) >= len(publishers) + len(consumers), timeout=10)
        assert connections_on(n2) == []
        n1.kill()  # SIGKILL
        killed = time.monotonic()
        before = {id(c): len(c.got) for c in consumers}
        assert wait_until(lambda: all(len(c.got) > before[id(c)] + 50 for c in consumers), timeout=40)
        resumed = min(t for c in consumers for t, _, _ in c.got if t > killed)
        assert resumed - killed < float(FAILOVER_TIMEOUT) + 15
        assert led_by(cluster_url, "orders") == "n2"
        assert all(p.reconnects for p in publishers)  # their connections ended with n1
        assert wait_until(lambda: all(len(p.confirmed) > 50 + p.reconnects for p in publishers), timeout=30)
    finally:
        finish_load(publishers, consumers)
