"""RemoteQueue (exchange_broker/cluster/remote.py): a placeholder on node A for a queue node B
leads. Two real in-process brokers on ephemeral ports, a real link between them, pika clients:
what a client of A publishes lands on B's queue (confirmed only once B has it), what a client of
A consumes comes from B, and acks, nacks, rejects, requeues, basic.get and cancellations reach B.
"""

from __future__ import annotations

import pika
import pytest

from eb_support import pika_connect, uniq, wait_until
from remote_support import PERSISTENT, Cluster, pump


@pytest.fixture
def cluster(broker, node_b):
    c = Cluster(broker, node_b)
    try:
        yield c
    finally:
        c.close()


def test_publishes_on_a_land_on_b_confirmed(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    ch = cluster.connect(cluster.a).channel()
    ch.confirm_delivery()
    for i in range(200):
        ch.basic_publish("", q, b"m%d" % i, PERSISTENT)  # raises on a nack
    assert cluster.on_b(q) == (200, 0)  # every confirm came after B had the message
    assert [body for body, _r in cluster.drain_b(q)] == [b"m%d" % i for i in range(200)]


def test_consume_on_a_with_prefetch_and_acks(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"m%d" % i for i in range(100)])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(q, lambda c, m, p, body: got.append((m.delivery_tag, body, m.redelivered)))
    assert pump(conn, lambda: len(got) == 10)
    # the leader holds the rest back: B's consumer is the relay with prefetch 10
    assert wait_until(lambda: cluster.on_b(q) == (90, 10))
    conn.process_data_events(0.1)
    assert len(got) == 10
    acked = 0
    while acked < 100:
        assert pump(conn, lambda: len(got) > acked), f"stuck at {acked}"
        for tag, _body, _r in got[acked:]:
            ch.basic_ack(tag)
        acked = len(got)
    assert [body for _t, body, _r in got] == [b"m%d" % i for i in range(100)]
    assert not any(r for _t, _b, r in got)
    assert wait_until(lambda: cluster.on_b(q) == (0, 0))


def test_nack_and_reject_with_and_without_requeue(cluster):
    q, dlx, dead = uniq("remote"), uniq("dlx"), uniq("dead")
    setup = cluster.connect(cluster.b).channel()
    setup.exchange_declare(dlx, "fanout")
    setup.queue_declare(dead)
    setup.queue_bind(dead, dlx)
    cluster.leader_queue(q, **{"x-dead-letter-exchange": dlx})
    cluster.publish_on_b(q, [b"a", b"b", b"c", b"d"])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    got = []
    ch.basic_consume(q, lambda c, m, p, body: got.append((m.delivery_tag, body, m.redelivered)))
    assert pump(conn, lambda: len(got) == 1)
    ch.basic_nack(got[0][0], requeue=True)         # a: back on B, delivered again
    assert pump(conn, lambda: len(got) == 2)
    assert got[1][1:] == (b"a", True)
    ch.basic_reject(got[1][0], requeue=True)       # a again, by reject
    assert pump(conn, lambda: len(got) == 3)
    assert got[2][1:] == (b"a", True)
    ch.basic_ack(got[2][0])
    assert pump(conn, lambda: len(got) == 4)
    ch.basic_reject(got[3][0], requeue=False)      # b: dead-lettered on B
    assert pump(conn, lambda: len(got) == 5)
    ch.basic_nack(got[4][0], requeue=False)        # c: dead-lettered on B
    assert pump(conn, lambda: len(got) == 6)
    assert got[5][1:] == (b"d", False)
    ch.basic_ack(got[5][0])
    assert wait_until(lambda: cluster.on_b(q) == (0, 0))
    assert [body for body, _r in cluster.drain_b(dead)] == [b"b", b"c"]


