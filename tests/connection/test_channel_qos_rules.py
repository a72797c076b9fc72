"""basic.qos global=true (the channel's limit) with several queues and no-ack consumers, sans-IO:
RabbitMQ 3.x's rabbit_limiter, as the Java client's own QosTests check it (noAckObeysLimit,
fairness); both differed here until the Java suite was run against the broker."""

from __future__ import annotations

from sansio import B, Q



def consume_from_new_queue(client, tag: str, no_ack: bool) -> str:
    name = f"q-{tag}"
    client.call(Q.Declare(queue=name, exclusive=True))
    client.call(Q.Bind(queue=name, exchange="amq.fanout"))
    client.call(B.Consume(queue=name, consumer_tag=tag, no_ack=no_ack))
    return name


def delivered(client, tag: str) -> list:
    client.take()
    return [d for d in client.deliveries if d.method.consumer_tag == tag]


def test_a_no_ack_consumer_waits_while_the_channels_limit_is_reached(client):
    client.call(B.Qos(prefetch_count=1, global_=True))
    consume_from_new_queue(client, "c1", no_ack=False)
    client.publish("", b"1", exchange="amq.fanout")
    consume_from_new_queue(client, "c2", no_ack=True)
    client.publish("", b"2", exchange="amq.fanout")
    first = delivered(client, "c1")
    assert [d.body for d in first] == [b"1"] and delivered(client, "c2") == []  # c1's unacked holds the channel
    client.send(B.Ack(delivery_tag=first[0].method.delivery_tag))
    second = delivered(client, "c1")[1:]
    assert [d.body for d in second] == [b"2"]
    client.send(B.Ack(delivery_tag=second[0].method.delivery_tag))
    assert [d.body for d in delivered(client, "c2")] == [b"2"]  # once the channel is under its limit


def test_the_channels_limit_is_shared_fairly_between_its_queues(client):
    client.call(B.Qos(prefetch_count=1, global_=True))
    queues = [consume_from_new_queue(client, f"c{i}", no_ack=False) for i in range(3)]
    for i in range(30):
        client.publish("", b"%d" % i, exchange="amq.fanout")
    for _ in range(29):  # ack each delivery as it comes: one at a time under the limit of 1
        client.take()
        last = client.deliveries[-1]
        client.send(B.Ack(delivery_tag=last.method.delivery_tag))
    counts = {tag: len(delivered(client, tag)) for tag in ("c0", "c1", "c2")}
    assert all(n >= 9 for n in counts.values()), counts  # no queue left behind (RabbitMQ: 10 each)
    vhost = client.broker.vhosts["/"]
    assert all(vhost.queues.get(q).message_count < 30 for q in queues)
