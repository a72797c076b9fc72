"""Shovels and federation links in a cluster with per-queue leaders (two real node processes on
one throwaway PostgreSQL database; the other ends are a third, standalone broker): each runs on
exactly one node, a node that did not declare it follows the stored parameter, /api/shovels and
/api/federation-links on any node list every node's (with ``node``), and when the node running one
is SIGKILLed the other takes it over and the messages keep moving (none lost)."""

from __future__ import annotations

import sys
import time
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


def listed(node, path: str = "/api/shovels") -> list[tuple[str, str, str]]:
    """``(name or id, state, node running it)`` of what ``node``'s admin API lists."""
    try:
        code, body = Api(f"http://127.0.0.1:{node.admin_port}").get(path)
    except OSError:
        return []
    if code != 200:
        return []
    return sorted((s.get("name") or s.get("id"), s.get("state") or s.get("status"), s["node"]) for s in body)


def running_on(node, path: str = "/api/shovels") -> list[str]:
    """What ``node`` itself runs (every node lists every node's)."""
    return [name for name, state, where in listed(node, path) if state == "running" and where == node.name]


def drain_ids(port: int, queue: str) -> Counter:
    conn = pika_connect(port)
    try:
        ch, ids = conn.channel(), Counter()
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids[props.message_id] += 1
    finally:
        close_quietly(conn)


def test_a_shovel_runs_on_one_node_and_moves_when_it_dies(nodes, workdir):
    (workdir / "ends").mkdir()
    ends = SubprocessBroker(workdir / "ends").start()
    try:
        n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))  # at once: peers
        publish(ends.port, "src", N)
        value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{ends.port}", "src-queue": "src",
                 "dest-uri": f"amqp://guest:guest@127.0.0.1:{ends.port}", "dest-queue": "dst",
                 "prefetch-count": PREFETCH, "reconnect-delay": 0.5}
        api = Api(f"http://127.0.0.1:{n1.admin_port}")
        assert api.put("/api/parameters/shovel/%2F/move", {"value": value})[0] == 201
        assert wait_until(lambda: running_on(n1) + running_on(n2) == ["move"], 30)
        owner, other = (n1, n2) if running_on(n1) else (n2, n1)
        # either node lists it, naming the node that runs it; its status and restart are asked there
        assert listed(n1) == listed(n2) == [("move", "running", owner.name)]
        other_api = Api(f"http://127.0.0.1:{other.admin_port}")
        assert other_api.ok("GET", "/api/shovels/vhost/%2F/move")["node"] == owner.name
        assert other_api.delete("/api/shovels/vhost/%2F/move/restart")[0] == 204
        assert other_api.get("/api/shovels/vhost/%2F/nonesuch")[0] == 404
        # the other node knows the parameter (it follows the store) but does not run it
        # (the store's change reaches it through the definitions mirror: not always before the owner runs it)
        known = Api(f"http://127.0.0.1:{other.admin_port}")
        assert wait_until(lambda: known.get("/api/parameters/shovel/%2F/move")[0] == 200, 20)
        assert known.ok("GET", "/api/parameters/shovel/%2F/move")["value"] == value
        assert wait_until(lambda: depth(ends.port, "dst") >= N // 4, 60)
        owner.kill()
        assert wait_until(lambda: running_on(other) == ["move"], 40)
        assert wait_until(lambda: depth(ends.port, "src") == 0 and depth(ends.port, "dst") >= N, 60)
        assert wait_until(lambda: listed(owner) == [] and listed(other) == [("move", "running", other.name)], 20)
        ids = drain_ids(ends.port, "dst")
        assert set(ids) == {str(i) for i in range(N)}  # none lost
        assert sum(ids.values()) - N <= PREFETCH  # at least once: only what was in flight came twice
    finally:
        ends.kill()


def queue_messages(node, queue: str) -> int:
    """The queue's message count as the cluster knows it (asked of its leader by the admin API)."""
    try:
        code, body = Api(f"http://127.0.0.1:{node.admin_port}").get(f"/api/queues/%2F/{queue}")
    except OSError:
        return -1
    return body.get("messages") or 0 if code == 200 else -1


def send_ids(port: int, exchange: str, key: str, ids: range) -> None:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in ids:
            ch.basic_publish(exchange, key, b"x" * 50, pika.BasicProperties(message_id=str(i), delivery_mode=2))
    finally:
        close_quietly(conn)


def diagnose(n1, n2, up) -> str:
    out = []
    for n in (n1, n2):
        a = Api(f"http://127.0.0.1:{n.admin_port}")
        out.append(f"{n.name} links {a.get('/api/federation-links')[1]}")
        out.append(f"{n.name} bindings {a.get('/api/bindings')[1]}")
        out.append(f"{n.name} queue {a.get('/api/queues/%2F/fed-got')[1]}")
    out.append(f"up queue {depth(up.port, 'federation:fx:fed-cluster')}")
    return "\n".join(out)


def test_a_federation_link_runs_on_one_node_and_moves_when_it_dies(nodes, workdir):
    """Exchange federation from a standalone upstream into a cluster whose nodes share one
    ``--cluster-name`` (so the link's queue on the upstream is the same whichever node runs it):
    the link runs on one node, both list it, and after a SIGKILL of that node the other runs it and
    what was published meanwhile (kept in the upstream queue) comes over: none lost."""
    (workdir / "up").mkdir()
    up = SubprocessBroker(workdir / "up").start()
    try:
        same_name = ("--cluster-name", "fed-cluster")
        n1, n2 = nodes.together(("n1", *LEADERS, *same_name), ("n2", *LEADERS, *same_name))  # peers
        conn = pika_connect(n1.port)
        try:
            ch = conn.channel()
            ch.exchange_declare("fx", "direct", durable=True)
            ch.queue_declare("fed-got", durable=True)
            ch.queue_bind("fed-got", "fx", "k")
        finally:
            close_quietly(conn)
        api = Api(f"http://127.0.0.1:{n2.admin_port}")
        api.ok("PUT", "/api/parameters/federation-upstream/%2F/up",
               {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}", "prefetch-count": PREFETCH,
                          "reconnect-delay": 0.5}})
        api.ok("PUT", "/api/policies/%2F/fed", {"pattern": "^fx$", "apply-to": "exchanges",
                                                "definition": {"federation-upstream": "up"}})
        links = "/api/federation-links"
        assert wait_until(lambda: running_on(n1, links) + running_on(n2, links) == ["fx <- up"], 40), \
            (listed(n1, links), listed(n2, links))
        owner, other = (n1, n2) if running_on(n1, links) else (n2, n1)
        assert listed(n1, links) == listed(n2, links) == [("fx <- up", "running", owner.name)]
        time.sleep(1.5)  # the link bound its upstream queue with "k" (checked every 0.5 s)
        send_ids(up.port, "fx", "k", range(0, 500))
        assert wait_until(lambda: queue_messages(other, "fed-got") >= 250, 60), diagnose(n1, n2, up)
        owner.kill()
        send_ids(up.port, "fx", "k", range(500, 1000))  # while no node runs the link
        assert wait_until(lambda: running_on(other, links) == ["fx <- up"], 40), listed(other, links)
        assert wait_until(lambda: queue_messages(other, "fed-got") >= 1000, 60), queue_messages(other, "fed-got")
        ids = drain_ids(other.port, "fed-got")
        assert set(ids) == {str(i) for i in range(1000)}, f"{1000 - len(ids)} lost"
        assert sum(ids.values()) - 1000 <= PREFETCH  # at least once: only what was in flight came twice
    finally:
        up.kill()
