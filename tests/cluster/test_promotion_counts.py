"""Placement's promotion (exchange_broker/cluster/placement.py) of a queue given to this node, on a
real broker and a real SQLite store: the definitions read that brought the queue's row is a
transaction of its own, before the read of the leaders that gave the queue here, and the old
leader's last messages may have been committed between the two (its hand-over commits right after
them). The promotion counts the stored messages again: every one is delivered, and new messages are
numbered after them (a reused sequence number would make the store refuse the write: a nack)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pika
import pytest

from eb_support import close_quietly, pika_connect
from exchange_broker.app import build_broker, recover
from exchange_broker.cluster.links import Links
from exchange_broker.cluster.placement import Placement
from exchange_broker.cluster.remote import RemoteQueue
from exchange_broker.durability.recovery import decode_args
from exchange_broker.durability.sql import SqlDurability
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker
from persistence.cluster_leaders import Leader
from persistence.sql_store import SqlStore

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def node(tmp_path):
    """A broker on a SQLite store with the placement of a leaders-mode node named 'me'."""
    loop = asyncio.new_event_loop()
    store = SqlStore(f"sqlite:///{tmp_path / 'broker.db'}", sqlite_synchronous="OFF")
    store.open()
    durability = SqlDurability(store, loop)
    broker = build_broker(LoopClock(loop), durability=durability)
    recover(broker, durability, 1000)
    tb = ThreadedBroker(broker, loop=loop)
    tb.start()
    links = Links("link", "secret", name="test node")

    def make_remote(broker_, vhost, name, row, leader):
        return RemoteQueue(broker_, vhost, name, links=links, address=None, leader=leader.node if leader else "",
                           durable=row["durable"], auto_delete=row["auto_delete"],
                           arguments=decode_args(row["arguments"]))
    me = SimpleNamespace(name="me", leaders={}, members={}, mirror=None)
    placement = Placement(me, broker, durability, 1000, make_remote, lambda q: isinstance(q, RemoteQueue))
    conns: list = []
    try:
        yield SimpleNamespace(tb=tb, store=store, placement=placement, me=me, conns=conns)
    finally:
        close_quietly(*conns)
        tb.stop()
        durability.stop()
        store.close()


def publish(node, queue: str, bodies) -> None:
    conn = pika_connect(node.tb.port)
    node.conns.append(conn)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT)  # raises unless confirmed


def test_a_promotion_restores_messages_committed_after_the_definitions_read(node):
    conn = pika_connect(node.tb.port)
    node.conns.append(conn)
    conn.channel().queue_declare("moved", durable=True)
    publish(node, "moved", [b"m%d" % i for i in range(5)])
    row = next(r for r in node.store.load_definitions().queues if r["name"] == "moved")  # the earlier read
    assert (row["message_count"], row["max_seq"]) == (5, 5)
    publish(node, "moved", [b"m%d" % i for i in range(5, 10)])  # the old leader's last messages

    def led_elsewhere():  # a placeholder stands for it (as on a node that did not lead it)
        vh = node.tb.broker.vhosts["/"]
        placeholder = node.placement.demote(vh, vh.queues["moved"], Leader("old", 1, ""))
        placeholder.store_id = row["id"]  # (what the definitions give it)
    node.tb.call(led_elsewhere)

    def given_here():  # the leaders' read, after the hand-over, gives it to this node
        node.me.leaders[("/", "moved")] = Leader("me", 2, "")
        return node.placement.place([row])
    assert node.tb.call(given_here)["promoted"] == 1
    publish(node, "moved", [b"after"])  # numbered after every stored message: confirmed
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get("moved", auto_ack=True)
        if method is None:
            break
        got.append(body)
    assert got == [b"m%d" % i for i in range(10)] + [b"after"]
