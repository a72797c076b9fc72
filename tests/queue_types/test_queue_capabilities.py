"""Queue-type capabilities, sans-IO (core/queue.py ``QueueType.capabilities()``): each type says
what it can do and the callers ask that, never the class. A cluster's placeholder for a queue
another node leads (cluster/remote.py) holds nothing here: no lease guard, no local figures; its
removal once the leader deleted the queue writes nothing (``VHost.remove_queue(q, store=False)``),
not even for the exchanges auto-deleted with it."""

from __future__ import annotations

import asyncio

from exchange_broker.assembly import make_broker
from exchange_broker.cluster.remote import RemoteQueue
from exchange_broker.core.clock import ManualClock
from exchange_broker.core.ports import NullDurability
from exchange_broker.core.queue import CANCEL_ON_TIMEOUT, HELD_HERE, delivery_guard, dispatch_guarded


class Recorded(NullDurability):
    """Keeps the definition deletions it was asked to write."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []

    def queue_deleted(self, q) -> None:
        self.deleted.append(("queue", q.name))

    def exchange_deleted(self, ex) -> None:
        self.deleted.append(("exchange", ex.name))


def broker_with(durability=None):
    broker = make_broker(clock=ManualClock(), durability=durability)
    return broker, broker.vhosts["/"]


def placeholder(broker, vh, name: str, **arguments) -> RemoteQueue:
    q = vh.queues[name] = RemoteQueue(broker, "/", name, links=None, address=None, leader="node-b",
                                      arguments=arguments)
    return q


def test_each_type_declares_its_capabilities():
    broker, vh = broker_with()
    classic = vh.declare_queue("c", durable=True)
    quorum = vh.declare_queue("q", durable=True, arguments={"x-queue-type": "quorum"})
    stream = vh.declare_queue("s", durable=True, arguments={"x-queue-type": "stream"})
    remote = placeholder(broker, vh, "r", **{"x-queue-type": "quorum"})
    assert classic.capabilities() == stream.capabilities() == frozenset({HELD_HERE})
    assert quorum.capabilities() == frozenset({HELD_HERE, CANCEL_ON_TIMEOUT})
    assert remote.capabilities() == frozenset()  # whatever the leader's type: nothing is held here
    assert remote.queue_type == "quorum"


def test_only_queues_held_here_wait_for_the_lease():
    broker, vh = broker_with()
    broker.delivery_guard = lambda: False
    held = vh.declare_queue("held", durable=True)
    transient = vh.declare_queue("transient")
    remote = placeholder(broker, vh, "elsewhere")
    assert delivery_guard(held) is broker.delivery_guard
    assert delivery_guard(transient) is None and delivery_guard(remote) is None
    held.consumers.append(object())
    remote.consumers.append(object())
    dispatched: list[str] = []
    held.dispatch = lambda: dispatched.append("held")
    remote.dispatch = lambda: dispatched.append("elsewhere")
    assert dispatch_guarded(broker) == 1 and dispatched == ["held"]


def test_a_placeholder_goes_without_a_write_and_so_do_the_exchanges_auto_deleted_with_it():
    durability = Recorded()
    broker, vh = broker_with(durability)
    broker.definitions_shared = True  # a cluster's node: transient definitions are written too
    vh.declare_exchange("fan", "fanout", durable=True, auto_delete=True)
    remote = placeholder(broker, vh, "elsewhere")
    vh.bind("fan", "queue", "elsewhere", "", None, 50, 20)
    durability.deleted.clear()

    async def remove() -> int:  # (a placeholder's on_deleted closes its link getter: a task)
        return vh.remove_queue(remote, store=False)
    assert asyncio.run(remove()) == 0
    assert durability.deleted == []
    assert "elsewhere" not in vh.queues and "fan" not in vh.exchanges and remote.deleted


def test_a_queue_removed_here_writes_its_deletion_and_its_auto_deleted_exchange():
    durability = Recorded()
    broker, vh = broker_with(durability)
    vh.declare_exchange("fan", "fanout", durable=True, auto_delete=True)
    vh.declare_queue("mine", durable=True)
    vh.bind("fan", "queue", "mine", "", None, 50, 20)
    vh.remove_queue(vh.queues["mine"])
    assert durability.deleted == [("exchange", "fan"), ("queue", "mine")]
