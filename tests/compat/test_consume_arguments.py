"""A stream's consumer argument on a classic or quorum queue is refused as RabbitMQ refuses it
(406, its text naming the queue type), and the connection keeps working."""

from __future__ import annotations

import pika
import pytest

from eb_support import uniq


@pytest.mark.parametrize("queue_type,rabbit_type", [("classic", "rabbit_classic_queue"),
                                                    ("quorum", "rabbit_quorum_queue")])
def test_x_stream_offset_on_a_non_stream_queue_is_406(pika_conn, queue_type, rabbit_type):
    q = uniq("xso")
    ch = pika_conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": queue_type})
    ch.basic_publish("", q, b"kept")
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": "first"})
    assert err.value.reply_code == 406
    assert err.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue "
                                    f"'{q}' in vhost '/' of queue type {rabbit_type}")
    ch = pika_conn.channel()
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"kept" and not method.redelivered  # refused before anything was delivered
    ch.queue_delete(q)
