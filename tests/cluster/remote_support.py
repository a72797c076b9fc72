"""Two in-process brokers, node A holding RemoteQueue placeholders for queues node B leads
(the cluster's forwarding without its database): shared by the tests of remote.py and of the
connection hand-off."""

from __future__ import annotations

import asyncio

import pika

from eb_support import close_quietly, pika_connect, wait_until
from exchange_broker.cluster.links import Links
from exchange_broker.cluster.remote import RemoteQueue
from exchange_broker.testing import ThreadedBroker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Cluster:
    """Node A (``broker``) with RemoteQueue placeholders for queues of node B (``node_b``)."""

    def __init__(self, a: ThreadedBroker, b: ThreadedBroker) -> None:
        self.a, self.b = a, b
        self.links = Links("guest", "guest", name="node a", heartbeat=2)
        self.conns: list = []

    def connect(self, node: ThreadedBroker) -> pika.BlockingConnection:
        conn = pika_connect(node.port)
        self.conns.append(conn)
        return conn

    def leader_queue(self, name: str, **arguments) -> None:
        """Declare the durable queue on B and its placeholder on A."""
        ch = self.connect(self.b).channel()
        ch.queue_declare(name, durable=True, arguments=arguments or None)
        ch.close()

        def install():
            vh = self.a.broker.vhosts["/"]
            vh.queues[name] = RemoteQueue(self.a.broker, "/", name, links=self.links,
                                          address=("127.0.0.1", self.b.port), leader="node-b")
        self.a.call(install)

    def on_b(self, name: str) -> tuple[int, int]:
        """(ready, unacked) of B's queue, read on B's loop."""
        def read():
            q = self.b.broker.vhosts["/"].queues[name]
            return q.message_count, q.unacked
        return self.b.call(read)

    def b_has(self, name: str) -> bool:
        return self.b.call(lambda: name in self.b.broker.vhosts["/"].queues)

    def publish_on_b(self, name: str, bodies) -> None:
        ch = self.connect(self.b).channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", name, body, PERSISTENT)
        ch.close()

    def drain_b(self, name: str) -> list:
        """Every message left on B's queue, in order (got with auto-ack)."""
        ch = self.connect(self.b).channel()
        out = []
        while True:
            method, _props, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                ch.close()
                return out
            out.append((body, method.redelivered))

    def close(self) -> None:
        close_quietly(*self.conns)
        if self.a._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.links.close(), self.a.loop).result(10)


def pump(conn, until, timeout: float = 10.0) -> bool:
    """Run pika's I/O until ``until()`` holds (False if it never does within ``timeout``)."""
    return wait_until(lambda: conn.process_data_events(0.02) or until(), timeout, 0)
