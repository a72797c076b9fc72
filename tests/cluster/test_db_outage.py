"""A cluster with per-queue leaders rides through its database going away (``cluster/db_lease.py``):
three real node processes, each reaching PostgreSQL through its own TCP proxy (``tcp_proxy.py``),
under four publishers with confirms and two acking consumers spread over every node. Every node's
connections hang for longer than the lease, or are all reset at once, or one node alone is cut off
and healed. No node exits, every confirmed message is consumed, no message is handed out twice
without the redelivered flag, and a node evicted meanwhile serves again after it rejoined."""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import pytest
from cluster_load import PERSISTENT, finish_load, run_load
from cluster_support import FAILOVER_TIMEOUT, wait_for_status

from eb_support import pika_connect, wait_until
from persistence.database_url import parse

LEADERS = ("--cluster-mode", "leaders")
OUTAGE = float(FAILOVER_TIMEOUT) * 3  # well past every node's lease

pytestmark = pytest.mark.slow


def proxied_three(nodes, cluster_url, tcp_proxy):
    db = parse(cluster_url)
    host, port = db.hosts[0].rsplit(":", 1)
    proxies = [tcp_proxy(host, int(port)) for _ in range(3)]
    urls = [f"postgresql://{db.param('user')}@{proxy.address}/{db.param('dbname')}" for proxy in proxies]
    started = nodes.together(("n1", *LEADERS), ("n2", *LEADERS), ("n3", *LEADERS), urls=urls)  # at once: peers
    return list(zip(started, proxies))


def declare_on(node, queue: str) -> None:
    conn = pika_connect(node.port)
    conn.channel().queue_declare(queue, durable=True)
    conn.close()


def flowing(publishers, consumers, more: int = 30, timeout: float = 60, but_on: int | None = None) -> bool:
    """Every client confirms (publishers) or gets (consumers) ``more`` messages; ``but_on``: leave
    out the clients connected to that node (index) now (a node cut off holds its clients' output)."""
    confirmed = {id(p): len(p.confirmed) for p in publishers}
    got = {id(c): len(c.got) for c in consumers}

    def counted(client) -> bool:
        return but_on is None or client.node % 3 != but_on

    return bool(wait_until(lambda: all(len(p.confirmed) > confirmed[id(p)] + more for p in publishers
                                       if counted(p)) and
                           all(len(c.got) > got[id(c)] + more for c in consumers if counted(c)), timeout=timeout))


def new_twice(publishers, consumers) -> list[bytes]:
    """Bodies handed out more than once without the redelivered flag (a publisher's own retries,
    published twice, may arrive twice)."""
    retried = set().union(*(p.retried for p in publishers))
    seen = Counter(body for c in consumers for _, body, redelivered in c.got if not redelivered)
    return [body for body, n in seen.items() if n > 1 and body not in retried]


def check_outcome(started, publishers, consumers) -> None:
    finish_load(publishers, consumers)  # every confirmed message consumed
    assert new_twice(publishers, consumers) == []
    for node, _proxy in started:
        assert node.proc.poll() is None, f"node {node.name} exited ({node.proc.returncode})"
        assert "stops serving" not in node.log()


@contextlib.contextmanager
def under_load(nodes, cluster_url, tcp_proxy, queue: str, leader: int):
    """Three proxied nodes, ``queue`` led by node ``leader`` (index), the load on every node,
    flowing; at the end the outcome is checked (``check_outcome``)."""
    started = proxied_three(nodes, cluster_url, tcp_proxy)
    declare_on(started[leader][0], queue)
    publishers, consumers = run_load([n.port for n, _ in started], queue)
    try:
        assert flowing(publishers, consumers)
        yield started, publishers, consumers
    finally:
        check_outcome(started, publishers, consumers)


def test_every_nodes_database_connections_hang_longer_than_the_lease(nodes, cluster_url, tcp_proxy):
    with under_load(nodes, cluster_url, tcp_proxy, "hang", 0) as (started, publishers, consumers):
        for _, proxy in started:
            proxy.hang()
        time.sleep(OUTAGE)
        for _, proxy in started:
            proxy.heal()
        healed = time.monotonic()
        assert flowing(publishers, consumers, timeout=90)
        print(f"confirms flowing again {time.monotonic() - healed:.1f} s after the heal")
    for node, _ in started:
        assert node.wait_for_log("cannot reach the database", 5)


def test_every_nodes_database_connections_are_reset_at_once(nodes, cluster_url, tcp_proxy):
    with under_load(nodes, cluster_url, tcp_proxy, "reset", 1) as (started, publishers, consumers):
        for _round in range(2):
            for _, proxy in started:
                proxy.reset()
            assert flowing(publishers, consumers, timeout=90)


def test_one_node_cut_off_alone_is_evicted_and_serves_again_after_the_cut_heals(nodes, cluster_url, tcp_proxy):
    with under_load(nodes, cluster_url, tcp_proxy, "cut", 0) as (started, publishers, consumers):
        (n1, cut), _, _ = started  # n1 leads the queue, and "idle" too (no load on it)
        declare_on(n1, "idle")
        watcher = pika_connect(n1.port)  # a consumer through n1 of a queue n1 leads, waiting
        wch = watcher.channel()
        cancels, idle_got = [], []
        wch.add_on_cancel_callback(lambda _frame: cancels.append(True))
        wch.basic_consume("idle", lambda c, m, _p, body: (idle_got.append(body), c.basic_ack(m.delivery_tag)))
        cut.hang()
        assert "n1" not in wait_for_status(cluster_url, lambda v: "n1" not in v, timeout=40)  # evicted by n2 or n3
        # the clients of n2 and n3 work on (n1's queue moved); n1's wait, connected
        assert flowing(publishers, consumers, timeout=90, but_on=0)
        cut.heal()
        healed = time.monotonic()
        assert n1.wait_for_log("and joined again as incarnation 2", 60)  # a new incarnation
        print(f"n1 joined again {time.monotonic() - healed:.1f} s after the heal")
        view = wait_for_status(cluster_url, lambda v: "n1" in v and v["n1"]["alive"], timeout=30)
        assert view["n1"]["alive"] and view["n1"]["queues"] == []  # it leads nothing now
        assert flowing(publishers, consumers, timeout=90)
        # the consumer through n1 was cancelled (consumer-cancel-notify), on the same connection
        assert wait_until(lambda: (watcher.process_data_events(0.05), cancels)[1], timeout=20)
        # a publish and a get through n1 reach the queue's new leader (n1 forwards through its placeholder)
        conn = pika_connect(n1.port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "idle", b"got", PERSISTENT)
        assert wait_until(lambda: ch.basic_get("idle", auto_ack=True)[2] == b"got", timeout=20)
        # consuming again through n1 works: the new leader's deliveries are relayed
        wch.basic_consume("idle", lambda c, m, _p, body: (idle_got.append(body), c.basic_ack(m.delivery_tag)))
        ch.basic_publish("", "idle", b"consumed", PERSISTENT)
        assert wait_until(lambda: (watcher.process_data_events(0.05), idle_got)[1] == [b"consumed"], timeout=20)
        # and a queue declared through n1 now is led by n1 again
        ch.queue_declare("after-cut", durable=True)
        ch.basic_publish("", "after-cut", b"served")
        assert wait_until(lambda: ch.basic_get("after-cut", auto_ack=True)[2] == b"served", timeout=20)
        conn.close()
        watcher.close()
