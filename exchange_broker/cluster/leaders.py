"""This process as a node of a cluster with per-queue leaders (``--cluster-mode leaders``).

Every node serves clients. Each durable queue has one leader node, which holds its messages and
dispatches its deliveries; the other nodes keep a placeholder (``remote.py``) that forwards
publishes to the leader and relays its deliveries (``link.py``). The store's rows say who leads
what (``persistence/cluster_leaders.py``):

* the node registers (role ``leader``), beats every ``--cluster-heartbeat`` seconds and, on each
  beat, lets the cluster settle: dead nodes (no beat within the failover timeout) are evicted and
  their queues spread over the live nodes, the fewest-led first;
* every write of the node's store is fenced by its own row (``node_fence``): once evicted, a node
  that was only paused cannot write again;
* the database going away does not end the node (``db_lease.py``): it keeps its clients; while
  its last confirmed beat is younger than its lease allows it serves as usual (writes wait:
  publishers wait for their confirms, or are nacked after ``--database-outage-nack-after``);
  definition changes are refused (541, ``definitions_unavailable``) from the moment it knows the
  database is away; once its lease may have run out its ``guard`` stops the durable queues it
  leads (the ones another node could take over) from handing anything out, and cuts the other
  nodes' links (nothing is handed out by two leaders), while its transient queues (which die with
  it, nobody takes them over) keep delivering. When a beat gets through again: its row is there ->
  the held queues deliver again (``release``); its row is gone (evicted meanwhile) -> every queue
  it led becomes a placeholder (``Placement.demote_all``: their consumers get basic.cancel) and it
  registers again as a new incarnation, without a restart;
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
from typing import Awaitable, Callable

from persistence.cluster_leaders import Leader, LeadersStore, members_of, node_fence
from persistence.cluster_store import ClusterStore, NodeNameInUse
from sqlalchemy.exc import SQLAlchemyError

from exchange_broker.cluster.db_lease import DbLease
from exchange_broker.cluster.node import ClusterStartError, beat_and_watch, cancel_task, leave
from exchange_broker.core.queue import dispatch_guarded

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
        self._last_incarnation = 0  # (a rejoin registers above it)
        self.role = "leader"
        self.broker = None
        self.link_secret = ""
        self.leaders: dict[tuple[str, str], Leader] = {}
        self.members: dict[str, str] = {}  # live nodes -> AMQP address, read each beat
        self.on_evicted: Callable[[], int] = lambda: 0  # drop what it led (Placement.demote_all)
        self.on_live: Callable[[set], None] = lambda names: None  # each beat's live nodes (HandOff.live_now)
        self.on_rejoined: Callable[[], int] = lambda: 0  # point the placeholders (Placement.point_at_leaders)
        self.drain: Callable[[], Awaitable[None]] | None = None  # every store write issued so far is done
        self.listening: tuple[str, str] = ("", "")
        self.lease = DbLease(time.monotonic, heartbeat, failover_timeout)
        self.server = None  # the AMQP listener (app.py)
        self.holding = False  # the guard said False since the last release: queues wait to dispatch
        self._rejoining = False
        self._lost_at = self.lease.now()
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
        started = self.lease.beat_started()
        try:
            self.incarnation = await self._call(
                lambda: self.store.register(self.name, role="leader", amqp_address=amqp, admin_address=admin,
                                            at_least=self._last_incarnation + 1))
        except NodeNameInUse as exc:
            raise ClusterStartError(str(exc)) from None
        self.lease.rejoined(started)
        await self._call(self.leaders_store.resume, self.name)  # what it led before a restart, unless moved
        self.link_secret = await self._call(self.leaders_store.link_secret)
        self.leaders = await self._call(self.leaders_store.leaders)
        self.members = await self._call(self.leaders_store.members)
        log.info("cluster: node '%s' joined (incarnation %d); every node serves, each queue has a leader",
                 self.name, self.incarnation)
        if self._task is None:  # it beats from now: a slow start must not get it evicted
            beat = beat_and_watch(self.heartbeat, self.tick, self.watch)
            self._task = asyncio.get_running_loop().create_task(beat, name="cluster-heartbeat")

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

    def guard(self) -> bool:
        """Before a durable queue this node leads hands out a message (``Broker.delivery_guard``)
        and before it writes to another node's link: False (hold) while it may have been evicted
        (its last confirmed beat older than its lease allows: paused, cut off from the database)
        or is rejoining."""
        if self.lease.may_deliver():
            return True
        self.holding = True
        self.watch()
        return False

    def release(self) -> int:
        """The lease runs again: every queue the guard held hands out what waited. Returns how many
        queues were asked to dispatch."""
        self.holding = False
        return dispatch_guarded(self.broker) if self.broker is not None else 0

    def definitions_unavailable(self) -> str | None:
        """``Broker.definitions_unavailable``: why a definition change cannot be stored now (the
        database is away, or the node is rejoining), else None."""
        if self.lease.state == "held":
            return None
        return (f"node '{self.name}' cannot reach the database (for {self.lease.seconds_away():.0f} s): "
                f"definitions cannot be changed until it is back")

    def watch(self) -> None:
        """A beat that hangs (nothing comes back) counts as a lost database once the lease may have
        run out (called every heartbeat, beside the beats, and by the guard)."""
        if self.lease.overdue() and self.lease.beat_failed():
            self._log_lost("no heartbeat came back")

    # -- serving ----------------------------------------------------------------------------------------
    async def serving(self, broker, amqp_address: str, admin_address: str) -> None:
        self.broker = broker
        self.listening = (amqp_address, admin_address)  # (a rejoin registers with them)
        await self._call(lambda: self.store.update_node(self.name, self.incarnation, amqp_address=amqp_address,
                                                        admin_address=admin_address))
        await self._call(self.store.bump_definitions)  # the other nodes learn where its queues are

    async def tick(self) -> None:
        if not await self.renew() or self.lease.state != "held":
            return  # the database is away (logged once) or the node has just joined again
        try:
            live = await self._call(self.leaders_store.live)
            self.members = members_of(live)
            self.on_live(set(live))
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
        started = self.lease.beat_started()
        try:
            version = self.mirror.version if self.mirror is not None and self.mirror.version >= 0 else None
            beat = await self._call(self.store.heartbeat, self.name, self.incarnation, version)
        except SQLAlchemyError as exc:
            if self.lease.beat_failed():
                self._log_lost(" ".join(str(exc).split())[:300])
            return True  # unknown: the guard holds the output once the lease may have run out
        if not beat:
            await self._rejoin()
            return False
        if self.lease.beat_ok(started):
            log.warning("cluster: node '%s' reaches the database again after %.1f s; it still leads its queues",
                        self.name, self.lease.now() - self._lost_at)
            if self.mirror is not None:
                self.mirror.request()  # what was read meanwhile was not placed (serve_leaders.applied)
        if self.holding and self.lease.may_deliver():
            self.release()
        return True

    def _log_lost(self, why: str) -> None:
        self._lost_at = self.lease.last_answer  # its last answer: a hang is noticed a lease later
        log.warning("cluster: node '%s' cannot reach the database (%s); it keeps its clients, refuses "
                    "definition changes, holds what needs the database and, after %.1f s, the deliveries of "
                    "its durable queues until it is back", self.name, why, self.lease.stale_after)

    async def _rejoin(self) -> None:
        """The database is back and this node's row is gone: another node evicted it (its queues
        may be led elsewhere now). Every queue it led becomes a placeholder (their consumers get
        basic.cancel; nothing of them was handed out since its lease may have run out), and it
        registers again."""
        if self._rejoining:
            return
        self._rejoining = True
        try:
            self.lease.evicted()
            self._last_incarnation = max(self._last_incarnation, self.incarnation or 0)
            self.incarnation = None  # every write fails its fence from now (node_fence matches no row)
            dropped = self.on_evicted()
            if self.drain is not None:  # what was issued while it led is written (fenced: failed) first
                await self.drain()
            while True:
                try:
                    await self.join()
                    break
                except (SQLAlchemyError, ClusterStartError) as exc:
                    log.warning("cluster: rejoining failed (%s); trying again", " ".join(str(exc).split())[:200])
                    await asyncio.sleep(self.heartbeat)
            self.on_rejoined()  # its placeholders follow the leaders it just read
            await self._call(self.store.bump_definitions)  # the other nodes learn it is back
            if self.mirror is not None:
                self.mirror.request()
            log.warning("cluster: node '%s' had been removed from the cluster while it could not reach the "
                        "database; it dropped the %d queue(s) it led (their consumers were cancelled) and joined "
                        "again as incarnation %d", self.name, dropped, self.incarnation)
            if self.holding and self.lease.may_deliver():
                self.release()
        finally:
            self._rejoining = False

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
