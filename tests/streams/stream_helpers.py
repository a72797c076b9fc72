"""Helpers for the stream queue tests: declaring, publishing and consuming with pika (the
subprocess broker and other shared scaffolding are in eb_support)."""

from __future__ import annotations

import time

import pika

from eb_support import pika_connect

STREAM = {"x-queue-type": "stream"}


def connect(port: int) -> pika.BlockingConnection:
    return pika_connect(port, blocked_connection_timeout=60, socket_timeout=10)


def declare_stream(ch, name: str, **args) -> None:
    ch.queue_declare(name, durable=True, arguments={**STREAM, **args})


def publish(ch, queue: str, bodies, headers=None) -> None:
    """Publish (the channel should be in confirm mode for the offsets to be settled)."""
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(headers=headers))


def read(conn: pika.BlockingConnection, queue: str, n: int | None = None, *, offset=None,
         name: str | None = None, prefetch: int = 100, ack: bool = True, idle: float = 0.5,
         timeout: float = 10.0, extra: dict | None = None) -> list[tuple[bytes, int, dict]]:
    """Consume on a fresh channel until ``n`` messages (or, without ``n``, until ``idle`` s pass
    without one); returns (body, x-stream-offset, headers) in delivery order.

    With ``n``, delivery ``k`` is acked at once only while ``k + prefetch <= n`` (the rest after
    the consumer is cancelled), so the broker never sends more than ``n`` and exactly the first
    ``n`` are processed (pika rejects deliveries still pending at cancel, which a stream
    refuses with 540, as RabbitMQ does)."""
    ch = conn.channel()
    if n:
        prefetch = min(prefetch, n)
    ch.basic_qos(prefetch_count=prefetch)
    args = dict(extra or {})
    if offset is not None:
        args["x-stream-offset"] = offset
    if name is not None:
        args["x-stream-consumer-name"] = name
    got: list[tuple[bytes, int, dict]] = []
    last_tag = [0]

    def on_message(chan, method, props, body):
        got.append((body, props.headers["x-stream-offset"], props.headers))
        last_tag[0] = method.delivery_tag
        if ack and (n is None or len(got) + prefetch <= n):
            chan.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, arguments=args)
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    count = 0
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)
        if len(got) != count:
            count, last = len(got), time.monotonic()
        if n is not None and len(got) >= n:
            break
        if n is None and time.monotonic() - last > idle:
            break
    ch.basic_cancel(tag)
    if ack and n is not None and last_tag[0] and len(got) + prefetch > n:
        ch.basic_ack(last_tag[0], multiple=True)
    ch.close()
    return got
