"""This process as a node of the cluster: membership, heartbeats, the store lock and queue leases.

Step one of the cluster (see the README's "Cluster" section): the nodes on one PostgreSQL store
form an active/standby group. The store's lock (persistence/lock.py) still admits ONE serving
node, so no queue is ever served by two processes:

* every node registers in ``cluster_nodes`` and beats every ``--cluster-heartbeat`` seconds
  (the database's clock decides who is alive: a beat within ``--cluster-failover-timeout``);
* a node that finds the store locked is a *standby*: it beats and tries the lock each beat,
  with no AMQP listener and no admin API;
* a node that gets the lock takes the store's lease (``STORE_LEASE``: at once after a clean stop,
  else once the last active node's lease ran out, a failover timeout after its last beat), fences
  every write of its store with that lease's epoch (a stale node's writes fail), then restores the
  store, listens, and takes a lease on every durable queue it serves (epoch + 1 on each change of
  leader); its beats renew the leases;
* an active node whose lock another node took, whose store lease has another leader, or whose
  node row another incarnation took exits at once without another write (fail-stop, exit code 1):
  a supervisor restarts it, as a standby. (A lock merely lost in a database outage is taken again
  when the database answers; meanwhile the store lease fences the node's writes.)

* the database going away does not end the active node: while its last confirmed beat is younger
  than its lease allows it serves as usual (writes wait: confirms stall); past that its ``guard``
  holds every client's output (``db_lease.py``) until a beat renews the store's lease (the held
  output goes out: nobody took over) or finds it taken (it stops, as above);
* an active node whose store lease ran out while it kept the lock (paused, hung, cut off alone)
  has its database sessions ended by a standby, which takes over; resumed, it holds its output and
  stops at its next beat. A standby that could not reach the database either first gives the
  active node a failover timeout to renew its lease (``standby_patience.py``): after an outage of
  the database itself the active node serves on;
* every node listens from its start: a standby passes clients on to the active node
  (``forward.py``, ``standby_admin.py``; ``amqp_target``/``admin_target`` come from each beat).

All store calls run on an executor thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from persistence.cluster_store import STORE_LEASE, ClusterStore, Lease, NodeNameInUse, fence
from persistence.lock import StoreInUse
from sqlalchemy.exc import SQLAlchemyError

from exchange_broker.cluster.db_lease import DbLease
from exchange_broker.cluster.standby_patience import StandbyPatience
from exchange_broker.core.queue import dispatch_guarded

log = logging.getLogger("exchange_broker.cluster")

LEASES_PER_BEAT = 200  # queues whose lease is taken per heartbeat (a big store leases over a few beats)


async def beat_forever(interval: float, tick: Callable) -> None:
    """``await tick()`` every ``interval`` seconds until cancelled (a node's heartbeat)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await tick()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one bad beat must not end the heartbeat
            log.exception("cluster: heartbeat failed")


async def beat_and_watch(interval: float, tick: Callable, watch: Callable[[], None]) -> None:
    """A node's heartbeat task: ``await tick()`` and, beside it, ``watch()`` every ``interval``
    seconds until cancelled (the watch keeps running while a slow tick waits for the database)."""
    async def watching() -> None:
        watch()
    watcher = asyncio.get_running_loop().create_task(beat_forever(interval, watching))
    try:
        await beat_forever(interval, tick)
    finally:
        watcher.cancel()


async def cancel_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it has ended (whatever it raised)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001
        pass


async def leave(node) -> None:
    """A node's clean stop (``ClusterNode`` or ``LeaderNode``): its row goes, unless it was
    already replaced, and its store closes."""
    if node.incarnation is not None and node.role != "lost":
        try:
            await node._call(node.store.deregister, node.name, node.incarnation)
        except SQLAlchemyError as exc:
            log.warning("cluster: could not leave the cluster cleanly: %s", " ".join(str(exc).split())[:300])
    await node._call(node.store.close)


class ClusterStartError(Exception):
    """The node cannot join (its name is in use by a live node, ...): one line."""


class ClusterNode:
    def __init__(self, store_url: str, name: str, heartbeat: float, failover_timeout: float) -> None:
        self.name = name
        self.heartbeat = heartbeat
        self.failover_timeout = failover_timeout
        self.store = ClusterStore(store_url, failover_timeout)
        self.incarnation: int | None = None
        self.role = "standby"
        self.broker = None  # set once active: its durable queues get leases
        self.lock = None  # the store lock, once held
        self.leases: dict[tuple[str, str], Lease] = {}
        self.store_lease: Lease | None = None  # once active: every write of the store is fenced by it
        self.on_lost: Callable[[str], None] = lambda why: None  # fail-stop (the application exits)
        self._task: asyncio.Task | None = None
        self._standby_logged = False
        self._waiting: set[tuple[str, str]] = set()  # queues whose lease another node still holds
        # a standby's warm copy of the definitions (exchange_broker.cluster.definitions)
        self.mirror = None
        self.make_mirror: Callable[[], object] | None = None
        self.warm_broker = None  # a standby's broker with the definitions, once it becomes active
        # where the active node serves (AMQP, admin), refreshed each beat of a standby: its
        # listeners pass client connections there (exchange_broker.cluster.forward)
        self.active: tuple[str, str] | None = None
        self.listening: tuple[str, str] = ("", "")  # this node's (AMQP, admin) addresses, set by the application
        # the start of the last heartbeat that renewed the store lease: a node whose lease may have
        # run out since then holds every client's output (guard) until a beat says whether it
        # still has it (db_lease.py)
        self.lease = DbLease(time.monotonic, heartbeat, failover_timeout)
        self.holding = False  # the guard said False since the lease last ran: durable queues wait
        self.stale_after = self.lease.stale_after
        self.patience = StandbyPatience(time.monotonic, heartbeat, failover_timeout)  # (a standby's)
        self.server = None  # the AMQP listener (app.py): its held output is released
        self._beat_ok = False  # the last heartbeat and store lease renewal both succeeded

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- joining: standby until the store lock is ours ----------------------------------------------
    async def _register(self, role: str) -> bool:
        """Register (once); False while the schema is not there yet (a first node is migrating)."""
        if self.incarnation is not None:
            return True
        amqp, admin = self.listening
        try:
            self.incarnation = await self._call(
                lambda: self.store.register(self.name, role=role, amqp_address=amqp, admin_address=admin))
        except NodeNameInUse as exc:
            raise ClusterStartError(str(exc)) from None
        except SQLAlchemyError as exc:  # e.g. no "cluster_nodes" yet (a first node is migrating)
            log.debug("cluster: cannot register yet: %s", exc)
            return False
        self.role = role
        log.info("cluster: node '%s' joined (incarnation %d) as %s", self.name, self.incarnation, role)
        return True

    async def acquire_store(self, lock, should_exit: asyncio.Event) -> bool:
        """Stand by until ``lock`` (the store's) is ours: True, or False when asked to exit."""
        while True:
            try:
                await self._call(lock.acquire)
                self.lock = lock
                return True
            except StoreInUse as exc:
                holder = str(exc).replace("; stop it first", "")
                if self.patience.answered():
                    log.info("cluster: standby '%s' reaches the database again; it gives the active node %.1f s "
                             "to renew its lease before it may take over", self.name, self.failover_timeout)
            except SQLAlchemyError as exc:
                holder = f"the database is unreachable: {' '.join(str(exc).split())[:200]}"
            if await self._register("standby") and self.incarnation is not None:
                await self._start_mirror()
                await self._beat_quietly()
                await self._find_active()
                if await self._end_expired_holder():
                    continue  # its lock is free now: try again at once
            if not self._standby_logged:
                self._standby_logged = True
                log.info("cluster: node '%s' is standing by (%s)", self.name, holder)
            try:
                await asyncio.wait_for(should_exit.wait(), self.heartbeat)
                return False
            except asyncio.TimeoutError:
                pass

    async def _end_expired_holder(self) -> bool:
        """The active node's store lease ran out but it still holds the store lock (paused by
        SIGSTOP or a long GC, hung, or cut off while its database sessions live): end its database
        sessions, so its lock goes and its open transactions roll back. Its writes were fenced
        already; when it runs again it holds its output (``guard``) and stops at its next beat.
        Not while the database may have been away for everyone (``standby_patience.py``)."""
        if not self.patience.may_end_holder():
            return False  # the database was away for this node too: the active node may be alive
        try:
            stale = await self._call(self.store.expired_store_holder)
            if stale is None or stale[0] == self.name:
                return False
            ended = await self._call(self.store.end_sessions_of, stale[1], stale[2])
        except SQLAlchemyError as exc:
            log.debug("cluster: cannot end a stale node's sessions: %s", exc)
            return False
        if ended:
            log.warning("cluster: node '%s' (pid %d on %s) let its store lease run out but still holds the store; "
                        "ended its %d database session(s) so that a live node takes over", stale[0], stale[1],
                        stale[2], ended)
        return bool(ended)

    def guard(self) -> bool:
        """Before a durable queue of this node hands out a message (``Broker.delivery_guard``) and
        before it reads from a client: False while the active node's store lease may have run out
        (its last confirmed beat older than its lease allows: paused, cut off from the database, or
        the database away) and once it lost its role. A beat that renews the lease lets the held
        queues deliver again (``renew``)."""
        if self.role == "lost":
            return False
        if self.role != "active" or self.lease.may_deliver():
            return True
        self.holding = True
        self.watch()
        return False

    def watch(self) -> None:
        """A beat that hangs counts as a lost database once the lease may have run out."""
        if self.role == "active" and self.lease.overdue() and self.lease.beat_failed():
            self._log_lost("no heartbeat came back")

    def _log_lost(self, why: str) -> None:
        log.warning("cluster: node '%s' cannot reach the database (%s); it keeps its clients and, after %.1f s, "
                    "holds its durable queues' deliveries until it is back", self.name, why, self.lease.stale_after)

    async def _find_active(self) -> None:
        try:
            self.active = await self._call(self.store.active_addresses)
        except SQLAlchemyError as exc:
            log.debug("cluster: cannot read the active node's addresses: %s", exc)
            self.active = None

    def amqp_target(self) -> str | None:
        """The active node's AMQP address, for a standby's listener (None: none is known)."""
        return self.active[0] if self.active and self.role != "active" else None

    def admin_target(self) -> str | None:
        return self.active[1] if self.active and self.active[1] and self.role != "active" else None

    async def _start_mirror(self) -> None:
        """A standby follows the definitions (``make_mirror``, set by the application), once the
        store's schema is there."""
        if self.mirror is not None or self.make_mirror is None:
            return
        mirror = self.make_mirror()
        mirror.on_version = self._loaded_version
        try:
            await mirror.start()
        except Exception as exc:  # noqa: BLE001 - e.g. the first node is still migrating: next beat
            log.debug("cluster: cannot follow the definitions yet: %s", exc)
            await mirror.stop()
            return
        self.mirror = mirror
        log.info("cluster: standby '%s' follows the definitions (version %d)", self.name, mirror.version)

    def _loaded_version(self, version: int) -> None:
        """On the loop: tell the cluster (``cluster status``) at once, not only at the next beat."""
        if self.incarnation is None:
            return
        fut = asyncio.get_running_loop().run_in_executor(
            None, self.store.set_definitions_version, self.name, self.incarnation, version)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() is None or
                              log.debug("cluster: recording the definitions version failed: %s", f.exception()))

    async def stop_mirror(self):
        """Stop following the definitions; returns the warm broker (None without one)."""
        if self.mirror is None:
            return None
        mirror, self.mirror = self.mirror, None
        await mirror.stop()
        return mirror.broker

    async def become_active(self, sql_store, should_exit: asyncio.Event) -> bool:
        """With the lock held: take the store's lease (it is free, or once the last active node's
        lease has run out: a failover timeout after its last beat), fence every write of
        ``sql_store`` with its epoch, and be the active node. False when asked to exit meanwhile."""
        while not await self._register("active"):
            if await self._wait(should_exit):
                return False
        announced = False
        while True:
            taking = time.monotonic()
            lease = await self._call(self.store.take_lease, *STORE_LEASE, self.name)
            if lease is not None:
                self.lease.beat_ok(taking)  # the lease runs a failover timeout from the database's now
                break
            if not announced:
                announced = True
                held = await self._call(self.store.lease_of, *STORE_LEASE)
                log.warning("cluster: waiting until the lease of '%s', the last active node, runs out (%.1f s "
                            "after its last heartbeat) before serving", held.leader if held else "?",
                            self.failover_timeout)
            await self._beat_quietly()
            await self._find_active()
            if await self._wait(should_exit):
                return False
        self.store_lease = lease
        sql_store.write_fence = lambda conn: fence(conn, lease)  # a stale node's writes fail
        sql_store.after_write = self.store.bump_definitions  # definition writes: version + NOTIFY
        self.warm_broker = await self.stop_mirror()  # the application serves it (take_over)
        await self._call(lambda: self.store.update_node(self.name, self.incarnation, role="active"))
        self.role = "active"
        log.info("cluster: node '%s' is active (store lease epoch %d)", self.name, lease.epoch)
        return True

    async def _wait(self, should_exit: asyncio.Event) -> bool:
        try:
            await asyncio.wait_for(should_exit.wait(), self.heartbeat)
            return True
        except asyncio.TimeoutError:
            return False

    async def serving(self, broker, amqp_address: str, admin_address: str) -> None:
        """The node serves ``broker`` on these addresses: publish them, lease its queues, beat."""
        self.broker = broker
        await self._call(lambda: self.store.update_node(self.name, self.incarnation, amqp_address=amqp_address,
                                                        admin_address=admin_address))
        await self._sync_leases()
        beat = beat_and_watch(self.heartbeat, self.tick, self.watch)
        self._task = asyncio.get_running_loop().create_task(beat, name="cluster-heartbeat")

    # -- the heartbeat ------------------------------------------------------------------------------
    async def _beat_quietly(self) -> bool:
        try:
            version = None if self.role == "active" else max(self.mirror.version if self.mirror else 0, 0)
            self._beat_ok = await self._call(self.store.heartbeat, self.name, self.incarnation, version)
            return self._beat_ok
        except SQLAlchemyError as exc:
            log.warning("cluster: heartbeat failed: %s", " ".join(str(exc).split())[:300])
            self._beat_ok = False
            return True  # unknown: the lock check decides

    async def tick(self) -> None:
        """One beat of an active node: the lock first (a node without it must not even beat), then
        the heartbeat (which renews the leases), then leases for queues declared or deleted since."""
        if self.lock is not None:
            await self._call(self.lock.check)  # takes it again after a database outage, if it can
            if getattr(self.lock, "state", "held") == "taken":  # "lost": unreachable; the lease fences
                self._lose("another node holds the store lock now")
                return
        if await self.renew():
            await self._sync_leases()

    async def renew(self) -> bool:
        """Beat and renew the store lease now (False: this node lost its role and stops)."""
        started = self.lease.beat_started()
        if not await self._beat_quietly():
            self._lose(f"another incarnation of node '{self.name}' has registered")
            return False
        if self.store_lease is not None and not await self._renew_store_lease():
            self._lose(f"the store's lease (epoch {self.store_lease.epoch}) has another leader now")
            return False
        if not self._beat_ok:
            if self.role == "active" and self.lease.beat_failed():
                self._log_lost("its heartbeat failed")
            return True
        if self.lease.beat_ok(started) and self.role == "active":
            log.warning("cluster: node '%s' reaches the database again and still holds the store's lease "
                        "(epoch %d); it serves on", self.name, self.store_lease.epoch if self.store_lease else 0)
        if self.holding and self.broker is not None and self.lease.may_deliver():
            self.holding = False
            dispatch_guarded(self.broker)  # the durable queues hand out what waited
        return True

    async def _renew_store_lease(self) -> bool:
        try:
            renewed = await self._call(self.store.renew_lease, self.store_lease)
            self._beat_ok = self._beat_ok and renewed
            return renewed
        except SQLAlchemyError as exc:
            log.warning("cluster: renewing the store's lease failed: %s", " ".join(str(exc).split())[:300])
            self._beat_ok = False
            return True  # unknown: fenced writes and the lock check decide

    def _lose(self, why: str) -> None:
        log.error("cluster: node '%s' stops serving: %s", self.name, why)
        self.role = "lost"
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self.on_lost(why)

    def durable_queues(self) -> set[tuple[str, str]]:
        out = set()
        for vh in list(self.broker.vhosts.values()):
            for q in list(vh.queues.values()):
                if q.durable and not q.exclusive:
                    out.add((vh.name, q.name))
        return out

    async def _sync_leases(self) -> None:
        if self.broker is None:
            return
        served = self.durable_queues()
        to_take = [key for key in served if key not in self.leases][:LEASES_PER_BEAT]
        gone = [key for key in self.leases if key not in served]
        if not to_take and not gone:
            return
        try:
            taken, refused = await self._call(self._take_and_forget, to_take, gone)
        except SQLAlchemyError as exc:
            log.warning("cluster: updating queue leases failed: %s", " ".join(str(exc).split())[:300])
            return
        for key in gone:
            self.leases.pop(key, None)
        self.leases.update(taken)
        self._waiting.difference_update(taken)
        for key, leader in refused:
            if key in self._waiting:
                continue
            self._waiting.add(key)
            log.info("cluster: queue '%s' in vhost '%s' is still leased by '%s'; taking it once that lease "
                     "runs out", key[1], key[0], leader)

    def _take_and_forget(self, to_take, gone):
        taken, refused = {}, []
        for vhost, queue in gone:
            self.store.forget_lease(vhost, queue)
        for vhost, queue in to_take:
            lease = self.store.take_lease(vhost, queue, self.name)
            if lease is None:
                held = self.store.lease_of(vhost, queue)
                refused.append(((vhost, queue), held.leader if held else "?"))
            else:
                taken[(vhost, queue)] = lease
        return taken, refused

    # -- views and the end --------------------------------------------------------------------------
    async def nodes(self) -> list[dict]:
        """Every node of the cluster (persistence.cluster_store.ClusterStore.nodes)."""
        return await self._call(self.store.nodes)

    async def stop(self) -> None:
        """A clean stop: no more beats; the node's row goes and its leases end now."""
        await self.stop_mirror()
        await cancel_task(self._task)
        await leave(self)
