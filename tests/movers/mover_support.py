"""What the movers' tests share: queue depths and confirmed publishes over pika."""

from __future__ import annotations

import pika

from eb_support import close_quietly, pika_connect


def depth(port: int, queue: str) -> int:
    """The queue's message count; -1 while it (or its broker) is not there."""
    try:
        conn = pika_connect(port)
    except pika.exceptions.AMQPConnectionError:
        return -1  # restarting
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1
    finally:
        close_quietly(conn)


def publish(port: int, queue: str, n: int, *, declare: bool = True, size: int = 0) -> None:
    """``n`` persistent messages with message ids 0..n-1, confirmed."""
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        if declare:
            ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(n):
            body = b"x" * size if size else f"m{i}".encode()
            ch.basic_publish("", queue, body, pika.BasicProperties(message_id=str(i), delivery_mode=2))
    finally:
        close_quietly(conn)
