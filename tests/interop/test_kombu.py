"""kombu (the messaging library under Celery) on its pyamqp transport (py-amqp) against the broker."""

from __future__ import annotations

import socket
import time

import pytest

kombu = pytest.importorskip("kombu", reason="kombu is not installed (pip install kombu)")
from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402


def _connection(broker, **kwargs) -> Connection:
    return Connection(f"pyamqp://guest:guest@127.0.0.1:{broker.port}//", connect_timeout=5,
                      heartbeat=0, **kwargs)


def _drain(conn: Connection, done, timeout: float = 5.0) -> None:
    """Call drain_events until done() is true (socket.timeout if nothing arrives in time)."""
    while not done():
        conn.drain_events(timeout=timeout)


def _eventually(fn, expected, timeout: float = 5.0):
    """fn() == expected within timeout (RabbitMQ updates queue counts asynchronously after an
    unconfirmed publish; this broker does it at once: the tests must hold for both)."""
    deadline = time.monotonic() + timeout
    while (value := fn()) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert value == expected


def _assert_nothing_more(conn: Connection) -> None:
    with pytest.raises(socket.timeout):
        conn.drain_events(timeout=0.3)


def test_exchange_queue_producer_consumer(broker):
    media = Exchange("media", type="direct", durable=True)
    video = Queue("video", exchange=media, routing_key="video", durable=True)
    audio = Queue("audio", exchange=media, routing_key="audio", durable=True)

    with _connection(broker) as conn:
        conn.connect()
        assert conn.connected
        assert conn.transport_cls == "pyamqp" or conn.transport.driver_type == "amqp"

        with conn.channel() as channel:
            producer = Producer(channel, exchange=media, serializer="json")
            # declare= makes the producer declare the exchange, queues and bindings first
            producer.publish({"name": "/tmp/lolcat1.avi", "size": 1301013}, routing_key="video",
                             declare=[video, audio])
            producer.publish({"name": "/tmp/song.mp3", "size": 4242}, routing_key="audio",
                             headers={"x-origin": "test", "n": 3}, priority=5)
            producer.publish("plain text", routing_key="video", serializer="raw",
                             content_type="text/plain", content_encoding="utf-8")
            producer.publish({"name": "/tmp/dropped"}, routing_key="nowhere")   # unroutable

            bound = video.bind(channel)
            _eventually(lambda: bound.queue_declare(passive=True).message_count, 2)

        got: list = []

        def on_message(body, message):
            got.append((message.delivery_info["routing_key"], body, message.content_type,
                        message.headers, message.properties.get("priority"),
                        message.properties.get("delivery_mode")))
            message.ack()

        with Consumer(conn, queues=[video, audio], callbacks=[on_message],
                      accept=["json", "text/plain"], prefetch_count=10):
            _drain(conn, lambda: len(got) == 3)
            _assert_nothing_more(conn)

    by_key = sorted(got, key=lambda g: (g[0], isinstance(g[1], str)))
    assert by_key == [   # kombu sends priority 0 and delivery_mode 2 (persistent) by default
        ("audio", {"name": "/tmp/song.mp3", "size": 4242}, "application/json",
         {"x-origin": "test", "n": 3}, 5, 2),
        ("video", {"name": "/tmp/lolcat1.avi", "size": 1301013}, "application/json", {}, 0, 2),
        ("video", "plain text", "text/plain", {}, 0, 2),
    ]
    # order within one queue is publish order
    assert [g[1] for g in got if g[0] == "video"] == [
        {"name": "/tmp/lolcat1.avi", "size": 1301013}, "plain text"]


def test_topic_exchange_reject_requeue_and_confirms(broker):
    logs = Exchange("kombu_logs", type="topic", durable=False, auto_delete=False)
    errors = Queue("kombu_errors", exchange=logs, routing_key="*.error", durable=False,
                   auto_delete=False)
    everything = Queue("kombu_all", exchange=logs, routing_key="#", durable=False)

    with _connection(broker, transport_options={"confirm_publish": True}) as conn:
        producer = conn.Producer(serializer="json")
        for key in ("app.error", "app.info", "db.error", "db.error.deep"):
            # confirm_publish: publish() waits for the broker's basic.ack
            producer.publish({"key": key}, exchange=logs, routing_key=key,
                             declare=[errors, everything], retry=False)

        seen: list = []
        rejected_once: set = set()

        def on_error(body, message):
            seen.append((body["key"], message.delivery_info["redelivered"]))
            if body["key"] == "db.error" and body["key"] not in rejected_once:
                rejected_once.add(body["key"])
                message.requeue()          # basic.reject requeue=true: comes back redelivered
            else:
                message.ack()

        with Consumer(conn, queues=[errors], callbacks=[on_error], accept=["json"]):
            _drain(conn, lambda: len(seen) == 3)
            _assert_nothing_more(conn)
        assert seen == [("app.error", False), ("db.error", False), ("db.error", True)]

        with conn.channel() as channel:
            assert everything.bind(channel).queue_declare(passive=True).message_count == 4
            assert everything.bind(channel).purge() == 4


def test_simple_queue(broker):
    with _connection(broker) as conn:
        queue = conn.SimpleQueue("simple_queue")
        try:
            for i in range(3):
                queue.put({"hello": "world", "i": i})
            queue.put("a string", compression="zlib")   # compressed body, named in a header
            _eventually(queue.qsize, 4)

            got = []
            for _ in range(3):
                message = queue.get(block=True, timeout=5)
                got.append(message.payload)
                message.ack()
            assert got == [{"hello": "world", "i": 0}, {"hello": "world", "i": 1},
                           {"hello": "world", "i": 2}]

            message = queue.get(block=True, timeout=5)
            assert message.content_type == "text/plain"   # kombu sends a str as-is
            assert message.headers["compression"] == "application/x-gzip"
            message.reject(requeue=True)          # back to the head of the queue
            message = queue.get(block=True, timeout=5)
            assert message.payload == "a string"
            assert message.delivery_info["redelivered"] is True
            message.ack()

            assert queue.qsize() == 0
            with pytest.raises(queue.Empty):
                queue.get(block=True, timeout=0.3)
            with pytest.raises(queue.Empty):
                queue.get_nowait()

            # the blocking get() left a consumer on the queue: a new message goes straight to it
            queue.put({"left": "over"})
            message = queue.get(block=True, timeout=5)
            assert message.payload == {"left": "over"}
            message.ack()
        finally:
            queue.close()

        # clear() purges what is ready in the queue (no consumer yet on this one)
        queue = conn.SimpleQueue("simple_queue_2")
        try:
            queue.put({"a": 1})
            queue.put({"b": 2})
            _eventually(queue.qsize, 2)
            assert queue.clear() == 2
            assert queue.qsize() == 0
        finally:
            queue.close()

        # SimpleBuffer: a transient, auto-deleting variant
        buf = conn.SimpleBuffer("simple_buffer")
        try:
            buf.put("buffered")
            message = buf.get(timeout=5)
            assert message.payload == "buffered"
            message.ack()
        finally:
            buf.close()
