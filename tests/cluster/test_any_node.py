"""Clients on any node of a three-node cluster (real processes on one PostgreSQL database): the
tutorial patterns with producer and consumer on different nodes, the admin API on a standby, and
clients that keep going while the active node is SIGKILLed and while every node restarts in turn,
with no confirmed message lost."""

from __future__ import annotations

import time

import pika
import pytest
import requests
from cluster_load import finish_load, run_load
from cluster_support import FAILOVER_TIMEOUT, wait_for_status

from eb_support import pika_connect, wait_until


def three(nodes):
    n1 = nodes("n1")
    n2, n3 = nodes.together(("n2",), ("n3",))  # two standbys of n1, started at once
    assert n1.is_active() and not n2.is_active() and not n3.is_active()
    wait_for_status_ready(n2, n3)
    return n1, n2, n3


def wait_for_status_ready(*standbys) -> None:
    """A standby learns the active node's address at its next beat."""
    for node in standbys:
        assert wait_until(lambda n=node: _opens(n.port), timeout=20), node.log()[-2000:]


def _opens(port: int) -> bool:
    try:
        pika_connect(port).close()
        return True
    except pika.exceptions.AMQPError:
        return False


def test_tutorial_patterns_with_producer_and_consumer_on_different_nodes(nodes):
    n1, n2, n3 = three(nodes)
    prod, cons = pika_connect(n2.port), pika_connect(n3.port)  # both standbys: passed on to n1
    try:
        p, c = prod.channel(), cons.channel()
        p.confirm_delivery()
        # work queue: durable, persistent, confirmed on n2, consumed with acks on n3
        p.queue_declare("tasks", durable=True)
        for i in range(10):
            p.basic_publish("", "tasks", f"task {i}".encode(), pika.BasicProperties(delivery_mode=2))
        got = []
        for _ in range(10):
            method, _props, body = c.basic_get("tasks")
            got.append(body)
            c.basic_ack(method.delivery_tag)
        assert got == [f"task {i}".encode() for i in range(10)]
        # publish/subscribe, routing and topics: bindings made on n3 route publishes made on n2
        c.exchange_declare("logs", "fanout")
        c.exchange_declare("direct_logs", "direct")
        c.exchange_declare("topic_logs", "topic")
        mine = {}
        for name, exchange, key in [("fan", "logs", ""), ("errors", "direct_logs", "error"),
                                    ("kern", "topic_logs", "kern.*")]:
            mine[name] = c.queue_declare("", exclusive=True).method.queue
            c.queue_bind(mine[name], exchange, key)
        p.basic_publish("logs", "", b"to all")
        p.basic_publish("direct_logs", "error", b"an error")
        p.basic_publish("direct_logs", "info", b"not routed to errors")
        p.basic_publish("topic_logs", "kern.critical", b"kernel")
        p.basic_publish("topic_logs", "cron.critical", b"not kernel")
        for name, expected in [("fan", b"to all"), ("errors", b"an error"), ("kern", b"kernel")]:
            method, _props, body = c.basic_get(mine[name], auto_ack=True)
            assert body == expected
            assert c.basic_get(mine[name], auto_ack=True) == (None, None, None)
        # RPC: the server consumes on n1, the client publishes on n2 and waits on its reply queue
        server = pika_connect(n1.port)
        s = server.channel()
        s.queue_declare("rpc_queue")
        reply_to = p.queue_declare("", exclusive=True).method.queue
        p.basic_publish("", "rpc_queue", b"21", pika.BasicProperties(reply_to=reply_to, correlation_id="c1"))
        method, props, body = s.basic_get("rpc_queue", auto_ack=True)
        s.basic_publish("", props.reply_to, str(int(body) * 2).encode(),
                        pika.BasicProperties(correlation_id=props.correlation_id))
        server.close()
        assert wait_until(lambda: p.queue_declare(reply_to, passive=True).method.message_count == 1, timeout=10)
        method, props, body = p.basic_get(reply_to, auto_ack=True)
        assert (body, props.correlation_id) == (b"42", "c1")
        # push consumers on a standby: basic.consume with prefetch through n3, publishes through n2
        c.basic_qos(prefetch_count=5)
        pushed = []
        c.basic_consume("tasks", lambda ch, m, _p, b: (pushed.append(b), ch.basic_ack(m.delivery_tag)))
        for i in range(20):
            p.basic_publish("", "tasks", f"push {i}".encode(), pika.BasicProperties(delivery_mode=2))
        assert wait_until(lambda: (cons.process_data_events(0.05), len(pushed) == 20)[1], timeout=20)
        assert pushed == [f"push {i}".encode() for i in range(20)]
        # the active node sees the real client of each connection (the PROXY line of a local standby)
        local_ports = {conn._impl._transport._sock.getsockname()[1] for conn in (prod, cons)}  # noqa: SLF001
        conns = requests.get(f"http://127.0.0.1:{n3.admin_port}/api/connections", auth=("guest", "guest"),
                             timeout=10)
        assert conns.status_code == 200  # asked on a standby, answered by the active node
        assert local_ports <= {c["peer_port"] for c in conns.json()}
    finally:
        prod.close()
        cons.close()


