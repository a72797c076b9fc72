"""Connection hand-off (cluster/handoff.py, leaders mode's default): two real in-process brokers, node A
holding a placeholder for a queue node B leads, pika clients of A. A connection whose first
request names B's queue is handed to B (A passes its bytes through); one that started with a
local queue stays on A; a connection B refuses stays on A and loses nothing; when B goes, the
handed-off connection ends."""

from __future__ import annotations

import pika
import pytest

from eb_support import pika_connect, uniq, wait_until
from exchange_broker.cluster.handoff import HandOff
from exchange_broker.testing import ThreadedBroker
from remote_support import PERSISTENT, Cluster


@pytest.fixture
def cluster(broker, node_b):
    c = Cluster(broker, node_b)
    handoff = HandOff()

    def plug():
        broker.broker.handoff = handoff
    broker.call(plug)
    c.handoff = handoff
    try:
        yield c
    finally:
        c.close()


def users_on(node: ThreadedBroker) -> list[str]:
    return node.call(lambda: sorted(s.user for s in node.broker.sessions))


def handed_off(cluster, prefix: str):
    """(queue B leads, a connection of A handed to B by its first confirmed publish, its channel)."""
    q = uniq(prefix)
    cluster.leader_queue(q)
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x", PERSISTENT)
    assert cluster.handoff.handed == 1
    return q, conn, ch


def test_a_connection_that_first_publishes_to_bs_queue_is_served_by_b(cluster):
    q = uniq("handoff")
    cluster.leader_queue(q)
    before_a, before_b = users_on(cluster.a), users_on(cluster.b)
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_qos(prefetch_count=10)
    for i in range(300):
        ch.basic_publish("", q, b"m%d" % i, PERSISTENT)  # each confirmed (pika raises on a nack)
    assert cluster.handoff.handed == 1
    assert users_on(cluster.a) == before_a  # A no longer serves it
    assert users_on(cluster.b) == sorted(before_b + ["guest"])
    assert cluster.on_b(q) == (300, 0)
    got = []
    for method, _props, body in ch.consume(q, inactivity_timeout=5):
        assert method is not None, f"only {len(got)} of 300 delivered"
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == 300:
            break
    ch.cancel()
    assert got == [b"m%d" % i for i in range(300)]
    assert wait_until(lambda: cluster.on_b(q) == (0, 0), 5)
    conn.close()  # connection.close passes through: B answers, A drops its end
    assert wait_until(lambda: users_on(cluster.b) == before_b, 5)
    assert wait_until(lambda: cluster.a.call(lambda: cluster.handoff.piped) == {}, 5)  # A keeps no pipe


def test_a_connection_that_first_used_a_local_queue_stays_and_forwards(cluster):
    q, local = uniq("remote"), uniq("local")
    cluster.leader_queue(q)
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.queue_declare(local)
    ch.basic_publish("", local, b"here")
    ch.confirm_delivery()
    ch.basic_publish("", q, b"there", PERSISTENT)
    assert cluster.handoff.handed == 0
    assert "guest" in users_on(cluster.a)
    assert cluster.drain_b(q) == [(b"there", False)]


def test_a_connection_the_leader_refuses_stays_here_with_nothing_lost(cluster):
    q = uniq("refused")
    cluster.leader_queue(q)
    cluster.a.call(lambda: cluster.a.broker.add_user("alice", "secret", tags=[]))
    cluster.a.call(lambda: cluster.a.broker.set_permissions("alice", "/", ".*", ".*", ".*"))
    conn = pika_connect(cluster.a.port, user="alice", password="secret")
    cluster.conns.append(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(50):  # B has no alice: the hand-off fails, A forwards them (its link logs in as guest)
        ch.basic_publish("", q, b"m%d" % i, PERSISTENT)
    assert cluster.handoff.handed == 0
    assert "alice" in users_on(cluster.a)
    assert cluster.drain_b(q) == [(b"m%d" % i, False) for i in range(50)]


def test_when_the_leader_goes_the_handed_off_connection_ends_and_a_serves_on(cluster):
    q, conn, ch = handed_off(cluster, "gone")
    cluster.b.stop()
    with pytest.raises(pika.exceptions.AMQPError):
        for _ in range(100):
            conn.process_data_events(0.05)
            ch.basic_publish("", q, b"y", PERSISTENT)
    other = cluster.connect(cluster.a).channel()
    other.queue_declare(uniq("still-served"))


def test_when_the_leader_leaves_the_cluster_with_its_sockets_open_the_connection_ends(cluster):
    """B is evicted (cut off from the database, or paused past its lease) but still up: at A's
    first beat that finds B no longer live, A closes what it handed to B."""
    q, conn, ch = handed_off(cluster, "left")
    cluster.a.call(lambda: cluster.handoff.live_now({"node-a", "node-b"}))
    ch.basic_publish("", q, b"y", PERSISTENT)  # B is live (drained or not): nothing happens
    cluster.a.call(lambda: cluster.handoff.live_now({"node-a"}))
    with pytest.raises(pika.exceptions.AMQPError):
        for _ in range(100):
            conn.process_data_events(0.05)
    assert cluster.a.call(lambda: cluster.handoff.piped) == {}
    assert cluster.on_b(q) == (2, 0)  # both confirmed messages are B's


def test_another_nodes_link_is_never_handed_off(cluster):
    """A node's link publishes here to a queue it thinks this node leads (it moved meanwhile):
    nacked at once, as forwarding would do, never passed on to the leader."""
    q = uniq("link")
    cluster.leader_queue(q)
    for node in (cluster.a, cluster.b):  # the nodes share the link login
        node.call(lambda node=node: setattr(node.broker, "link_login", ("node-link", "s3cret")))
    conn = pika_connect(cluster.a.port, user="node-link", password="s3cret")
    cluster.conns.append(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"x", PERSISTENT)
    assert cluster.handoff.handed == 0
    assert cluster.on_b(q) == (0, 0)
