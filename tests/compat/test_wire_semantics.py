"""Where clients in other languages look and the broker used to differ from RabbitMQ 3.x (issue
25): each test names what RabbitMQ does (its source: rabbit_reader.erl, rabbit_channel.erl, ...)
and checks the broker does the same, over a real socket (raw frames where pika hides the order)."""

from __future__ import annotations

import pika
import pytest
from pamqp import commands as C

from eb_support import RawClient, uniq, wait_until

CAPS = {"capabilities": {"authentication_failure_close": True, "consumer_cancel_notify": True}}


def test_queue_delete_ok_comes_before_the_cancel_of_a_consumer_on_the_same_channel(broker):
    # rabbit_channel replies delete-ok, the queue's cancel notification follows; clients that close
    # the channel on basic.cancel (amqplib's suite) otherwise lose the reply
    client = RawClient(broker.port, open_channel=1, client_properties=CAPS)
    try:
        queue = uniq("qdel")
        client.send(1, C.Queue.Declare(queue=queue))
        client.expect_next(C.Queue.DeclareOk)
        client.send(1, C.Basic.Consume(queue=queue, consumer_tag="ct"))
        client.expect_next(C.Basic.ConsumeOk)
        client.send(1, C.Queue.Delete(queue=queue))
        assert client.expect_next(C.Queue.DeleteOk, channel=1).message_count == 0
        assert client.expect_next(C.Basic.Cancel, channel=1).consumer_tag == "ct"
        # the channel is still open and in step
        client.send(1, C.Basic.Qos(prefetch_count=1))
        client.expect_next(C.Basic.QosOk, channel=1)
        client.close_connection()
    finally:
        client.close()


def test_queue_delete_ok_first_for_a_durable_queue_in_a_sqlite_store(spawn_broker):
    # the reply waits for the store (a held place in the channel's output): still first
    proc = spawn_broker()
    client = RawClient(proc.port, open_channel=1, client_properties=CAPS)
    try:
        queue = uniq("qdel")
        client.send(1, C.Queue.Declare(queue=queue, durable=True))
        client.expect_next(C.Queue.DeclareOk)
        client.publish(1, "", queue, b"ready", C.Basic.Properties(delivery_mode=2))
        client.send(1, C.Basic.Consume(queue=queue, consumer_tag="ct", no_ack=True),
                    C.Queue.Delete(queue=queue))
        client.expect_next(C.Basic.ConsumeOk)
        client.expect(C.Queue.DeleteOk)  # after the one delivery, if it was sent before
        assert client.expect_next(C.Basic.Cancel, channel=1).consumer_tag == "ct"
        client.close_connection()
    finally:
        client.close()


def test_queue_delete_of_a_consumed_queue_with_if_unused_is_still_406(broker):
    client = RawClient(broker.port, open_channel=1, client_properties=CAPS)
    try:
        queue = uniq("qdel")
        client.send(1, C.Queue.Declare(queue=queue))
        client.expect_next(C.Queue.DeclareOk)
        client.send(1, C.Basic.Consume(queue=queue, consumer_tag="ct"))
        client.expect_next(C.Basic.ConsumeOk)
        client.send(1, C.Queue.Delete(queue=queue, if_unused=True))
        close = client.expect_next(C.Channel.Close)
        assert close.reply_code == 406
        client.send(1, C.Channel.CloseOk())
        client.close_connection()
    finally:
        client.close()


@pytest.mark.parametrize("caps", [{}, {"capabilities": {"authentication_failure_close": False}}])
def test_refused_login_without_failure_close_capability_is_a_closed_socket(broker, caps):
    # rabbit_reader:auth_fail sends connection.close 403 only with authentication_failure_close
    client = RawClient(broker.port, handshake=False)
    try:
        assert client.handshake(password="wrong", client_properties=caps) is None
        assert client.tune is None
    finally:
        client.close()


def test_refused_login_with_failure_close_capability_is_403(broker):
    client = RawClient(broker.port, handshake=False)
    try:
        close = client.handshake(password="wrong", client_properties=CAPS)
        assert isinstance(close, C.Connection.Close) and close.reply_code == 403
        assert "Login was refused" in close.reply_text
    finally:
        client.close()
