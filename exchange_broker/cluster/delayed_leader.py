"""``x-delayed-message`` exchanges in a cluster with per-queue leaders.

One node at a time fires the cluster's delayed messages: the holder of the delayed lease
(``persistence/delayed_lease.py``), claimed each beat. That node runs the broker's
``DelayedExchanges`` against the shared store as a single node does (``recover``: pending rows are
read back a window at a time, each routed when due through the exchange's bindings on that node,
i.e. to local queues or forwarded to their leaders). Every other node forwards a publish carrying a
valid ``x-delay`` to that node's exchange over its link (``DelayedExchanges.elsewhere``): the
publisher's confirm is the delayed leader's, which confirms once the row is stored.

Exactly one node fires a stored row: the lease moves only once its node is evicted (whose writes,
row deletes included, fail from then on), and a node fires only while its lease is fresh (its last
heartbeat within what its lease allows: ``may_release``). Each row is deleted only once the copies
it routed are confirmed (``DelayedExchanges``), so a delayed leader that dies after routing and
before the delete makes its successor route the message again (a duplicate, never a loss); one
that dies before the due time makes its successor fire it, once.

A forwarded delayed message that reaches a node that is not the delayed leader (the lease moved
meanwhile) is nacked, never forwarded again.
"""

from __future__ import annotations

import asyncio
import logging

from persistence.delayed_lease import DelayedLease

from exchange_broker.cluster.links import spawn
from exchange_broker.cluster.node import beat_forever
from exchange_broker.cluster.remote import address_of, forwarded_by_node
from exchange_broker.core.ports import Waiter

log = logging.getLogger("exchange_broker.cluster")


class DelayedLeader:
    def __init__(self, node, broker) -> None:
        self.node = node
        self.broker = broker
        self.lease = DelayedLease(node.store)
        self.leader = None  # persistence.cluster_leaders.Leader of the delayed lease (None: unknown)
        self.firing = False
        self.fired_as = None  # the node's incarnation when it took the lease
        delayed = broker.delayed
        delayed.elsewhere = self.forward
        delayed.may_release = self.may_release

    def start(self) -> None:
        spawn(self._run())

    async def _run(self) -> None:
        await self.tick()
        try:
            await beat_forever(self.node.heartbeat, self.tick)
        except asyncio.CancelledError:
            pass

    async def tick(self) -> None:
        node = self.node
        if node.role != "leader" or node.incarnation is None:
            return
        try:
            leader = await asyncio.get_running_loop().run_in_executor(None, self.lease.claim, node.name,
                                                                      node.incarnation)
        except Exception as exc:  # noqa: BLE001 - the database away or this node fenced: next beat
            log.debug("cluster: claiming the delayed-message lease failed: %s", exc)
            return
        self.leader = leader
        mine = leader is not None and leader.node == node.name
        if self.firing and (not mine or self.fired_as != node.incarnation):
            self._stop_firing()  # evicted meanwhile and back as a new incarnation: start afresh (or forward)
        if mine and not self.firing:
            self.firing, self.fired_as = True, node.incarnation
            found = self.broker.delayed.recover()  # the pending rows, a window at a time, from now
            log.warning("cluster: node '%s' fires the delayed messages now (%d pending)", node.name,
                        found["delayed_messages"])

    def may_release(self) -> bool:
        """Fire only while no other node may have taken the lease (the heartbeat guard's rule)."""
        node = self.node
        return node.role == "leader" and node.incarnation == self.fired_as and node.lease.may_deliver()

    def _stop_firing(self) -> None:
        """This node's lease ended (it was evicted): forget the messages held here (their rows are
        the lease holder's to fire, read back from the store) and forward until it holds the lease
        again."""
        log.error("cluster: node '%s' stops firing the delayed messages (its lease ended)", self.node.name)
        old = self.broker.delayed
        old.close()
        fresh = self.broker.delayed = type(old)(self.broker)
        fresh.elsewhere, fresh.may_release = self.forward, self.may_release
        self.firing = False

    def forward(self, vhost, ex, msg, publisher) -> Waiter | None:
        """``DelayedExchanges.elsewhere``: None holds it here (this node fires), else the waiter of
        the delayed leader's confirm."""
        if self.firing:
            return None
        w = Waiter()
        leader = self.leader
        address = address_of(leader) if leader is not None and leader.node != self.node.name else None
        if address is None or forwarded_by_node(self.broker, publisher):
            w.fire(False)  # no delayed leader known yet, or forwarded here by a node with an old view
            return w
        return self.node.links.forwarder(address, vhost.name).publish(msg.routing_key, msg.properties, msg.body,
                                                                     exchange=ex.name)
