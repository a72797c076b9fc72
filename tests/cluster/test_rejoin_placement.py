"""What a leaders-mode node evicted while cut off from its database does to the queues it led
(exchange_broker/cluster/placement.py: ``demote_all``, then ``point_at_leaders`` once it has joined
again), on a real broker and a real SQLite store: a consumer of such a queue gets basic.cancel on
its connection, which stays open; the placeholder keeps the stored queue's id; a consume through
it waits for a leader, and as soon as the node knows the queue's new leader the placeholder points
there (and the next read of the definitions keeps it, not re-making it)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from eb_support import close_quietly, pika_connect, wait_until
from exchange_broker.app import build_broker, recover
from exchange_broker.cluster.links import Address, Links
from exchange_broker.cluster.placement import Placement
from exchange_broker.cluster.remote import RemoteQueue, address_of
from exchange_broker.durability.recovery import decode_args
from exchange_broker.durability.sql import SqlDurability
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker
from persistence.cluster_leaders import Leader
from persistence.sql_store import SqlStore


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
        return RemoteQueue(broker_, vhost, name, links=links, address=address_of(leader),
                           leader=leader.node if leader else "", durable=row["durable"],
                           auto_delete=row["auto_delete"], arguments=decode_args(row["arguments"]))
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


def test_an_evicted_nodes_queues_become_placeholders_that_follow_their_new_leaders(node):
    conn = pika_connect(node.tb.port)
    node.conns.append(conn)
    ch = conn.channel()
    ch.queue_declare("led", durable=True)
    cancels: list = []
    ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method.consumer_tag))
    tag = ch.basic_consume("led", lambda *_: None)
    vh = node.tb.broker.vhosts["/"]
    stored_id = vh.queues["led"].store_id
    node.me.leaders[("/", "led")] = Leader("me", 1, "")

    assert node.tb.call(node.placement.demote_all) == 1   # evicted: it leads nothing now
    assert node.me.leaders == {}
    assert wait_until(lambda: (conn.process_data_events(0.05), cancels)[1] == [tag], timeout=10)
    assert conn.is_open                                    # the client's connection stays
    placeholder = vh.queues["led"]
    assert isinstance(placeholder, RemoteQueue) and placeholder.address is None
    assert placeholder.store_id == stored_id               # the same stored queue
    ch.basic_consume("led", lambda *_: None)               # consuming again waits for a leader
    assert node.tb.call(lambda: len(placeholder.consumers)) == 1 and not placeholder.relays

    node.me.leaders[("/", "led")] = Leader("other", 2, "127.0.0.1:1")  # the leaders read at the rejoin
    assert node.tb.call(node.placement.point_at_leaders) == 1
    assert placeholder.address == Address("127.0.0.1", 1) and placeholder.leader == "other"
    assert node.tb.call(lambda: list(placeholder.relays) == list(placeholder.consumers))  # relayed from there now
    row = next(r for r in node.store.load_definitions().queues if r["name"] == "led")
    assert node.tb.call(lambda: node.placement.place([row])) == {"promoted": 0, "demoted": 0, "retargeted": 0}
    assert vh.queues["led"] is placeholder                 # the next read keeps it as it is
    assert node.tb.call(node.placement.point_at_leaders) == 0
