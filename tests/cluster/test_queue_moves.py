"""Queues follow the nodes (``--cluster-mode leaders``, real node processes on one throwaway
PostgreSQL database): the admin API of any node shows a queue's real counts and purges it. No
node fails over here, so the nodes get the long failover timeout of the tests that run beside
others (tests/cluster/conftest.py): a loaded machine does not make one give up mid-move."""

from __future__ import annotations

import subprocess
import sys

import pika
import pytest
import requests
from cluster_load import Consumer, Publisher, finish_load
from cluster_support import drain, publish_confirmed
from test_leaders import LEADERS, known_on, leaders_of

from eb_support import REPO, pika_connect, subprocess_env, wait_until

AUTH = ("guest", "guest")


def api(node, path: str, method: str = "GET"):
    return requests.request(method, f"http://127.0.0.1:{node.admin_port}{path}", auth=AUTH, timeout=20)


def test_any_node_shows_the_leaders_counts_and_purges(nodes):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))  # at once: peers
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


def clients_state(clients) -> str:
    return "; ".join(f"{getattr(c, 'prefix', c.queue)} on node {c.node % 3}: "
                     f"{len(getattr(c, 'confirmed', getattr(c, 'got', [])))} done, errors {c.errors[-2:]}"
                     for c in clients)


def progressed(publishers, consumers, n: int = 30):
    """``n`` more confirms and deliveries than now, on every queue."""
    marks = [(p, len(p.confirmed)) for p in publishers] + [(c, len(c.got)) for c in consumers]
    return lambda: all(len(x.confirmed if isinstance(x, Publisher) else x.got) >= m + n for x, m in marks)


@pytest.mark.slow
def test_rebalance_and_drain_under_load_lose_nothing(nodes, cluster_url):
    n1, n2, n3 = nodes.together(*[(name, *LEADERS) for name in ("n1", "n2", "n3")])  # at once: peers
    ports = [n1.port, n2.port, n3.port]
    for queue in ("load-a", "load-b"):  # both led by n1
        publish_confirmed(n1.port, queue, [])
    assert wait_until(lambda: all(known_on(n, q) for n in (n2, n3) for q in ("load-a", "load-b")), timeout=20)
    publishers = [Publisher(ports, i, q, f"{q[-1]}p{i}") for q in ("load-a", "load-b") for i in range(2)]
    consumers = [Consumer(ports, 1 + i, q) for i, q in enumerate(("load-a", "load-b"))]
    for client in publishers + consumers:
        client.start()
    try:
        assert wait_until(progressed(publishers, consumers), timeout=60), clients_state(publishers + consumers)
        out = cluster_cli(cluster_url, "rebalance")
        assert out.returncode == 0 and "1 queue(s) moved" in out.stdout, out.stdout + out.stderr
        assert sorted(led_by(cluster_url).values()) == ["n1", "n2"]
        assert wait_until(progressed(publishers, consumers), timeout=60), clients_state(publishers + consumers)
        out = cluster_cli(cluster_url, "drain", "n1")
        assert out.returncode == 0 and "1 queue(s) moved" in out.stdout, out.stdout + out.stderr
        assert sorted(led_by(cluster_url).values()) == ["n2", "n3"]
        assert wait_until(progressed(publishers, consumers), timeout=60), clients_state(publishers + consumers)
    except BaseException:
        for client in publishers + consumers:
            client.stop_event.set()
        raise
    finish_load(publishers, consumers)  # every confirmed message consumed
    assert sum(c.cancels for c in consumers) >= 2  # consumer-cancel-notify on each move
    retried = set().union(*(p.retried for p in publishers))
    fresh: dict[bytes, int] = {}
    for c in consumers:
        for _t, body, redelivered in c.got:
            if not redelivered and body not in retried:
                fresh[body] = fresh.get(body, 0) + 1
    assert not [b for b, n in fresh.items() if n > 1], "delivered twice without the redelivered flag"


@pytest.mark.slow
def test_a_forwarded_publish_is_never_forwarded_again(nodes, cluster_url):
    """A placeholder takes a forwarded message (the node that sent it thinks this node leads the
    queue: it moved meanwhile) with a nack at once, never a second hop (two placeholders pointing
    at each other during a move would each wait for the other's confirm); the publisher's channel
    gets that nack although the queue decided it before the publish returned."""
    from persistence.cluster_leaders import LeadersStore
    from persistence.cluster_store import ClusterStore
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))  # at once: peers
    publish_confirmed(n1.port, "led-by-n1", [b"first"])
    assert wait_until(lambda: known_on(n2, "led-by-n1"), timeout=20)
    store = ClusterStore(cluster_url)
    try:
        secret = LeadersStore(store).link_secret()
    finally:
        store.close()
    params = pika.ConnectionParameters("127.0.0.1", n2.port, "/", pika.PlainCredentials("exchange-broker-cluster", secret))
    link = pika.BlockingConnection(params)
    try:
        ch = link.channel()
        ch.confirm_delivery()
        for _ in range(2):  # each nacked (the second would wait forever if the first's nack were stuck)
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", "led-by-n1", b"second hop", pika.BasicProperties(delivery_mode=2))
    finally:
        link.close()
    publish_confirmed(n2.port, "led-by-n1", [b"through n2"])  # a client's publish is forwarded as ever
    assert sorted(b for b, _ in drain(n2.port, "led-by-n1")) == [b"first", b"through n2"]