def test_basic_get_on_a(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"x", b"y", b"z"])
    ch = cluster.connect(cluster.a).channel()
    method, _props, body = ch.basic_get(q)
    assert (body, method.message_count, method.redelivered) == (b"x", 2, False)
    ch.basic_ack(method.delivery_tag)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"y"
    method, _props, body = ch.basic_get(q)
    assert body == b"z"
    assert ch.basic_get(q) == (None, None, None)   # get-empty: z is unacked on B
    assert cluster.on_b(q) == (0, 1)
    ch.basic_nack(method.delivery_tag, requeue=True)
    again, _props, body = ch.basic_get(q)
    assert (body, again.redelivered) == (b"z", True)
    ch.basic_ack(again.delivery_tag)
    assert wait_until(lambda: cluster.on_b(q) == (0, 0))


def test_channel_closed_with_unacked_requeues_on_b(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"m%d" % i for i in range(5)])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    got = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body))
    assert pump(conn, lambda: len(got) == 5)
    assert wait_until(lambda: cluster.on_b(q) == (0, 5))
    ch.close()
    assert wait_until(lambda: cluster.on_b(q) == (5, 0))
    assert cluster.drain_b(q) == [(b"m%d" % i, True) for i in range(5)]


def test_cancel_then_ack_after_cancel_still_reaches_b(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"m%d" % i for i in range(6)])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    got = []
    tag = ch.basic_consume(q, lambda c, m, p, body: got.append((m.delivery_tag, body)))
    assert pump(conn, lambda: len(got) == 3)
    ch.basic_cancel(tag)
    for delivery_tag, _body in got:  # acks after basic.cancel are allowed
        ch.basic_ack(delivery_tag)
    assert wait_until(lambda: cluster.on_b(q) == (3, 0))
    assert [b for b, _r in cluster.drain_b(q)] == [b"m3", b"m4", b"m5"]


def test_queue_deleted_on_b_cancels_consumer_on_a(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"one"])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    cancelled, got = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda c, m, p, body: got.append(m.delivery_tag))
    assert pump(conn, lambda: got)
    cluster.connect(cluster.b).channel().queue_delete(q)
    assert pump(conn, lambda: cancelled)
    assert cancelled == [tag]
    ch.basic_ack(got[0])  # settling a delivery of the gone queue sends nothing to B
    assert ch.is_open
    assert not cluster.b_has(q)
    # a publish to the placeholder now reaches no queue on B: B returns it, A nacks it
    pub = cluster.connect(cluster.a).channel()
    pub.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        pub.basic_publish("", q, b"lost", PERSISTENT)


