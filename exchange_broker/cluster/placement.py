"""Which object stands for each durable queue on this node (``--cluster-mode leaders``): the real
queue where this node leads it, a placeholder (``RemoteQueue``) pointed at the leader elsewhere.

:meth:`Placement.place` runs on the loop after every definitions reload (the leaders come with the
definitions, ``definitions.load_rows``):

* a placeholder of a queue this node now leads (its leader died and the queue was given here, or
  the node restarted) becomes the real queue: its row and messages are read back from the store,
  as at start-up, so every confirmed message is there and unacked ones come back marked
  redelivered; the placeholder's relayed consumers are cancelled (consumer-cancel-notify) and
  re-consume here;
* a placeholder whose leader moved is pointed at the new one;
* a real queue this node no longer leads (declared here and on another node at the same moment,
  and that node won) becomes a placeholder.

The store reads of a promotion run on the loop (a failover is rare; the first window of the queue
is read, the rest pages in as usual).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from persistence.cluster_leaders import Leader

from exchange_broker.durability.recovery import decode_args
from exchange_broker.cluster.links import spawn
from exchange_broker.core.ports import Waiter
from exchange_broker.durability.sql import encode_args, message_from_row

log = logging.getLogger("exchange_broker.cluster")


class Placement:
    def __init__(self, node, broker, durability, window: int,
                 make_remote: Callable[..., object], is_remote: Callable[[object], bool]) -> None:
        self.node = node
        self.broker = broker
        self.durability = durability
        self.window = window
        self.make_remote = make_remote  # (broker, vhost name, queue name, row, leader) -> placeholder
        self.is_remote = is_remote
        self.seen: set[int] = set()  # queue ids some read of the definitions had
        self.locator = "client-local"  # --queue-leader-locator
        self.elsewhere: dict[tuple[str, str], str] = {}  # declared here, to be led by that node
        self.await_leader: set[tuple[str, str]] = set()
        self.handing: set[tuple[str, str]] = set()  # queues being handed to another node
        self.moves = None  # persistence.queue_moves.QueueMoves (serve_leaders)
        self.handed: dict[tuple[str, str], bool] = {}  # hand-overs written (the writer thread's answers)

    def keep(self, q) -> bool:
        """A queue whose row no read has had yet was declared here a moment ago (led here or, with
        the balanced locator, elsewhere): a reload that raced the declare must not remove it."""
        return q.store_id is not None and q.store_id not in self.seen

    def leads(self, key: tuple[str, str]) -> bool:
        held = self.node.leaders.get(key)
        return held is not None and held.node == self.node.name

    # -- where a queue declared here is led (the queue leader locator) --------------------------------
    def place_new(self, vh, q):
        """``Broker.place_queue``: a durable queue declared here with the balanced locator is led by
        the live node leading the fewest queues; this node then holds a placeholder, and declare-ok
        waits until that node serves the queue (``ready_on``)."""
        if not q.durable or q.exclusive:
            return q
        locator = q.arguments.get("x-queue-leader-locator") or self.locator
        if isinstance(locator, (bytes, bytearray)):
            locator = bytes(locator).decode("utf-8", "replace")
        drained = self.drained()
        if locator not in ("balanced", "least-leaders") and not drained:
            return q
        target = self.node.least_loaded()
        if drained and target == self.node.name:  # ``cluster drain``: nothing new is placed here
            target = next(iter(sorted(self.node.members)), self.node.name)
        if target == self.node.name:
            return q
        leader = Leader(target, 0, self.node.members.get(target, ""))
        remote = self.make_remote(self.broker, vh.name, q.name, {"auto_delete": q.auto_delete, "durable": True,
                                                                 "arguments": encode_args(q.arguments)}, leader)
        self.elsewhere[(vh.name, q.name)] = target
        self.await_leader.add((vh.name, q.name))
        return remote

    def drained(self) -> bool:
        """``cluster drain`` marked this node (the live members leave it out)."""
        return bool(self.node.members) and self.node.name not in self.node.members

    def lost_declare(self, vhost: str, queue: str, queue_id: int, leader) -> None:
        """A queue declared here had been declared on another node a moment before (its row is
        kept): this node's queue becomes a placeholder now (publishes into it would not be stored:
        they are nacked), and the next read of the definitions gives it the stored row's id."""
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(queue) if vh is not None else None
        if q is None or q.store_id != queue_id:
            return
        self.demote(vh, q, leader, same_row=False)  # the reload replaces it with the stored queue's
        if self.node.mirror is not None:
            self.node.mirror.request()

    def for_node(self, vhost: str, queue: str) -> str | None:
        """Which node the claim of a queue declared here is for (None: this node)."""
        return self.elsewhere.pop((vhost, queue), None)

    def declared(self, q) -> None:
        """After ``SqlDurability.queue_declared``: a queue placed on another node answers its
        declare-ok once that node serves it."""
        key = (q.vhost, q.name)
        if key not in self.await_leader:
            return
        self.await_leader.discard(key)
        stored = self.durability.pending_definition
        ready = Waiter()

        def written(_arg, ok: bool) -> None:
            if ok:
                spawn(self._until_served(q, ready))
            else:
                ready.fire(False)
        stored.add(written, None)
        self.durability.pending_definition = ready

    async def _until_served(self, q, ready: Waiter, limit: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + limit
        while not q.deleted:
            if q.address is not None and await q.served_by_leader():
                ready.fire(True)
                return
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.02)
        log.warning("cluster: queue '%s' in vhost '%s' placed on node '%s' is not served there after %.0f s",
                    q.name, q.vhost, q.leader, limit)
        ready.fire(False)

    def placeholder(self, vh, name: str, row: dict):
        """``definitions.apply_rows``'s factory for a queue row it has no object for."""
        return self.make_remote(self.broker, vh.name, name, row, self.node.leaders.get((vh.name, name)))

    def place(self, queue_rows: list[dict]) -> dict:
        counts = {"promoted": 0, "demoted": 0, "retargeted": 0}
        touched = set()
        for row in queue_rows:
            key = (row["vhost"], row["name"])
            if key in self.handing:
                continue  # being handed to another node: neither real here again nor pointed anywhere yet
            vh = self.broker.vhosts.get(key[0])
            have = vh.queues.get(key[1]) if vh is not None else None
            if have is None or have.store_id != row["id"]:
                continue
            leader = self.node.leaders.get(key)
            if self.leads(key):
                if self.is_remote(have) and row["durable"]:  # a transient queue is never moved
                    self._promote(vh, have, row)
                    counts["promoted"] += 1
                    touched.add(vh)
            elif not self.is_remote(have):
                if leader is None:
                    continue  # declared here a moment ago: the claim is on its way
                log.error("cluster: queue '%s' in vhost '%s' is led by node '%s': this node's copy is dropped",
                          key[1], key[0], leader.node)
                self.demote(vh, have, leader, row)
                counts["demoted"] += 1
            elif have.retarget(leader):
                counts["retargeted"] += 1
        for vh in touched:
            vh.policies.apply_all()
        if any(counts.values()):
            log.info("cluster: queues placed: %(promoted)d now led here, %(demoted)d dropped, "
                     "%(retargeted)d led by another node now", counts)
        return counts

    def demote(self, vh, q, leader, row: dict | None = None, same_row: bool = True):
        """The one way a queue this node led stops being led here: a placeholder pointed at
        ``leader`` (None: not known yet; ``point_at_leaders`` after a rejoin, or the next read of
        the definitions, points it) stands for it from now on; its consumers get basic.cancel
        (consumer-cancel-notify) and consume again through the placeholder; its messages stay in
        the store for the new leader.

        ``same_row``: the placeholder stands for the same stored queue (its id is kept, so every
        read of the definitions points it, ``place``); False when the stored queue is another
        node's (``lost_declare``: the next read replaces the placeholder with one of its id)."""
        if row is None:
            row = {"auto_delete": q.auto_delete, "durable": q.durable, "arguments": encode_args(q.arguments)}
        remote = self.make_remote(self.broker, vh.name, q.name, row, leader)
        if same_row:
            remote.store_id = q.store_id
        self._swap(vh, q, remote)
        return remote

    def point_at_leaders(self) -> int:
        """After a rejoin (``LeaderNode.leaders`` just read): every placeholder points at its
        queue's leader now, without waiting for the next read of the definitions (consumers that
        waited on a placeholder with no leader are relayed from then on). Returns how many moved."""
        moved = 0
        for vh in list(self.broker.vhosts.values()):
            for q in list(vh.queues.values()):
                key = (vh.name, q.name)
                if not self.is_remote(q) or key in self.handing:
                    continue
                leader = self.node.leaders.get(key)
                if leader is None or leader.node == self.node.name:
                    continue  # not known yet, or led here again: the next read promotes it
                moved += bool(q.retarget(leader))
        return moved

    def demote_all(self) -> int:
        """This node was evicted (cut off from the database past its lease): every queue it led
        is another node's now, or nobody's until the cluster settles. Returns how many."""
        led = [(vh, q) for vh in self.broker.vhosts.values() for q in list(vh.queues.values())
               if not self.is_remote(q)]
        for vh, q in led:
            self.demote(vh, q, None)
        for key in [key for key, leader in self.node.leaders.items() if leader.node == self.node.name]:
            del self.node.leaders[key]
        return len(led)

    def _promote(self, vh, placeholder, row: dict) -> None:
        q = self.broker.make_queue(vh, row["name"], True, None, row["auto_delete"], decode_args(row["arguments"]))
        q.store_id = row["id"]
        # The stored messages are counted again now: the definitions read that brought ``row`` is
        # a transaction of its own, before the leaders' read that gave this node the queue, and
        # the hand-over (or the eviction) may have committed between the two, after the old
        # leader's last messages. With that read's counts this node would not load those last
        # messages and would number new ones from a sequence already used.
        row = {**row, **self.durability.store.queue_counts(row["id"])}
        if q.restore(self.durability, row, self.window):  # the first window now, the rest pages in
            rows = self.durability.store.load_messages(q.store_id, q.page_cursor, min(q.window or q.paged, q.paged))
            q.refilled([message_from_row(q, r) for r in rows], q.page_epoch)
        self._swap(vh, placeholder, q)
        log.warning("cluster: node '%s' leads queue '%s' in vhost '%s' now (%d messages)", self.node.name,
                    q.name, vh.name, q.message_count)

    # -- handing a queue to another node (cluster rebalance / drain) -------------------------------------
    def hand_over_requested(self, moves: list[tuple[str, str, str]]) -> None:
        """The moves asked of this node (``persistence.queue_moves``): each queue it leads, to its target."""
        for vhost, queue, to in moves:
            self.hand_over(vhost, queue, to)

    def hand_over(self, vhost: str, queue: str, to: str) -> bool:
        """Hand the leadership of a queue this node leads to node ``to``, nothing lost:

        1. the real queue is swapped for a placeholder that has no leader yet: from now on this
           node delivers nothing of it, its consumers (local and relayed) get basic.cancel and
           consume again through the placeholder, publishes into it are nacked until the new
           leader is known, and nothing is written for it any more (acks of its deliveries that
           come late write nothing: the old queue is deleted; the new leader redelivers them,
           marked redelivered);
        2. an ordered write on the store's writer thread, after every write of the queue already
           submitted (its messages, acks and delivered marks), gives the lease to ``to`` (epoch + 1,
           fenced by this node's row): ``to`` then restores the queue from the store, as after a
           failover (``_promote``), and every node points its placeholder at it.

        If the lease could not be handed over (the target died or was drained meanwhile, the
        database failed), the next read of the definitions makes the queue real here again."""
        key = (vhost, queue)
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(queue) if vh is not None else None
        if q is None or self.is_remote(q) or not q.durable or key in self.handing or not self.leads(key):
            return False
        self.handing.add(key)
        remote = self.make_remote(self.broker, vhost, queue, {"auto_delete": q.auto_delete, "durable": True,
                                                              "arguments": encode_args(q.arguments)}, None)
        remote.store_id = q.store_id
        remote.leader = to
        self._swap(vh, q, remote)
        moves, node = self.moves, self.node
        incarnation = node.incarnation

        results = self.handed

        def give(_store) -> None:  # the writer thread
            results[key] = moves.handed_over(vhost, queue, node.name, incarnation, to)
        self.durability.write(give)
        self.durability.pending_definition.add(self._handed, (key, to))
        return True

    def _handed(self, arg, ok: bool) -> None:
        key, to = arg
        self.handing.discard(key)
        if ok and self.handed.pop(key, False):
            log.info("cluster: queue '%s' in vhost '%s' handed over to node '%s'", key[1], key[0], to)
        else:
            log.warning("cluster: queue '%s' in vhost '%s' was not handed over to node '%s'; it stays here",
                        key[1], key[0], to)
        if self.node.mirror is not None:
            self.node.mirror.request()  # read the leaders again: placeholders follow (or the queue is real again)

    def _swap(self, vh, old, new) -> None:
        """``new`` stands for the queue from now on; ``old``'s consumers are cancelled (the
        bindings name the queue, so they stay)."""
        old.deleted = True
        self.broker.on_queue_deleted(old)
        old.on_deleted()
        new.on_empty_consumers = old.on_empty_consumers
        vh.queues[new.name] = new
        new.dispatch()
