"""A cluster with per-queue leaders (``--cluster-mode leaders``): three real node processes on one
throwaway PostgreSQL database, every node serving. Queues are led by the node that declared
them; the others forward publishes and relay deliveries. No node fails here (a dead leader's queues:
test_leaders_failover.py), so these run beside other tests, their nodes on a long failover
timeout (tests/conftest.py UNGROUPED)."""

from __future__ import annotations

import time

import pika
import pytest
import requests
from cluster_support import wait_for_status

from eb_support import pika_connect, wait_until

LEADERS = ("--cluster-mode", "leaders")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def three(nodes):
    return tuple(nodes.together(("n1", *LEADERS), ("n2", *LEADERS), ("n3", *LEADERS)))  # at once: peers


def leaders_of(url: str) -> dict[str, str]:
    """queue name -> the node that leads it (``cluster status``'s view)."""
    view = wait_for_status(url, lambda v: True)
    return {q["name"]: name for name, node in view.items() if node["alive"] for q in node["queues"]}


def known_on(node, queue: str) -> bool:
    """The node's admin API lists the queue (its definitions caught up)."""
    got = requests.get(f"http://127.0.0.1:{node.admin_port}/api/queues/%2F/{queue}", auth=("guest", "guest"),
                       timeout=10)
    return got.status_code == 200


def bindings_on(node, exchange: str) -> int:
    got = requests.get(f"http://127.0.0.1:{node.admin_port}/api/exchanges/%2F/{exchange}/bindings/source",
                       auth=("guest", "guest"), timeout=10)
    return len(got.json()) if got.status_code == 200 else 0