def test_the_admin_api_answers_on_a_standby_and_keeps_guest_local(nodes):
    n1, n2, _n3 = three(nodes)
    base = f"http://127.0.0.1:{n2.admin_port}"
    nodes_view = requests.get(f"{base}/api/nodes", auth=("guest", "guest"), timeout=10)
    assert nodes_view.status_code == 200
    assert {n["name"]: n["cluster_role"] for n in nodes_view.json()} == {"n1": "active", "n2": "standby",
                                                                        "n3": "standby"}
    put = requests.put(f"{base}/api/queues/%2F/made-on-n2", json={"durable": True}, auth=("guest", "guest"),
                       timeout=10)
    assert put.status_code in (201, 204), put.text
    assert requests.get(f"http://127.0.0.1:{n1.admin_port}/api/queues/%2F/made-on-n2", auth=("guest", "guest"),
                        timeout=10).status_code == 200
    bad = requests.put(f"{base}/api/queues/%2F/x", data=b"{not json", auth=("guest", "guest"), timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()
    assert requests.get(f"{base}/api/overview", auth=("guest", "nope"), timeout=10).status_code == 401
    # a client that claims, through the standby, to be far away is treated as far away: guest
    # logs in from loopback only, and the standby passes on who the client is
    far = requests.get(f"{base}/api/overview", auth=("guest", "guest"), timeout=10,
                       headers={"X-Forwarded-For": "203.0.113.9"})
    assert far.status_code == 401
    assert requests.get(f"{base}/", timeout=10).status_code == 200  # the web UI, from the standby


def test_a_standby_whose_active_node_is_gone_closes_clients_and_answers_503(nodes):
    # a long failover timeout: the SIGKILLed active node is not replaced for about 6 s
    n1, n2 = nodes("s1", "--cluster-failover-timeout", "6"), nodes("s2", "--cluster-failover-timeout", "6")
    wait_for_status_ready(n2)
    n1.kill()
    admin = requests.get(f"http://127.0.0.1:{n2.admin_port}/api/overview", auth=("guest", "guest"), timeout=10)
    assert admin.status_code == 503 and admin.json()["error"] == "unavailable"
    assert "cannot be reached" in admin.json()["reason"]
    with pytest.raises(pika.exceptions.AMQPError):
        pika_connect(n2.port)
    assert "cannot reach the active node" in n2.log()
    assert wait_until(n2.is_active, timeout=30)  # then it takes over, on the same ports
    wait_for_status_ready(n2)
    assert requests.get(f"http://127.0.0.1:{n2.admin_port}/api/overview", auth=("guest", "guest"),
                        timeout=10).status_code == 200


@pytest.mark.slow
def test_sigkill_of_the_active_node_under_load_loses_no_confirmed_message(nodes, cluster_url):
    n1, n2, n3 = three(nodes)
    ports = [n2.port, n3.port, n1.port]  # clients start on the standbys
    publishers, consumers = run_load(ports, "orders")
    try:
        assert wait_until(lambda: all(len(p.confirmed) > 50 for p in publishers) and
                          all(len(c.got) > 20 for c in consumers), timeout=30)
        n1.kill()  # SIGKILL: no clean-up of any kind
        killed = time.monotonic()
        assert wait_until(lambda: n2.is_active() or n3.is_active(), timeout=30)
        before = {id(c): len(c.got) for c in consumers}
        assert wait_until(lambda: all(len(c.got) > before[id(c)] + 50 for c in consumers), timeout=30)
        resumed = min(t for c in consumers for t, _, _ in c.got if t > killed)
        # the failover bound of these nodes (1.5 s), plus a reconnect, with room for a loaded machine
        assert resumed - killed < float(FAILOVER_TIMEOUT) + 15
        assert wait_until(lambda: all(len(p.confirmed) > 50 + p.reconnects for p in publishers), timeout=30)
    finally:
        finish_load(publishers, consumers)
    assert any(p.reconnects for p in publishers) and any(c.reconnects for c in consumers)
    view = wait_for_status(cluster_url, lambda v: not v["n1"]["alive"])
    assert not view["n1"]["alive"]


@pytest.mark.slow
def test_a_rolling_restart_of_all_three_nodes_under_load_loses_nothing(nodes):
    n1, n2, n3 = three(nodes)
    all_nodes = [n1, n2, n3]
    publishers, consumers = run_load([n.port for n in all_nodes], "rolling")
    try:
        for node in all_nodes:
            assert wait_until(lambda: all(len(c.got) > 20 for c in consumers), timeout=30)
            confirmed = sum(len(p.confirmed) for p in publishers)
            assert node.terminate() == 0  # SIGTERM: a clean stop, its clients reconnect elsewhere
            node.start_node()
            assert wait_until(lambda: any(n.is_active() for n in all_nodes), timeout=30)
            wait_for_status_ready(*[n for n in all_nodes if not n.is_active()])
            assert wait_until(lambda c=confirmed: sum(len(p.confirmed) for p in publishers) > c + 100, timeout=30)
    finally:
        finish_load(publishers, consumers)
