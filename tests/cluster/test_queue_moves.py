"""Queues follow the nodes (``--cluster-mode leaders``, real node processes on one throwaway
PostgreSQL database): the admin API of any node shows a queue's real counts and purges it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
from cluster_support import drain, publish_confirmed
from test_leaders import LEADERS as LEADERS_MODE, known_on, leaders_of

from eb_support import REPO, pika_connect, subprocess_env, wait_until

AUTH = ("guest", "guest")
# a longer lease than the other cluster tests: a loaded machine must not make a node give up mid-move
LEADERS = (*LEADERS_MODE, "--cluster-failover-timeout", "6")


def api(node, path: str, method: str = "GET"):
    return requests.request(method, f"http://127.0.0.1:{node.admin_port}{path}", auth=AUTH, timeout=20)


def test_any_node_shows_the_leaders_counts_and_purges(nodes):
    n1, n2 = nodes("n1", *LEADERS), nodes("n2", *LEADERS)
    publish_confirmed(n1.port, "counted", [f"m{i}".encode() for i in range(7)])
    assert wait_until(lambda: known_on(n2, "counted"), timeout=20)
    holder = pika_connect(n1.port)  # two deliveries held unacked on the leader
    ch = holder.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("counted", lambda *a: None)
    assert wait_until(lambda: api(n1, "/api/queues/%2F/counted").json()["messages_unacknowledged"] == 2,
                      timeout=20)
    for path in ("/api/queues/%2F/counted", "/api/queues/%2F", "/api/queues"):
        got = api(n2, path).json()
        row = got if isinstance(got, dict) else next(q for q in got if q["name"] == "counted")
        assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"], row["consumers"]) == \
            (7, 5, 2, 1), row
        assert row["leader"] == row["node"] == "n1"
        assert sorted(row["members"]) == ["n1", "n2"]
    assert api(n1, "/api/queues/%2F/counted").json()["leader"] == "n1"
    holder.close()
    assert api(n2, "/api/queues/%2F/counted/contents", "DELETE").status_code == 204  # purged by its leader
    assert wait_until(lambda: api(n1, "/api/queues/%2F/counted").json()["messages"] == 0, timeout=20)
    assert api(n2, "/api/queues/%2F/counted").json()["messages"] == 0
    assert api(n2, "/api/queues/%2F/nothing/contents", "DELETE").status_code == 404
    n1.kill()  # the leader gone: its figures are unknown on n2 (not 0) until the queue moves
    row = api(n2, "/api/queues/%2F/counted").json()
    assert row["messages"] is None or row["leader"] == "n2", row


def cluster_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exchange_broker", "cluster", *args, "--database-url", url],
                          capture_output=True, text=True, timeout=120, cwd=str(REPO), env=subprocess_env())


def led_by(url: str) -> dict[str, str]:
    return {q: node for q, node in leaders_of(url).items()}


@pytest.mark.slow
def test_rebalance_gives_a_joining_node_its_share_and_drain_empties_a_node(nodes, cluster_url):
    n1 = nodes("n1", *LEADERS)
    names = [f"q{i}" for i in range(4)]
    for name in names:
        publish_confirmed(n1.port, name, [f"{name}-{i}".encode() for i in range(5)])
    n2 = nodes("n2", *LEADERS)  # joins leading nothing
    assert wait_until(lambda: all(known_on(n2, q) for q in names), timeout=20)
    assert set(led_by(cluster_url).values()) == {"n1"}
    consumer = pika_connect(n2.port)  # a consumer on n2 of a queue led by n1, holding one unacked
    ch = consumer.channel()
    ch.basic_qos(prefetch_count=1)
    cancelled: list = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    got: list = []
    ch.basic_consume("q0", lambda c, m, p, b: got.append((b, m.redelivered)))
    assert wait_until(lambda: consumer.process_data_events(0.05) or got, timeout=20)
    out = cluster_cli(cluster_url, "rebalance")
    assert out.returncode == 0, out.stderr
    assert "2 queue(s) moved" in out.stdout, out.stdout
    assert sorted(led_by(cluster_url).values()) == ["n1", "n1", "n2", "n2"]
    out = cluster_cli(cluster_url, "rebalance")  # balanced: nothing to do
    assert out.returncode == 0 and "no queue to move" in out.stdout, out.stdout + out.stderr
    out = cluster_cli(cluster_url, "drain", "n1")
    assert out.returncode == 0, out.stderr
    assert set(led_by(cluster_url).values()) == {"n2"}
    status = api(n2, "/api/queues/%2F/q0").json()
    assert status["leader"] == "n2"
    # q0 moved: its consumer was cancelled (consumer-cancel-notify); every message is still there,
    # the one it held unacked marked redelivered
    assert wait_until(lambda: consumer.process_data_events(0.05) or cancelled, timeout=20)
    consumer.close()
    for name in names:
        assert wait_until(lambda n=name: api(n2, f"/api/queues/%2F/{n}").json()["messages"] == 5, timeout=20)
        bodies = drain(n1.port, name)
        assert sorted(b for b, _ in bodies) == sorted(f"{name}-{i}".encode() for i in range(5))
        if name == "q0":
            assert dict(bodies)[got[0][0]] is True
    conn = pika_connect(n1.port)  # a drained node places nothing on itself, even client-local
    conn.channel().queue_declare("declared-on-drained", durable=True)
    conn.close()
    assert wait_until(lambda: led_by(cluster_url).get("declared-on-drained") == "n2", timeout=20)
    out = cluster_cli(cluster_url, "revive", "n1")
    assert out.returncode == 0, out.stderr
    got = api(n1, "/api/rebalance/queues", "POST")
    assert got.status_code == 200, got.text
    assert len(got.json()["moves"]) == 2
    assert wait_until(lambda: sorted(led_by(cluster_url).values()) == ["n1", "n1", "n2", "n2", "n2"], timeout=20)
    bad = cluster_cli(cluster_url, "drain", "nobody")
    assert bad.returncode == 1 and bad.stderr.strip() == \
        "exchange-broker cluster drain: error: no node named 'nobody' in the cluster"
