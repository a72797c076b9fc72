"""A cluster with per-queue leaders under load (``--cluster-mode leaders``; three real node
processes on one throwaway PostgreSQL database): a dead leader's queues are spread over the live
nodes with every confirmed message back; the node leading a queue is SIGKILLed, or paused past its
lease and resumed, or every node restarts in turn, while four publishers with confirms and two
consumers work through the other nodes. No confirmed message is lost; consumers get basic.cancel
when their queue's leader goes and consume again through their node.

The nodes keep every connection where it came in (``--no-cluster-connection-handoff``): these are
the tests of forwarding message by message, which is also what any connection gets that holds
something when it first names a queue another node leads. Handed-off connections under the same
failures: test_leaders_handoff.py."""

from __future__ import annotations

import signal
import time

import pika
import pytest
from cluster_load import finish_load, run_load
from cluster_support import FAILOVER_TIMEOUT, delivered_mark, hold_unacked, wait_for_status
from test_leaders import PERSISTENT, known_on, leaders_of

from eb_support import pika_connect, wait_until

LEADERS = ("--cluster-mode", "leaders", "--no-cluster-connection-handoff")

pytestmark = pytest.mark.slow


def three(nodes):
    return tuple(nodes.together(("n1", *LEADERS), ("n2", *LEADERS), ("n3", *LEADERS)))  # at once: peers


def led_by(url: str, queue: str) -> str | None:
    view = wait_for_status(url, lambda v: True)
    return next((name for name, node in view.items() if node["alive"] and
                 any(q["name"] == queue for q in node["queues"])), None)


def declare_on(node, queue: str) -> None:
    conn = pika_connect(node.port)
    conn.channel().queue_declare(queue, durable=True)
    conn.close()


