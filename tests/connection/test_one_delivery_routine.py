"""Every delivery of a channel goes through one routine (``Channel._deliver_run``): basic.deliver
to a consumer, basic.get's get-ok and direct reply-to. What a client sees: one sequence of
delivery tags across all three, get-ok framed with the queue's message count, a reply with the
reply consumer's tag; and the counters each kind has always kept (a get counts as a get, not
against any consumer's prefetch; a reply counts on the channel, on no queue).

Sans-IO on a ManualClock (``tests/sansio.py``): a real Session fed raw frames."""

from __future__ import annotations

from pamqp import body as pbody
from pamqp import header as pheader
from sansio import B, Q, frames

from exchange_broker.core.reply_to import PSEUDO_QUEUE


def test_deliveries_get_oks_and_replies_share_one_tag_sequence(client):
    client.call(Q.Declare(queue="work"))
    client.call(Q.Declare(queue="jobs"))
    client.call(B.Qos(prefetch_count=1))
    client.call(B.Consume(queue="work", consumer_tag="w"))
    client.call(B.Consume(queue=PSEUDO_QUEUE, consumer_tag="replies", no_ack=True))
    client.publish("work", b"w1")
    for body in (b"j1", b"j2", b"j3"):
        client.publish("jobs", body)
    client.take()
    got = client.get("jobs", no_ack=False)
    assert got.method.delivery_tag == 2 and got.method.message_count == 2  # two left behind it
    assert (got.method.exchange, got.method.routing_key, got.body) == ("", "jobs", b"j1")
    # a reply to this channel's own address (taken from a request's reply-to)
    client.publish("jobs", b"request", reply_to=PSEUDO_QUEUE)
    request = client.broker.vhosts["/"].queues["jobs"].ready[-1]
    address = request.props["reply_to"]
    assert address.startswith(PSEUDO_QUEUE + ".")
    client.publish(address, b"answer")
    client.take()
    reply = client.deliveries[-1]
    assert (reply.method.consumer_tag, reply.method.delivery_tag) == ("replies", 3)
    assert (reply.method.exchange, reply.method.routing_key, reply.body) == ("", address, b"answer")
    got = client.get("jobs", no_ack=True)
    assert (got.method.delivery_tag, got.method.message_count, got.body) == (4, 2, b"j2")
    first = client.deliveries[0]
    assert (first.method.consumer_tag, first.method.delivery_tag, first.body) == ("w", 1, b"w1")


def test_each_kind_keeps_its_counters(client):
    broker = client.broker
    client.call(Q.Declare(queue="q"))
    client.call(B.Consume(queue=PSEUDO_QUEUE, consumer_tag="replies", no_ack=True))
    for body in (b"a", b"b", b"c"):
        client.publish("q", body)
    q = broker.vhosts["/"].queues["q"]
    channel = client.session.channels[1]
    q.ready[1].redelivered = True  # as after a requeue
    before = dict(broker.stats)
    assert client.get("q", no_ack=False).body == b"a"
    assert client.get("q", no_ack=True).body == b"b"
    assert (q.stats_get, q.stats_get_no_ack, q.stats_delivered, q.stats_redeliver) == (1, 1, 2, 1)
    assert (q.stats_deliver, q.stats_deliver_no_ack, q.unacked) == (0, 0, 1)
    assert broker.stats["get"] - before.get("get", 0) == 2
    assert broker.stats["deliver"] == before["deliver"]
    assert channel.stats_delivered == 0 and channel.global_unacked == 0  # a get is no consumer's
    [(tag, (msg, consumer))] = channel.unacked.items()
    assert (tag, msg.body, consumer) == (1, b"a", None)
    client.publish("q", b"request", reply_to=PSEUDO_QUEUE)
    client.publish(q.ready[-1].props["reply_to"], b"answer")
    client.take()
    assert channel.stats_delivered == 1  # the reply counts on the channel, on no queue
    assert broker.stats["deliver"] == before["deliver"] and q.stats_delivered == 2
    client.send(B.Ack(delivery_tag=1))
    client.take()
    assert not channel.unacked and q.unacked == 0 and q.stats_ack == 1


def test_a_get_ok_too_large_for_one_frame_is_split(client):
    body = bytes(range(256)) * 1024  # 256 KiB: two body frames of at most 128 KiB (frame_max)
    client.call(Q.Declare(queue="big"))
    half = len(body) // 2
    client.send(B.Publish(exchange="", routing_key="big"),
                pheader.ContentHeader(0, len(body), B.Properties()),
                pbody.ContentBody(body[:half]), pbody.ContentBody(body[half:]))
    client.publish("big", b"next")
    client.send(B.Get(queue="big", no_ack=True))
    client.clock.advance()  # the turn ends: the output is written
    sent = frames(b"".join(client.out))
    room = 131072 - 8  # a body frame's payload at the negotiated frame_max
    assert [len(f.value) for _ch, f in sent if isinstance(f, pbody.ContentBody)] == \
        [room, room, len(body) - 2 * room]
    [(_ch, get_ok)] = [(ch, f) for ch, f in client.take()]
    assert get_ok.body == body and get_ok.method.message_count == 1