def test_leader_stopped_publisher_gets_nacks_consumer_cancelled(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    conn = cluster.connect(cluster.a)
    pub = conn.channel()
    pub.confirm_delivery()
    pub.basic_publish("", q, b"stored", PERSISTENT)
    sub_conn = cluster.connect(cluster.a)
    sub = sub_conn.channel()
    cancelled, got = [], []
    sub.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    sub.basic_consume(q, lambda c, m, p, body: got.append(body))
    assert pump(sub_conn, lambda: got == [b"stored"])
    cluster.b.stop()
    assert pump(sub_conn, lambda: cancelled)  # link lost: the relayed consumer is cancelled
    nacked = 0
    for i in range(20):
        try:
            pub.basic_publish("", q, b"after %d" % i, PERSISTENT)
        except pika.exceptions.NackError:
            nacked += 1
    assert nacked == 20  # never an ack for a message no node stored
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_get(q)
    assert err.value.reply_code == 404 and "node-b" in err.value.reply_text


def test_a_publish_from_another_nodes_link_is_nacked_not_forwarded(cluster):
    """A connection logged in as the cluster's link user is known as one from its login on
    (``Session.from_link``, read once): its publishes to a placeholder are nacked, never forwarded
    a second time; a client's publishes on the same node are forwarded as ever."""
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.a.call(lambda: setattr(cluster.a.broker, "link_login", ("node-link", "link-secret")))
    link = pika_connect(cluster.a.port, user="node-link", password="link-secret")
    cluster.conns.append(link)
    sessions = cluster.a.call(lambda: sorted((s.user, s.from_link) for s in cluster.a.broker.sessions))
    assert ("node-link", True) in sessions
    ch = link.channel()
    ch.confirm_delivery()
    for i in range(3):  # each nacked at once (a second hop would wait for the other node)
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", q, b"second hop %d" % i, PERSISTENT)
    pub = cluster.connect(cluster.a).channel()
    pub.confirm_delivery()
    pub.basic_publish("", q, b"from a client", PERSISTENT)
    assert [body for body, _r in cluster.drain_b(q)] == [b"from a client"]


def test_fanout_to_two_placeholders_confirms_only_when_both_leaders_acked(cluster):
    q1, q2, local, ex = uniq("remote"), uniq("remote"), uniq("local"), uniq("fan")
    cluster.leader_queue(q1)
    cluster.leader_queue(q2)
    ch = cluster.connect(cluster.a).channel()
    ch.exchange_declare(ex, "fanout")
    ch.queue_declare(local)
    for name in (q1, q2, local):
        ch.queue_bind(name, ex)
    ch.confirm_delivery()
    ch.basic_publish(ex, "", b"both", PERSISTENT)
    assert cluster.on_b(q1) == (1, 0) and cluster.on_b(q2) == (1, 0)
    cluster.connect(cluster.b).channel().queue_delete(q2)
    with pytest.raises(pika.exceptions.NackError):  # q1 and the local queue have it, q2 not
        ch.basic_publish(ex, "", b"one missing", PERSISTENT)
    assert cluster.on_b(q1) == (2, 0)


def test_tx_commit_on_a_answers_once_b_has_the_messages(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    ch = cluster.connect(cluster.a).channel()
    ch.tx_select()
    for i in range(5):
        ch.basic_publish("", q, b"t%d" % i, PERSISTENT)
    assert cluster.on_b(q) == (0, 0)
    ch.tx_commit()
    assert cluster.on_b(q) == (5, 0)


def test_no_ack_consumer_on_a(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"m%d" % i for i in range(1000)])
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    got = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
    assert pump(conn, lambda: len(got) == 1000)
    assert got == [b"m%d" % i for i in range(1000)]
    assert wait_until(lambda: cluster.on_b(q) == (0, 0))


def test_leader_refusing_the_consume_cancels_the_consumer_on_a(cluster):
    q = uniq("remote")
    cluster.leader_queue(q)
    holder = cluster.connect(cluster.b).channel()
    holder.basic_consume(q, lambda *a: None, exclusive=True)  # B's queue is in exclusive use
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)  # consume-ok is local; B's 403 comes after
    assert pump(conn, lambda: cancelled)
    assert cancelled == [tag] and ch.is_open


def test_a_relay_gone_while_it_starts_holds_nothing_on_the_leader(cluster):
    """The queue's leader changed while a consumer's relay was still opening its link (a client
    consumed again through a node that had not heard of a move yet): the relay's consume must not
    go out then (the leader would hand its prefetch to a relay that drops deliveries, on a channel
    nobody closes: those messages would reach no consumer until the link closed)."""
    from persistence.cluster_leaders import Leader
    q = uniq("remote")
    cluster.leader_queue(q)
    cluster.publish_on_b(q, [b"m%d" % i for i in range(20)])
    placeholder = cluster.a.call(lambda: cluster.a.broker.vhosts["/"].queues[q])
    cluster.a.call(placeholder.retarget, None)  # no leader (a move under way): a consumer waits
    conn = cluster.connect(cluster.a)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)

    def leader_and_gone_again():
        placeholder.retarget(Leader("node-b", 2, f"127.0.0.1:{cluster.b.port}"))  # the relay starts
        relay = next(iter(placeholder.relays.values()))
        cluster.a.loop.call_soon(placeholder.retarget, None)  # and is gone while its link opens
        return relay
    relay = cluster.a.call(leader_and_gone_again)
    assert pump(conn, lambda: cancelled) and cancelled == [tag]  # consumer-cancel-notify
    assert wait_until(lambda: cluster.a.call(lambda: relay.task.done()))
    # every message is still B's to give: a consumer on B gets all 20
    other = cluster.connect(cluster.b)
    got = []
    other.channel().basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
    assert pump(other, lambda: len(got) == 20, timeout=5), f"{len(got)} of 20: the rest held on B"
    assert cluster.on_b(q) == (0, 0)