def test_a_killed_leaders_queues_are_spread_over_the_survivors_with_every_message(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    queues = [f"spread-{i}" for i in range(6)]
    conn = pika_connect(n1.port)
    ch = conn.channel()
    for q in queues:
        ch.queue_declare(q, durable=True)
    conn.close()
    prod = pika_connect(n2.port)  # published through n2: forwarded to n1, confirmed by it
    p = prod.channel()
    p.confirm_delivery()
    assert wait_until(lambda: all(known_on(n2, q) for q in queues), timeout=10)
    for q in queues:
        for i in range(20):
            p.basic_publish("", q, f"{q}/{i}".encode(), PERSISTENT, mandatory=True)
    prod.close()
    # a consumer on n3 holds 5 unacked deliveries of spread-0 when n1 dies
    cons, held = hold_unacked(n3.port, "spread-0", 5)
    # the delivered mark (what makes a redelivery "redelivered") is stored by the leader's next
    # group commit: wait for it, as the kill could otherwise come first
    assert wait_until(lambda: delivered_mark(cluster_url, "spread-0") >= 5, timeout=10)
    n1.kill()
    killed = time.monotonic()
    assert wait_until(lambda: set(leaders_of(cluster_url).values()) == {"n2", "n3"} and
                      len(leaders_of(cluster_url)) == len(queues), timeout=30)
    view = leaders_of(cluster_url)
    counts = {n: sum(1 for leader in view.values() if leader == n) for n in ("n2", "n3")}
    assert counts == {"n2": 3, "n3": 3}  # spread fairly, not all taken by one
    for q in queues:
        drained = []
        node = n2 if view[q] == "n2" else n3
        assert wait_until(lambda q=q, node=node: known_on(node, q), timeout=10)
        other = pika_connect((n3 if node is n2 else n2).port)  # drained through the node that does not lead it
        o = other.channel()
        assert wait_until(lambda o=o, q=q: o.queue_declare(q, passive=True) is not None, timeout=10)
        while True:
            method, _props, body = o.basic_get(q, auto_ack=True)
            if method is None:
                if len(drained) >= 20:
                    break
                time.sleep(0.05)
                continue
            drained.append((body, method.redelivered))
        other.close()
        assert sorted(b for b, _ in drained) == sorted(f"{q}/{i}".encode() for i in range(20))
        if q == "spread-0":  # the five held by the consumer came back marked redelivered
            assert {b for b, r in drained if r} == set(held)
    assert time.monotonic() - killed < float(FAILOVER_TIMEOUT) + 25
    try:
        cons.close()
    except pika.exceptions.AMQPError:
        pass


def test_sigkill_of_a_queues_leader_under_load_loses_no_confirmed_message(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    declare_on(n1, "orders")  # n1 leads it; every client works through n2 and n3
    assert wait_until(lambda: led_by(cluster_url, "orders") == "n1", timeout=20)
    publishers, consumers = run_load([n2.port, n3.port], "orders")
    try:
        assert wait_until(lambda: all(len(p.confirmed) > 50 for p in publishers) and
                          all(len(c.got) > 20 for c in consumers), timeout=30)
        n1.kill()  # SIGKILL: no clean-up of any kind
        killed = time.monotonic()
        before = {id(c): len(c.got) for c in consumers}
        assert wait_until(lambda: all(len(c.got) > before[id(c)] + 50 for c in consumers), timeout=40)
        resumed = min(t for c in consumers for t, _, _ in c.got if t > killed)
        # the failover bound of these nodes (2 s) and a settle beat, with room for a loaded machine
        assert resumed - killed < float(FAILOVER_TIMEOUT) + 15
        assert led_by(cluster_url, "orders") in ("n2", "n3")
        assert wait_until(lambda: all(len(p.confirmed) > 50 + p.reconnects for p in publishers), timeout=30)
    finally:
        finish_load(publishers, consumers)
    assert any(c.cancels for c in consumers)  # told by basic.cancel, and consumed again
    view = wait_for_status(cluster_url, lambda v: "n1" not in v)
    assert "n1" not in view  # evicted


def test_a_paused_leader_is_replaced_delivers_nothing_when_it_resumes_and_joins_again(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    declare_on(n1, "paused")
    assert wait_until(lambda: led_by(cluster_url, "paused") == "n1", timeout=20)
    publishers, consumers = run_load([n2.port, n3.port], "paused")
    try:
        assert wait_until(lambda: all(len(p.confirmed) > 50 for p in publishers) and
                          all(len(c.got) > 20 for c in consumers), timeout=30)
        n1.proc.send_signal(signal.SIGSTOP)  # a long pause: no beats, its sessions and sockets stay open
        try:
            assert wait_until(lambda: led_by(cluster_url, "paused") in ("n2", "n3"), timeout=40)
            before = {id(c): len(c.got) for c in consumers}
            assert wait_until(lambda: all(len(c.got) > before[id(c)] + 50 for c in consumers), timeout=40)
        finally:
            n1.proc.send_signal(signal.SIGCONT)
        # resumed, n1 holds its output (its lease may have run out), finds itself evicted, drops its
        # copy of the queue and the connections with held output, and joins again: no exit
        assert n1.wait_for_log("and joined again as incarnation", 30)
        assert n1.proc.poll() is None
        assert wait_until(lambda: all(len(p.confirmed) > 100 for p in publishers), timeout=30)
    finally:
        finish_load(publishers, consumers)
    # no message was delivered by two leaders: apart from redeliveries, and from messages published
    # again because their confirm never came (at least once), each body came once
    first_time = [body for c in consumers for _, body, redelivered in c.got if not redelivered]
    twice = {body for body in first_time if first_time.count(body) > 1}
    assert twice <= set().union(*(p.retried for p in publishers))


def test_a_rolling_restart_of_all_three_leaders_under_load_loses_nothing(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    all_nodes = [n1, n2, n3]
    declare_on(n1, "rolling")
    publishers, consumers = run_load([n.port for n in all_nodes], "rolling")
    try:
        for node in all_nodes:
            assert wait_until(lambda: all(len(c.got) > 20 for c in consumers), timeout=30)
            confirmed = sum(len(p.confirmed) for p in publishers)
            assert node.terminate() == 0  # SIGTERM: a clean stop; its queues move at once
            assert wait_until(lambda n=node: led_by(cluster_url, "rolling") not in (None, n.name), timeout=30)
            node.start_node()
            assert wait_until(lambda c=confirmed: sum(len(p.confirmed) for p in publishers) > c + 100, timeout=40)
    finally:
        finish_load(publishers, consumers)
    got = {body for c in consumers for _, body, _ in c.got}
    assert all(p.confirmed and set(p.confirmed) <= got for p in publishers)
    try:  # every node serves again
        for node in all_nodes:
            pika_connect(node.port).close()
    except pika.exceptions.AMQPError as exc:
        pytest.fail(f"a restarted node does not serve: {exc}")
