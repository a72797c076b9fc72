"""Clients that keep working while cluster nodes die: publishers with confirms and consumers with
manual acks, each a pika BlockingConnection in its own thread, reconnecting to the next node of
their list whenever theirs goes away (as an application using pika with several hosts does).

A publisher counts a message as confirmed only once ``basic_publish`` returned on a confirming
channel; a message whose confirm was not seen is published again after the reconnect (at least
once). Consumers record every body they got; duplicates are allowed (an unacked delivery comes
back redelivered after a failover), losses are not."""

from __future__ import annotations

import threading
import time

import pika
from pika.exceptions import AMQPError

from eb_support import wait_until

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(ports: list[int], first: int) -> tuple[pika.BlockingConnection, int]:
    """A connection to the first node of ``ports`` (from index ``first``) that takes one."""
    for i in range(len(ports)):
        index = (first + i) % len(ports)
        try:
            params = pika.ConnectionParameters("127.0.0.1", ports[index], "/", pika.PlainCredentials("guest", "guest"),
                                               heartbeat=0, blocked_connection_timeout=30, socket_timeout=5,
                                               connection_attempts=1)
            return pika.BlockingConnection(params), index
        except AMQPError:
            continue
    raise ConnectionError("no node took the connection")


class Client(threading.Thread):
    def __init__(self, ports: list[int], first: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.ports, self.node, self.queue = ports, first, queue
        self.stop_event = threading.Event()
        self.reconnects = 0
        self.errors: list[str] = []

    def stop(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), f"{self.name} did not stop"

    def run(self) -> None:
        while not self.stop_event.is_set():
            conn = None
            try:
                conn, self.node = connect(self.ports, self.node)
                self.work(conn)
            except (AMQPError, ConnectionError, OSError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.reconnects += 1
                self.node += 1  # the next node first
                time.sleep(0.1)
            finally:
                try:
                    if conn is not None and conn.is_open:
                        conn.close()
                except Exception:  # noqa: BLE001 - a broken connection is closed already
                    pass

    def work(self, conn: pika.BlockingConnection) -> None:
        raise NotImplementedError


class Publisher(Client):
    """Publishes ``<name>-<n>`` for n = 0, 1, ... with confirms, as fast as confirms come back."""

    def __init__(self, ports: list[int], first: int, queue: str, name: str) -> None:
        super().__init__(ports, first, queue)
        self.prefix = name
        self.next = 0
        self.confirmed: list[bytes] = []
        self.confirm_times: list[float] = []
        self.attempted: bytes | None = None
        self.retried: set[bytes] = set()  # published again after a nack or a lost connection

    def work(self, conn: pika.BlockingConnection) -> None:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(self.queue, durable=True)
        while not self.stop_event.is_set():
            body = f"{self.prefix}-{self.next}".encode()
            if body == self.attempted:
                self.retried.add(body)  # its confirm was not seen: it may arrive twice
            self.attempted = body
            ch.basic_publish("", self.queue, body, PERSISTENT, mandatory=True)  # raises unless confirmed
            self.confirmed.append(body)
            self.confirm_times.append(time.monotonic())
            self.next += 1


class Consumer(Client):
    """Consumes with manual acks (prefetch 50) and records each body with its arrival time."""

    def __init__(self, ports: list[int], first: int, queue: str) -> None:
        super().__init__(ports, first, queue)
        self.got: list[tuple[float, bytes, bool]] = []
        self.cancels = 0

    def work(self, conn: pika.BlockingConnection) -> None:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        ch.queue_declare(self.queue, durable=True)

        def on_message(channel, method, _props, body):
            self.got.append((time.monotonic(), body, method.redelivered))
            channel.basic_ack(method.delivery_tag)

        cancelled: list[bool] = []
        # the broker's basic.cancel (consumer-cancel-notify): the queue moved to another leader
        # node (a cluster with per-queue leaders); consume again, as applications do
        ch.add_on_cancel_callback(lambda _frame: cancelled.append(True))
        ch.basic_consume(self.queue, on_message)
        while not self.stop_event.is_set():
            conn.process_data_events(time_limit=0.1)
            if cancelled:
                cancelled.clear()
                self.cancels += 1
                ch.basic_consume(self.queue, on_message)

    def bodies(self) -> set[bytes]:
        return {body for _, body, _ in self.got}


def missing(publishers: list[Publisher], consumers: list[Consumer]) -> set[bytes]:
    """Confirmed bodies no consumer has received."""
    got: set[bytes] = set()
    for c in consumers:
        got |= c.bodies()
    return {body for p in publishers for body in p.confirmed} - got


def run_load(ports: list[int], queue: str) -> tuple[list[Publisher], list[Consumer]]:
    publishers = [Publisher(ports, i, queue, f"p{i}") for i in range(4)]
    consumers = [Consumer(ports, 1 + i, queue) for i in range(2)]
    for client in publishers + consumers:
        client.start()
    return publishers, consumers


def finish_load(publishers: list[Publisher], consumers: list[Consumer]) -> None:
    for p in publishers:
        p.stop()
    assert wait_until(lambda: not missing(publishers, consumers), timeout=60), \
        f"{len(missing(publishers, consumers))} confirmed messages never arrived"
    for c in consumers:
        c.stop()
    assert sum(len(p.confirmed) for p in publishers) > 0
    for p in publishers:  # each publisher's messages arrive in its order, apart from redeliveries
        mine = [int(body.split(b"-")[1]) for c in consumers for _, body, redelivered in c.got
                if body.startswith(p.prefix.encode() + b"-") and not redelivered]
        assert len(set(mine)) >= len(p.confirmed) - 100
