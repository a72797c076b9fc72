"""x-delayed-message exchanges in a cluster with per-queue leaders (real node processes on one
throwaway PostgreSQL database): one node fires the delayed messages, the others forward delayed
publishes to it; when it is SIGKILLed, a survivor takes over and fires each pending message once."""

from __future__ import annotations

import time

import pika
import pytest
from sqlalchemy import create_engine, text

from cluster_support import drain
from test_leaders import LEADERS as LEADERS_MODE, bindings_on, known_on

from eb_support import pika_connect, wait_until

LEADERS = (*LEADERS_MODE, "--cluster-failover-timeout", "6")


def firing_node(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT leader FROM queue_leases WHERE vhost = '' AND "
                                     "queue = '*delayed-messages*'")).scalar()
    finally:
        engine.dispose()


def pending_rows(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM delayed_messages")).scalar()
    finally:
        engine.dispose()


def publish_delayed(port: int, body: bytes, delay_ms: int) -> None:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("later", "k", body, pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay_ms}))
    finally:
        conn.close()


@pytest.mark.slow
def test_delayed_messages_fire_once_and_survive_the_firing_nodes_death(nodes, cluster_url):
    n1, n2 = nodes.together(("n1", *LEADERS), ("n2", *LEADERS))
    assert wait_until(lambda: firing_node(cluster_url) is not None, timeout=20)
    fires = firing_node(cluster_url)
    firing, other = (n1, n2) if fires == "n1" else (n2, n1)
    conn = pika_connect(other.port)  # declared on the node that does not fire: no 406 any more
    ch = conn.channel()
    ch.exchange_declare("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare("fired", durable=True)  # led by the node that stays
    ch.queue_bind("fired", "later", "k")
    conn.close()
    assert wait_until(lambda: known_on(firing, "fired"), timeout=20)
    assert wait_until(lambda: bindings_on(firing, "later") == 1, timeout=20)  # the binding reached it too
    started = time.monotonic()
    publish_delayed(other.port, b"soon", 1500)  # forwarded to the firing node, stored there
    publish_delayed(firing.port, b"there", 1500)  # held where it was published
    assert drain(other.port, "fired") == []  # not yet
    assert wait_until(lambda: _count(other, "fired") >= 2, timeout=30)
    assert time.monotonic() - started >= 1.4
    got = drain(other.port, "fired")
    assert sorted(b for b, _ in got) == [b"soon", b"there"]
    # a fired message's row goes once its routed copy is confirmed: a node killed before that fires it
    # again after the failover (at least once); the test is about the message pending at the kill
    assert wait_until(lambda: pending_rows(cluster_url) == 0, timeout=20)
    publish_delayed(other.port, b"after the death", 8000)  # pending on the firing node...
    firing.kill()  # ...which dies before it is due: the survivor fires it, once
    assert wait_until(lambda: firing_node(cluster_url) == other.name, timeout=40), other.log()[-3000:]
    assert wait_until(lambda: _count(other, "fired") >= 1, timeout=40), other.log()[-3000:]
    time.sleep(2)  # nothing more comes
    got = drain(other.port, "fired")
    assert [b for b, _ in got] == [b"after the death"]


def _count(node, queue: str) -> int:
    conn = pika_connect(node.port)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()