def test_every_node_serves_and_leads_the_queues_declared_on_it(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    assert n1.is_active() and n2.is_active() and n3.is_active()  # every node serves
    for node, queue in ((n1, "q-one"), (n2, "q-two"), (n3, "q-three")):
        conn = pika_connect(node.port)
        conn.channel().queue_declare(queue, durable=True)
        conn.close()
    assert wait_until(lambda: leaders_of(cluster_url) == {"q-one": "n1", "q-two": "n2", "q-three": "n3"}, timeout=20)
    for node in (n1, n2, n3):  # every node knows every queue
        assert wait_until(lambda n=node: all(known_on(n, q) for q in ("q-one", "q-two", "q-three")), timeout=10)


def test_tutorial_patterns_across_nodes(nodes):
    n1, n2, n3 = three(nodes)
    declarer, prod, cons = pika_connect(n1.port), pika_connect(n2.port), pika_connect(n3.port)
    requests_seen: list = []
    try:
        d, p, c = declarer.channel(), prod.channel(), cons.channel()
        p.confirm_delivery()
        # work queue: led by n1, published with confirms on n2, consumed with acks on n3
        d.queue_declare("tasks", durable=True)
        assert wait_until(lambda: known_on(n2, "tasks") and known_on(n3, "tasks"), timeout=10)
        for i in range(10):
            p.basic_publish("", "tasks", f"task {i}".encode(), PERSISTENT, mandatory=True)
        got = []
        for _ in range(10):
            method, _props, body = c.basic_get("tasks")
            assert method is not None
            got.append(body)
            c.basic_ack(method.delivery_tag)
        assert got == [f"task {i}".encode() for i in range(10)]
        assert d.queue_declare("tasks", passive=True).method.message_count == 0  # acked on the leader
        # routing and topics: durable queues and bindings made on n1 route publishes made on n2
        d.exchange_declare("direct_logs", "direct", durable=True)
        d.exchange_declare("topic_logs", "topic", durable=True)
        d.queue_declare("errors", durable=True)
        d.queue_declare("kern", durable=True)
        d.queue_bind("errors", "direct_logs", "error")
        d.queue_bind("kern", "topic_logs", "kern.*")
        assert wait_until(lambda: bindings_on(n2, "direct_logs") == 1 and bindings_on(n2, "topic_logs") == 1,
                          timeout=10)
        p.basic_publish("direct_logs", "error", b"an error", PERSISTENT)
        p.basic_publish("direct_logs", "info", b"not routed to errors", PERSISTENT)
        p.basic_publish("topic_logs", "kern.critical", b"kernel", PERSISTENT)
        p.basic_publish("topic_logs", "cron.critical", b"not kernel", PERSISTENT)
        for queue, expected in [("errors", b"an error"), ("kern", b"kernel")]:
            method, _props, body = c.basic_get(queue, auto_ack=True)
            assert body == expected
            assert c.basic_get(queue, auto_ack=True) == (None, None, None)
        # a mandatory publish to a queue nobody has is returned on the node it was published to
        with pytest.raises(pika.exceptions.UnroutableError):
            p.basic_publish("", "no-such-queue", b"x", PERSISTENT, mandatory=True)
        # publish/subscribe as in the tutorial: a transient fanout exchange and exclusive,
        # server-named queues declared on n3; publishes on n2 reach them (shared definitions)
        c.exchange_declare("logs", "fanout")
        subscribers = [c.queue_declare("", exclusive=True).method.queue for _ in range(2)]
        for queue in subscribers:
            c.queue_bind(queue, "logs")
        assert wait_until(lambda: bindings_on(n2, "logs") == 2, timeout=10)
        p.basic_publish("logs", "", b"to all")
        for queue in subscribers:
            assert wait_until(lambda q=queue: c.queue_declare(q, passive=True).method.message_count == 1, timeout=10)
            assert c.basic_get(queue, auto_ack=True)[2] == b"to all"
        # RPC: the server consumes on n1; the client on n2 waits on an exclusive reply queue, which
        # the server's reply reaches through n1
        reply_to = p.queue_declare("", exclusive=True).method.queue
        d.queue_declare("rpc_queue")
        assert wait_until(lambda: known_on(n1, reply_to) and known_on(n2, "rpc_queue"), timeout=10)
        p.basic_publish("", "rpc_queue", b"21", pika.BasicProperties(reply_to=reply_to, correlation_id="c1"))
        assert wait_until(lambda: requests_seen.append(d.basic_get("rpc_queue", auto_ack=True)) is None and
                          requests_seen[-1][0] is not None, timeout=10)
        _method, props, body = requests_seen[-1]
        d.basic_publish("", props.reply_to, str(int(body) * 2).encode(),
                        pika.BasicProperties(correlation_id=props.correlation_id))
        assert wait_until(lambda: p.queue_declare(reply_to, passive=True).method.message_count == 1, timeout=10)
        _method, props, body = p.basic_get(reply_to, auto_ack=True)
        assert (body, props.correlation_id) == (b"42", "c1")
        # push consumers relayed from the leader: prefetch 5 on n3, publishes on n2, in order
        c.basic_qos(prefetch_count=5)
        pushed = []
        c.basic_consume("tasks", lambda ch, m, _p, b: (pushed.append(b), ch.basic_ack(m.delivery_tag)))
        for i in range(50):
            p.basic_publish("", "tasks", f"push {i}".encode(), PERSISTENT)
        assert wait_until(lambda: (cons.process_data_events(0.05), len(pushed) == 50)[1], timeout=20)
        assert pushed == [f"push {i}".encode() for i in range(50)]
    finally:
        for conn in (declarer, prod, cons):
            conn.close()


def test_queue_types_and_features_across_nodes(nodes):
    """Quorum queues with dead-lettering, streams read by offset and single active consumers, each
    led by one node and used through the others."""
    n1, n2, n3 = three(nodes)
    lead, prod, cons = pika_connect(n1.port), pika_connect(n2.port), pika_connect(n3.port)
    try:
        d, p, c = lead.channel(), prod.channel(), cons.channel()
        p.confirm_delivery()
        # a quorum queue led by n1 dead-letters rejected messages to a queue led by n2
        p.exchange_declare("dlx", "fanout", durable=True)
        p.queue_declare("dead", durable=True)
        p.queue_bind("dead", "dlx")
        d.queue_declare("jobs", durable=True, arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx"})
        assert wait_until(lambda: known_on(n2, "jobs") and known_on(n3, "jobs") and known_on(n1, "dead")
                          and bindings_on(n1, "dlx") == 1, timeout=10)
        for i in range(3):
            p.basic_publish("", "jobs", f"job {i}".encode(), PERSISTENT, mandatory=True)
        method, _props, body = c.basic_get("jobs")
        c.basic_nack(method.delivery_tag, requeue=True)  # back on the leader, redelivered first
        method, props, body = c.basic_get("jobs")
        assert (body, method.redelivered) == (b"job 0", True)
        c.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered by n1 into n2's queue
        assert wait_until(lambda: c.queue_declare("dead", passive=True) is not None and
                          known_on(n3, "dead"), timeout=10)
        dead = (None, None, None)
        deadline = time.monotonic() + 10
        while dead[0] is None and time.monotonic() < deadline:
            dead = c.basic_get("dead", auto_ack=True)
            time.sleep(0.05)
        assert dead[2] == b"job 0" and dead[1].headers["x-death"][0]["queue"] == "jobs"
        # a stream led by n1, published on n2, read from the first offset on n3 (prefetch required)
        d.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
        assert wait_until(lambda: known_on(n2, "events") and known_on(n3, "events"), timeout=10)
        for i in range(20):
            p.basic_publish("", "events", f"event {i}".encode(), PERSISTENT, mandatory=True)
        c.basic_qos(prefetch_count=10)
        streamed = []
        c.basic_consume("events", lambda ch, m, pr, b: (streamed.append((b, pr.headers["x-stream-offset"])),
                                                          ch.basic_ack(m.delivery_tag)),
                        arguments={"x-stream-offset": "first"})
        assert wait_until(lambda: (cons.process_data_events(0.05), len(streamed) == 20)[1], timeout=20)
        assert streamed == [(f"event {i}".encode(), i) for i in range(20)]
        # single active consumer: consumers on n2 and n3, one gets everything until it goes
        d.queue_declare("sac", durable=True, arguments={"x-single-active-consumer": True})
        assert wait_until(lambda: known_on(n2, "sac") and known_on(n3, "sac"), timeout=10)
        p2 = prod.channel()
        first, second = [], []
        p2.basic_consume("sac", lambda ch, m, _p, b: (first.append(b), ch.basic_ack(m.delivery_tag)))
        c.basic_consume("sac", lambda ch, m, _p, b: (second.append(b), ch.basic_ack(m.delivery_tag)))
        time.sleep(0.3)  # both consumers registered on the leader (no assertion rests on timing)
        for i in range(10):
            p.basic_publish("", "sac", f"s{i}".encode(), PERSISTENT)
        assert wait_until(lambda: (prod.process_data_events(0.02), cons.process_data_events(0.02),
                                   len(first) + len(second) == 10)[2], timeout=20)
        assert sorted([first, second], key=len) == [[], [f"s{i}".encode() for i in range(10)]]
    finally:
        for conn in (lead, prod, cons):
            conn.close()


def test_purge_and_delete_through_a_node_that_does_not_lead_the_queue(nodes):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    lead, other = pika_connect(n1.port), pika_connect(n2.port)
    try:
        d, o = lead.channel(), other.channel()
        o.confirm_delivery()
        d.queue_declare("kept", durable=True)
        assert wait_until(lambda: known_on(n2, "kept"), timeout=10)
        for i in range(7):
            o.basic_publish("", "kept", f"k{i}".encode(), PERSISTENT, mandatory=True)
        assert o.queue_purge("kept").method.message_count == 7  # the leader's count
        assert d.queue_declare("kept", passive=True).method.message_count == 0
        o.basic_publish("", "kept", b"one more", PERSISTENT, mandatory=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:  # the leader's if-empty check
            o.queue_delete("kept", if_empty=True)
        assert refused.value.reply_code == 406 and "not empty" in refused.value.reply_text
        o = other.channel()
        assert o.queue_delete("kept").method.message_count == 1
        assert wait_until(lambda: not known_on(n1, "kept") and not known_on(n2, "kept"), timeout=10)
        o.queue_declare("kept", durable=True)  # declared again at once: a new queue, led by n2 now
        assert wait_until(lambda: known_on(n1, "kept"), timeout=10)
        assert d.queue_declare("kept", passive=True).method.message_count == 0
    finally:
        lead.close()
        other.close()


def test_the_balanced_locator_spreads_queues_declared_on_one_node(nodes, cluster_url):
    """Every client on n1 (as behind one address): with --queue-leader-locator balanced the queues are
    led by the node leading the fewest; each is usable as soon as its declare-ok came."""
    balanced = (*LEADERS, "--queue-leader-locator", "balanced")
    n1, _n2, n3 = nodes.together(("n1", *balanced), ("n2", *balanced), ("n3", *balanced))  # at once: peers
    conn = pika_connect(n1.port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        # n1 knows every live node once it has applied a change made after n3 began to serve
        marker = pika_connect(n3.port)
        marker.channel().queue_declare("marker", durable=True)
        marker.close()
        assert wait_until(lambda: known_on(n1, "marker"), timeout=10)
        for i in range(6):
            ch.queue_declare(f"b{i}", durable=True)
            ch.basic_publish("", f"b{i}", f"first in b{i}".encode(), PERSISTENT, mandatory=True)  # confirmed: served
        local = ch.queue_declare("pinned", durable=True, arguments={"x-queue-leader-locator": "client-local"})
        assert local.method.queue == "pinned"
        view = leaders_of(cluster_url)
        assert view["pinned"] == "n1"
        led = {n: sum(1 for q, leader in view.items() if leader == n and q != "pinned") for n in ("n1", "n2", "n3")}
        assert sum(led.values()) == 7 and max(led.values()) - min(led.values()) <= 1  # "marker" and b0-b5
        for i in range(6):
            method, _props, body = ch.basic_get(f"b{i}", auto_ack=True)
            assert body == f"first in b{i}".encode()
    finally:
        conn.close()


def test_the_same_queue_declared_on_two_nodes_at_once_keeps_every_confirmed_message(nodes):
    """Clients on n1 and n2 declare the same new queue at the same moment and publish to it with
    confirms: one node's queue is kept (the other's becomes a placeholder for it); every message
    either side had confirmed is in it."""
    import threading
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    conns = [pika_connect(n1.port), pika_connect(n2.port)]
    try:
        channels = [c.channel() for c in conns]
        for ch in channels:
            ch.confirm_delivery()
        confirmed: dict[str, list[bytes]] = {}

        def declare_and_publish(i: int, queue: str, gate: threading.Barrier) -> None:
            ch = channels[i]
            gate.wait()
            ch.queue_declare(queue, durable=True)
            for k in range(5):
                body = f"{queue}/n{i + 1}/{k}".encode()
                try:
                    ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)
                except pika.exceptions.NackError:
                    continue  # not stored: the publisher was told so
                confirmed.setdefault(queue, []).append(body)
        for r in range(10):
            queue = f"race-{r}"
            gate = threading.Barrier(2)
            threads = [threading.Thread(target=declare_and_publish, args=(i, queue, gate)) for i in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        for r in range(10):
            queue = f"race-{r}"
            got = []
            assert wait_until(lambda q=queue: known_on(n1, q) and known_on(n2, q), timeout=10)
            while True:
                method, _props, body = channels[0].basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.append(body)
            assert set(confirmed.get(queue, [])) <= set(got), queue
    finally:
        for c in conns:
            c.close()


def test_an_auto_delete_queue_goes_when_its_last_consumer_on_any_node_goes(nodes):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    c1, c2 = pika_connect(n1.port), pika_connect(n2.port)
    try:
        ch1, ch2 = c1.channel(), c2.channel()
        ch1.queue_declare("auto", durable=True, auto_delete=True)
        assert wait_until(lambda: known_on(n2, "auto"), timeout=10)
        tag2 = ch2.basic_consume("auto", lambda *_: None)  # relayed from n1
        tag1 = ch1.basic_consume("auto", lambda *_: None)
        assert wait_until(lambda: requests.get(f"http://127.0.0.1:{n1.admin_port}/api/queues/%2F/auto",
                                               auth=("guest", "guest"), timeout=10).json()["consumers"] == 2,
                          timeout=10)
        ch2.basic_cancel(tag2)  # n2's consumer goes: the queue stays, n1's consumer still uses it
        assert wait_until(lambda: requests.get(f"http://127.0.0.1:{n1.admin_port}/api/queues/%2F/auto",
                                               auth=("guest", "guest"), timeout=10).json()["consumers"] == 1,
                          timeout=10)
        assert known_on(n1, "auto") and known_on(n2, "auto")
        ch1.basic_cancel(tag1)  # the last one: deleted by its leader, gone on every node
        assert wait_until(lambda: not known_on(n1, "auto") and not known_on(n2, "auto"), timeout=10)
    finally:
        c1.close()
        c2.close()


def test_message_ttl_applies_on_the_leader_for_messages_published_through_another_node(nodes):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    lead, other = pika_connect(n1.port), pika_connect(n2.port)
    try:
        d, o = lead.channel(), other.channel()
        o.confirm_delivery()
        d.queue_declare("short-lived", durable=True, arguments={"x-message-ttl": 200})
        d.queue_declare("per-message", durable=True)
        assert wait_until(lambda: known_on(n2, "short-lived") and known_on(n2, "per-message"), timeout=10)
        o.basic_publish("", "short-lived", b"queue ttl", PERSISTENT, mandatory=True)
        o.basic_publish("", "per-message", b"message ttl", pika.BasicProperties(delivery_mode=2, expiration="200"),
                        mandatory=True)
        o.basic_publish("", "per-message", b"kept", PERSISTENT, mandatory=True)
        assert wait_until(lambda: d.queue_declare("short-lived", passive=True).method.message_count == 0, timeout=10)
        assert wait_until(lambda: d.queue_declare("per-message", passive=True).method.message_count == 1, timeout=10)
        assert o.basic_get("per-message", auto_ack=True)[2] == b"kept"
    finally:
        lead.close()
        other.close()


def test_a_streams_chunks_and_info_are_served_by_its_leaders_admin_api(nodes):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    conn = pika_connect(n1.port)
    try:
        ch = conn.channel()
        ch.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
        assert wait_until(lambda: known_on(n2, "log"), timeout=10)
        auth = ("guest", "guest")
        assert requests.get(f"http://127.0.0.1:{n1.admin_port}/api/stream-chunks/%2F/log?from=0&to=1", auth=auth,
                            timeout=10).status_code == 200
        elsewhere = requests.get(f"http://127.0.0.1:{n2.admin_port}/api/stream-chunks/%2F/log?from=0&to=1", auth=auth,
                                 timeout=10)
        assert elsewhere.status_code == 400 and "led by node 'n1'" in elsewhere.json()["reason"]
    finally:
        conn.close()
