"""Helpers for the super stream tests: declaring, publishing keyed messages with confirms, and
group members (pika) that record what they were delivered."""

from __future__ import annotations

import time

import pika

from eb_support import pika_connect

KEYS = 300
TOTAL = 3000


def connect(port: int) -> pika.BlockingConnection:
    return pika_connect(port, blocked_connection_timeout=60, socket_timeout=10)


def declare(ch, name: str, partitions: int = 3, **args) -> None:
    ch.exchange_declare(name, "x-super-stream", durable=True,
                        arguments={"x-partitions": partitions, **args})


def key_of(i: int) -> str:
    return f"key-{i % KEYS}"


def publish(ch, name: str, total: int = TOTAL, start: int = 0) -> None:
    """Messages start..start+total-1 with routing key key-(i mod 300), body str(i); every
    publish confirmed (the channel is put in confirm mode)."""
    ch.confirm_delivery()
    for i in range(start, start + total):
        ch.basic_publish(name, key_of(i), str(i).encode(), pika.BasicProperties(delivery_mode=2))


class Member:
    """One member of a consumer group on its own connection; ``got`` holds (i, partition, offset)
    in delivery order. ``ack_limit``: ack only the first that many deliveries (the rest stay
    unacked until the connection closes)."""

    def __init__(self, port: int, stream: str, group: str, *, offset="first", prefetch: int = 50,
                 ack_limit: int | None = None) -> None:
        self.conn = connect(port)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, int, int]] = []
        self.acked: list[tuple[int, int, int]] = []
        self.ack_limit = ack_limit
        self.last_tag = 0
        self.tag = self.ch.basic_consume(stream, self._on_message, arguments={
            "x-consumer-group": group, "x-stream-offset": offset})

    def _on_message(self, ch, method, props, body) -> None:
        h = props.headers
        item = (int(body), h["x-stream-partition"], h["x-stream-offset"])
        self.got.append(item)
        self.last_tag = method.delivery_tag
        if self.ack_limit is None or len(self.acked) < self.ack_limit:
            ch.basic_ack(method.delivery_tag)
            self.acked.append(item)

    def pump(self) -> None:
        self.conn.process_data_events(0)

    def close(self) -> None:
        if self.conn.is_open:
            try:
                self.conn.close()
            except pika.exceptions.AMQPError:  # its socket was killed (kill_socket)
                pass


def run_until(members, predicate, timeout: float = 30.0) -> None:
    """Pump every open member's connection until ``predicate()`` holds (AssertionError after
    ``timeout`` seconds: a hang, not a performance assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for deliveries: " +
                                 ", ".join(str(len(m.got)) for m in members))
        for m in members:
            if m.conn.is_open:
                m.conn.process_data_events(0.005)


def check_order(members) -> None:
    """Every key's messages were processed in publish order, each exactly once: within each
    member the numbers of a key rise, and a key's numbers never overlap between members."""
    for m in members:
        last: dict[str, int] = {}
        for i, _p, _o in m.got:
            k = key_of(i)
            assert last.get(k, -1) < i, f"key {k} out of order at one member"
            last[k] = i


def one_partition_per_key(items) -> None:
    parts: dict[str, set] = {}
    for i, p, _o in items:
        parts.setdefault(key_of(i), set()).add(p)
    assert all(len(s) == 1 for s in parts.values())


def kill_socket(member: Member) -> None:
    """The member's TCP connection dies (shut down under pika, no connection.close): the broker
    sees it go as it would a crashed client."""
    import socket
    member.conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)


def abort_connection(tb, connection_name: str) -> None:
    """Abort (TCP reset, no connection.close) the broker's side of the client connection named
    ``connection_name`` in a ThreadedBroker ``tb``: for the broker, the client died."""
    import concurrent.futures
    done: concurrent.futures.Future = concurrent.futures.Future()

    def abort() -> None:
        found = [p for p in list(tb.server.protocols) if p.session is not None and
                 p.session.client_properties.get("connection_name") == connection_name]
        for p in found:
            p.transport.abort()
        done.set_result(len(found))
    tb.loop.call_soon_threadsafe(abort)
    assert done.result(10) == 1


def on_loop(tb, fn):
    """Run ``fn()`` on a ThreadedBroker's event loop and return its result."""
    import concurrent.futures
    done: concurrent.futures.Future = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.set_exception(exc)
    tb.loop.call_soon_threadsafe(call)
    return done.result(10)


def group_state(tb, stream: str, group: str) -> dict:
    """The group's members and partitions (ConsumerGroup.info()), read on the broker's loop."""
    from exchange_broker.queue_types import consumer_groups

    def read():
        found = [g for g in consumer_groups.groups(tb.broker, "/", stream) if g.group == group]
        if not found:
            return {"members": [], "partitions": []}
        info = found[0].info()
        for m in info["members"]:
            m.pop("session", None)
        return info
    return on_loop(tb, read)
