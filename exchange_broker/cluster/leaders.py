"""This process as a node of a cluster with per-queue leaders (``--cluster-mode leaders``).

Every node serves clients. Each durable queue has one leader node, which holds its messages and
dispatches its deliveries; the other nodes keep a placeholder (``remote.py``) that forwards
publishes to the leader and relays its deliveries (``link.py``). The store's rows say who leads
what (``persistence/cluster_leaders.py``):

* the node registers (role ``leader``), beats every ``--cluster-heartbeat`` seconds and, on each
  beat, lets the cluster settle: dead nodes (no beat within the failover timeout) are evicted and
  their queues spread over the live nodes, the fewest-led first;
* every write of the node's store is fenced by its own row (``node_fence``): once evicted, a node
  that was only paused cannot write again, and its ``guard`` stops it (exit 1) before it answers a
  client when its last confirmed beat is older than its lease allows;
* a durable queue declared here is claimed by this node (placement: the declaring node);
* the definitions mirror (``definitions.py``) runs on every node and reloads the leaders with the
  definitions: ``placement.py`` turns each placeholder this node now leads into the real queue
  (restored from the store: every confirmed message back, unacked ones marked redelivered), and
  points the other placeholders at their leaders.

All store calls run on an executor thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from persistence.cluster_leaders import Leader, LeadersStore, node_fence
from persistence.cluster_store import ClusterStore, NodeNameInUse
from sqlalchemy.exc import SQLAlchemyError

from exchange_broker.cluster.node import ClusterStartError, beat_forever, cancel_task, guard_stale, leave

log = logging.getLogger("exchange_broker.cluster")

LINK_USER = "exchange-broker-cluster"  # the user nodes log in to each other as (never stored)


class LeaderNode:
    mode = "leaders"

    def __init__(self, store_url: str, name: str, heartbeat: float, failover_timeout: float) -> None:
        self.name = name
        self.heartbeat = heartbeat
        self.failover_timeout = failover_timeout
        self.store = ClusterStore(store_url, failover_timeout)
        self.leaders_store = LeadersStore(self.store)
        self.incarnation: int | None = None
        self.role = "leader"
        self.broker = None
        self.link_secret = ""
        self.leaders: dict[tuple[str, str], Leader] = {}
        self.members: dict[str, str] = {}  # live nodes -> AMQP address, read each beat
        self.on_lost: Callable[[str], None] = lambda why: None  # fail-stop (the application exits)
        self.listening: tuple[str, str] = ("", "")
        self.last_beat_ok = time.monotonic()
        self.stale_after = max(failover_timeout - heartbeat, heartbeat)
        self._task: asyncio.Task | None = None
        self.mirror = None  # the definitions and leaders, followed (serve_leaders.py)
        self.links = None   # this node's links to the others (links.Links)
        self.lock = None    # no store lock: every node writes (fenced by its own row)

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- joining ----------------------------------------------------------------------------------------
    async def join(self) -> None:
        """Register (the schema must be there) and read the link secret and the leaders."""
        amqp, admin = self.listening
        started = time.monotonic()
        try:
            self.incarnation = await self._call(
                lambda: self.store.register(self.name, role="leader", amqp_address=amqp, admin_address=admin))
        except NodeNameInUse as exc:
            raise ClusterStartError(str(exc)) from None
        self.last_beat_ok = started
        await self._call(self.leaders_store.resume, self.name)  # what it led before a restart, unless moved
        self.link_secret = await self._call(self.leaders_store.link_secret)
        self.leaders = await self._call(self.leaders_store.leaders)
        self.members = await self._call(self.leaders_store.members)
        log.info("cluster: node '%s' joined (incarnation %d); every node serves, each queue has a leader",
                 self.name, self.incarnation)

    def fence(self, conn) -> None:
        """``SqlStore.write_fence``: every write of this node's store, in its own transaction."""
        node_fence(conn, self.name, self.incarnation)

    def least_loaded(self) -> str:
        """The live node that leads the fewest queues (this node if none is known yet)."""
        counts = {name: 0 for name, address in self.members.items() if address}
        counts.setdefault(self.name, 0)
        for leader in self.leaders.values():
            if leader.node in counts:
                counts[leader.node] += 1
        return min(counts, key=lambda name: (counts[name], name != self.name, name))

    def leads(self, vhost: str, queue: str) -> bool:
        held = self.leaders.get((vhost, queue))
        return held is not None and held.node == self.name

    def claim(self, vhost: str, queue: str, queue_id: int, for_node: str | None = None) -> tuple[Leader, bool]:
        """Blocking (the store's writer thread, before the queue's row is written): lead a queue
        declared on this node (or have ``for_node`` lead it), unless a live node already does.
        Also says whether a row of that name exists already (see ``LeadersStore.claim``)."""
        wanted = for_node or self.name
        leader, elsewhere = self.leaders_store.claim(vhost, queue, wanted, queue_id)
        if leader.node != wanted or elsewhere:
            log.warning("cluster: queue '%s' in vhost '%s' was declared here and on node '%s' at about the same "
                        "time; the queue of node '%s' is kept", queue, vhost, leader.node, leader.node)
        return leader, elsewhere

    def guard(self) -> None:
        """Before this node answers a client: it may have been evicted (see ``guard_stale``)."""
        guard_stale(self, "leader", "other nodes may lead its queues now")

    # -- serving ----------------------------------------------------------------------------------------
    async def serving(self, broker, amqp_address: str, admin_address: str) -> None:
        self.broker = broker
        await self._call(lambda: self.store.update_node(self.name, self.incarnation, amqp_address=amqp_address,
                                                        admin_address=admin_address))
        await self._call(self.store.bump_definitions)  # the other nodes learn where its queues are
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-heartbeat")

    async def _run(self) -> None:
        await beat_forever(self.heartbeat, self.tick)

    async def tick(self) -> None:
        await self.renew()
        if self.role != "leader":
            return
        try:
            self.members = await self._call(self.leaders_store.members)
            evicted, given = await self._call(self.leaders_store.settle, self.name)
        except SQLAlchemyError as exc:
            log.warning("cluster: settling the leaders failed: %s", " ".join(str(exc).split())[:300])
            return
        if evicted:
            log.warning("cluster: node(s) %s missed their heartbeats and left the cluster; %d queue(s) moved "
                        "to live nodes", ", ".join(evicted), given)
        elif given:
            log.info("cluster: %d queue(s) without a live leader given to live nodes", given)

    async def renew(self) -> bool:
        started = time.monotonic()
        try:
            version = self.mirror.version if self.mirror is not None and self.mirror.version >= 0 else None
            beat = await self._call(self.store.heartbeat, self.name, self.incarnation, version)
        except SQLAlchemyError as exc:
            log.warning("cluster: heartbeat failed: %s", " ".join(str(exc).split())[:300])
            return True  # unknown: the guard decides once the lease may have run out
        if not beat:
            self._lose("it was removed from the cluster (another node leads its queues now) or restarted elsewhere")
            return False
        self.last_beat_ok = started
        return True

    def _lose(self, why: str) -> None:
        log.error("cluster: node '%s' stops serving: %s", self.name, why)
        self.role = "lost"
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self.on_lost(why)

    # -- views and the end ------------------------------------------------------------------------
    async def nodes(self) -> list[dict]:
        return await self._call(self.store.nodes)

    async def stop(self) -> None:
        """A clean stop: no more beats; the node's row goes, so its queues move at the next beat of
        another node."""
        if self.mirror is not None:
            mirror, self.mirror = self.mirror, None
            await mirror.stop()
        await cancel_task(self._task)
        if self.links is not None:
            await self.links.close()
        await leave(self)
