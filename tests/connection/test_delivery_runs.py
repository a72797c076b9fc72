"""A queue hands a consumer its ready messages in runs (``Consumer.deliver_run``), sans-IO: the
client sees what one-at-a-time delivery gave it (tags in order, every message once, the
connection's output budget, the consumer's prefetch and the channel's global limit kept), and the
queue's, consumer's and channel's counters agree."""

from __future__ import annotations

from sansio import B, Q

from exchange_broker.connection.channel import OUTPUT_BUDGET
from exchange_broker.queue_types.ready import RUN_BYTES, RUN_COUNT


def test_a_backlog_goes_out_in_order_with_consecutive_tags(client):
    client.call(Q.Declare(queue="q"))
    count = RUN_COUNT * 3 + 7
    for i in range(count):
        client.publish("q", str(i).encode(), exchange="")
    client.call(B.Consume(queue="q", consumer_tag="c", no_ack=True))
    client.take()
    got = [d for d in client.deliveries if d.method.consumer_tag == "c"]
    assert [d.body for d in got] == [str(i).encode() for i in range(count)]
    assert [d.method.delivery_tag for d in got] == list(range(1, count + 1))
    assert all(d.method.routing_key == "q" and d.method.exchange == "" for d in got)
    q = client.broker.vhosts["/"].queues["q"]
    assert q.message_count == 0 and q.bytes == 0
    assert q.stats_delivered == count and q.stats_deliver_no_ack == count
    channel = client.session.channels[1]
    assert channel.stats_delivered == count and not channel.unacked


def test_large_messages_wait_for_the_flush_once_the_output_budget_is_full(client):
    body = b"x" * (100 * 1024)
    client.call(Q.Declare(queue="big"))
    for _ in range(40):
        client.publish("big", body)
    client.send(B.Consume(queue="big", consumer_tag="c", no_ack=True))
    # before the event-loop turn ends (nothing flushed yet), the budget holds the deliveries back
    channel = client.session.channels[1]
    first_turn = channel.stats_delivered
    assert 1 <= first_turn <= (OUTPUT_BUDGET + RUN_BYTES) // len(body) + 1
    assert client.session.writable is False
    for _ in range(40):
        client.take()
        if len(client.deliveries) == 40:
            break
    assert [d.method.delivery_tag for d in client.deliveries] == list(range(1, 41))
    assert all(d.body == body for d in client.deliveries)
    assert client.broker.vhosts["/"].queues["big"].message_count == 0


def test_redelivered_messages_keep_their_flag_in_a_run(client):
    client.call(Q.Declare(queue="r"))
    for i in range(5):
        client.publish("r", bytes([65 + i]))
    client.call(B.Consume(queue="r", consumer_tag="acking", no_ack=False))
    client.take()
    client.call(B.Cancel(consumer_tag="acking"))
    client.call(B.Recover(requeue=True))  # nothing unacked is lost: back to the queue, redelivered
    client.deliveries.clear()
    client.call(B.Consume(queue="r", consumer_tag="c", no_ack=True))
    client.take()
    got = [d for d in client.deliveries if d.method.consumer_tag == "c"]
    assert [d.body for d in got] == [b"A", b"B", b"C", b"D", b"E"]
    assert all(d.method.redelivered for d in got)
    assert client.broker.vhosts["/"].queues["r"].stats_redeliver == 5


def test_a_consumer_with_a_prefetch_gets_no_more_than_its_prefetch(client):
    client.call(Q.Declare(queue="p"))
    for i in range(150):
        client.publish("p", str(i).encode())
    client.call(B.Qos(prefetch_count=70))
    client.call(B.Consume(queue="p", consumer_tag="c", no_ack=False))
    client.take()
    assert [d.method.delivery_tag for d in client.deliveries] == list(range(1, 71))
    q = client.broker.vhosts["/"].queues["p"]
    channel = client.session.channels[1]
    assert q.unacked == 70 and channel.consumers["c"].unacked == 70 and len(channel.unacked) == 70
    assert q.message_count == 80 and q.stats_deliver == 70
    client.send(B.Ack(delivery_tag=30, multiple=True))  # 30 settled: 30 more may go
    client.take()
    assert [d.method.delivery_tag for d in client.deliveries] == list(range(1, 101))
    assert [d.body for d in client.deliveries] == [str(i).encode() for i in range(100)]
    assert q.unacked == 70 and q.message_count == 50


def test_the_channels_global_limit_holds_a_run_too(client):
    client.call(Q.Declare(queue="g"))
    for i in range(100):
        client.publish("g", str(i).encode())
    client.call(B.Qos(prefetch_count=25, global_=True))
    client.call(B.Consume(queue="g", consumer_tag="c", no_ack=False))
    client.take()
    assert len(client.deliveries) == 25 and client.session.channels[1].global_unacked == 25
    client.send(B.Nack(delivery_tag=25, multiple=True, requeue=True))  # back, in their places
    client.take()
    got = client.deliveries[25:]
    assert len(got) == 25 and all(d.method.redelivered for d in got)
    assert [d.body for d in got] == [str(i).encode() for i in range(25)]
