"""Per-queue leaders of a cluster (``--cluster-mode leaders``), kept in PostgreSQL.

Every node serves: each durable queue has one leader node (a row of ``queue_leases``), the other
nodes forward to it. This module holds the SQL; ``exchange_broker/cluster/leaders.py`` drives it.

* **Fencing by node.** Every write transaction of a node's store starts with :func:`node_fence`:
  ``SELECT ... FROM cluster_nodes WHERE name = :me AND incarnation = :i FOR SHARE``. A node is
  evicted (its row deleted) before any of its queues moves, and the delete waits for the node's
  open write to commit; after it, every write of that process fails (:class:`Fenced`). So a node
  that was paused (SIGSTOP, a long GC) and comes back cannot write to a queue another node took
  over: it finds its row gone.
* **Claims.** A node declaring a durable queue claims it (:meth:`LeadersStore.claim`): it becomes
  its leader unless a live node already leads it.
* **Spreading a dead node's queues** (:meth:`LeadersStore.settle`, run by every node each beat,
  one at a time under an advisory lock): nodes whose heartbeat is older than their failover
  timeout have their database sessions ended (by every node at each beat, lock or not: a node
  cut off in the middle of its own settle holds the lock until then) and their rows deleted;
  every queue whose leader is not a live node is then given, one by one, to the live node that
  leads the fewest queues (epoch + 1). The definitions version is bumped in the same
  transaction, so every node hears of the change at once (``NOTIFY``) and reloads the leaders
  with the definitions.
* **The link secret**: the password nodes use to log in to each other (a random 63-bit number
  kept in ``cluster_counters``; whoever reads the database owns the cluster anyway).

Blocking calls: run them off the event loop.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .cluster_store import ALIVE, STORE_LEASE, ClusterStore, Fenced, _interval, end_sessions

SETTLE_LOCK = "exchange-broker: settle leaders"
# ALIVE for the row of cluster_nodes aliased "n"
N_ALIVE = "(n.heartbeat_at > now() - make_interval(secs => n.failover_timeout))"


@dataclass(frozen=True)
class Leader:
    node: str
    epoch: int
    amqp_address: str  # "" while the leader is not a live node (its queue waits to be given out)


def node_fence(conn: Connection, name: str, incarnation: int) -> None:
    """In the caller's transaction: share-lock this node's row, or Fenced when the node was evicted
    (or restarted elsewhere) meanwhile."""
    held = conn.execute(text("SELECT 1 FROM cluster_nodes WHERE name = :n AND incarnation = :i FOR SHARE"),
                        {"n": name, "i": incarnation}).first()
    if held is None:
        raise Fenced(f"node '{name}' (incarnation {incarnation}) was removed from the cluster: another node "
                     f"leads its queues now")


class LeadersStore:
    """The leader rows of a :class:`ClusterStore`'s database."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store

    def leaders(self) -> dict[tuple[str, str], Leader]:
        """(vhost, queue) -> its leader, for every queue lease (the store's own lease left out)."""
        with self.store.transaction() as conn:
            return self._leaders(conn)

    def _leaders(self, conn: Connection) -> dict[tuple[str, str], Leader]:
        rows = conn.execute(text(
            f"SELECT l.vhost, l.queue, l.leader, l.epoch, CASE WHEN n.name IS NOT NULL AND {N_ALIVE} "
            f"THEN n.amqp_address ELSE '' END AS address "
            f"FROM queue_leases l LEFT JOIN cluster_nodes n ON n.name = l.leader WHERE l.vhost <> :store"),
            {"store": STORE_LEASE[0]}).all()
        return {(r.vhost, r.queue): Leader(r.leader, r.epoch, r.address or "") for r in rows}

    def claim(self, vhost: str, queue: str, node: str, queue_id: int | None = None) -> tuple[Leader, bool]:
        """Lead a queue this node declared, before its row is written: a new lease (epoch 1), or
        one whose leader is not a live node (epoch + 1). Returns the queue's leader (this node, or
        the live node that already leads it) and whether a row of that name with another id than
        ``queue_id`` exists (declared elsewhere: that row and its messages must stay; the caller
        does not write its own)."""
        key = {"v": vhost, "q": queue, "me": node}
        with self.store.transaction() as conn:
            made = conn.execute(text(f"INSERT INTO queue_leases (vhost, queue, leader, epoch, expires_at) "
                                     f"VALUES (:v, :q, :me, 1, now() + {_interval(self.store.failover_timeout)}) "
                                     f"ON CONFLICT DO NOTHING"), key).rowcount
            if made:
                self.store.bump_definitions(conn)  # the other nodes point their placeholders here
            row = conn.execute(text(
                f"SELECT l.leader, l.epoch, n.amqp_address, (n.name IS NOT NULL AND "
                f"{N_ALIVE}) AS alive "
                f"FROM queue_leases l LEFT JOIN cluster_nodes n ON n.name = l.leader "
                f"WHERE l.vhost = :v AND l.queue = :q FOR UPDATE OF l"), key).one()
            existing = conn.execute(text("SELECT id FROM queues WHERE vhost = :v AND name = :q"), key).scalar()
            elsewhere = existing is not None and existing != queue_id
            if row.leader == node:
                return Leader(node, row.epoch, row.amqp_address or ""), elsewhere
            if row.alive:
                return Leader(row.leader, row.epoch, row.amqp_address or ""), elsewhere
            conn.execute(text("UPDATE queue_leases SET leader = :me, epoch = epoch + 1 WHERE vhost = :v AND queue = :q"),
                         key)
            self.store.bump_definitions(conn)
            return Leader(node, row.epoch + 1, ""), elsewhere

    def resume(self, node: str) -> int:
        """A node (re)starting: the transient definitions go if it is the only live node (a
        cluster started afresh, as RabbitMQ's transient exchanges and queues), else the transient
        queues of its earlier incarnation; it leads again the durable queues still given to its
        name (epoch + 1)."""
        while (done := self._resume(node)) is None:  # the lock is held: maybe by a dead node's hung
            time.sleep(0.2)                             # settle, whose sessions were just ended
        return done

    def _resume(self, node: str) -> int | None:
        with self.store.transaction() as conn:
            if not conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtext(:k))"), {"k": SETTLE_LOCK}).scalar():
                _end_dead_sessions(conn, node)
                return None
            alone = not conn.execute(text(f"SELECT 1 FROM cluster_nodes WHERE {ALIVE} AND name <> :n"),
                                     {"n": node}).first()
            if alone:
                _drop_transient_definitions(conn)
            else:
                for vhost, queue in conn.execute(text(
                        "SELECT q.vhost, q.name FROM queues q JOIN queue_leases l ON l.vhost = q.vhost AND "
                        "l.queue = q.name WHERE l.leader = :n AND NOT q.durable"), {"n": node}).all():
                    _drop_queue(conn, vhost, queue)
            done = conn.execute(text(f"UPDATE queue_leases SET epoch = epoch + 1, expires_at = now() + "
                                     f"{_interval(self.store.failover_timeout)} WHERE leader = :n AND vhost <> :store"),
                                {"n": node, "store": STORE_LEASE[0]}).rowcount
            self.store.bump_definitions(conn)
        return done

    def members(self) -> dict[str, str]:
        """The live nodes of this mode that take queues (not being drained): name -> AMQP address."""
        return members_of(self.live())

    def live(self) -> dict[str, tuple[str, bool]]:
        """The live nodes of this mode: name -> (AMQP address, being drained)."""
        with self.store.transaction() as conn:
            return {name: (address, draining) for name, address, draining in conn.execute(text(
                f"SELECT name, amqp_address, draining FROM cluster_nodes WHERE {ALIVE} AND role = 'leader'"))}

    def forget(self, vhost: str, queue: str) -> None:
        """The queue was deleted: its lease row goes."""
        self.store.forget_lease(vhost, queue)

    def settle(self, me: str) -> tuple[list[str], int]:
        """Evict dead nodes and give every queue without a live leader to the live node with the
        fewest queues. Returns (evicted node names, queues given out). One node at a time does it
        (an advisory lock; the others only end dead nodes' sessions, and skip the rest this beat)."""
        with self.store.transaction() as conn:
            locked = conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtext(:k))"), {"k": SETTLE_LOCK}).scalar()
            # a dead node may hold its row, or the settle lock itself, in a transaction that never
            # ends (paused, or cut off from the database in the middle of its own settle): end its
            # sessions first (their transactions roll back), then its row can go, at the next beat
            # if it held the lock
            dead = _end_dead_sessions(conn, me)
            if not locked:
                return [], 0
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))  # no wait on a row lock is endless
            if dead:
                conn.execute(text(f"DELETE FROM cluster_nodes WHERE NOT {ALIVE} AND name <> :me"), {"me": me})
            live = {r.name: r.led for r in conn.execute(text(
                f"SELECT n.name, (SELECT count(*) FROM queue_leases l WHERE l.leader = n.name AND l.vhost <> :store) AS led "
                f"FROM cluster_nodes n WHERE {ALIVE} AND n.role = 'leader' AND NOT n.draining"),
                {"store": STORE_LEASE[0]}).all()}
            orphans = conn.execute(text(
                "SELECT l.vhost, l.queue, q.durable FROM queue_leases l LEFT JOIN queues q "
                "ON q.vhost = l.vhost AND q.name = l.queue WHERE l.vhost <> :store AND NOT EXISTS "
                f"(SELECT 1 FROM cluster_nodes n WHERE n.name = l.leader AND {N_ALIVE}) "
                "ORDER BY l.vhost, l.queue FOR UPDATE OF l"), {"store": STORE_LEASE[0]}).all()
            given = 0
            gone = [(v, q) for v, q, durable in orphans if not durable]  # transient: died with its node
            for vhost, queue in gone:
                _drop_queue(conn, vhost, queue)
            orphans = [(v, q) for v, q, durable in orphans if durable]
            if orphans and live:
                ttl = _interval(self.store.failover_timeout)
                for vhost, queue in orphans:
                    node = min(live, key=lambda n: (live[n], n))
                    live[node] += 1
                    conn.execute(text(f"UPDATE queue_leases SET leader = :n, epoch = epoch + 1, expires_at = now() + {ttl} "
                                      f"WHERE vhost = :v AND queue = :q"), {"n": node, "v": vhost, "q": queue})
                    given += 1
            if dead or given or gone:
                self.store.bump_definitions(conn)  # every node reloads its leaders now
            return [r[0] for r in dead], given

    def link_secret(self) -> str:
        """The password of the nodes' links to each other (made by the first node that asks)."""
        with self.store.transaction() as conn:
            conn.execute(text("INSERT INTO cluster_counters (name, value) VALUES ('link-secret', :v) "
                              "ON CONFLICT (name) DO NOTHING"), {"v": secrets.randbits(63)})
            value = conn.execute(text("SELECT value FROM cluster_counters WHERE name = 'link-secret'")).scalar_one()
        return f"{int(value):x}"


def _end_dead_sessions(conn: Connection, me: str) -> list:
    """End every database session of the nodes other than ``me`` whose heartbeat is older than
    their failover timeout; returns their (name, pid, host) rows."""
    dead = conn.execute(text(f"SELECT name, pid, host FROM cluster_nodes WHERE NOT {ALIVE} AND name <> :me"),
                        {"me": me}).all()
    for _name, pid, host in dead:
        end_sessions(conn, pid, host)
    return dead


def _drop_queue(conn: Connection, vhost: str, queue: str) -> None:
    """A transient queue whose node is gone: its row, bindings and lease (it holds no messages)."""
    key = {"v": vhost, "q": queue}
    conn.execute(text("DELETE FROM bindings WHERE vhost = :v AND destination_type = 'queue' AND destination = :q"), key)
    conn.execute(text("DELETE FROM queues WHERE vhost = :v AND name = :q AND NOT durable"), key)
    conn.execute(text("DELETE FROM queue_leases WHERE vhost = :v AND queue = :q"), key)


def _drop_transient_definitions(conn: Connection) -> None:
    """The first node of a cluster started afresh: every transient queue and exchange (and their
    bindings) went with the nodes that had them."""
    conn.execute(text("DELETE FROM bindings b USING queues q WHERE b.vhost = q.vhost AND b.destination_type = "
                      "'queue' AND b.destination = q.name AND NOT q.durable"))
    conn.execute(text("DELETE FROM bindings b USING exchanges x WHERE b.vhost = x.vhost AND NOT x.durable AND "
                      "(b.source = x.name OR (b.destination_type = 'exchange' AND b.destination = x.name))"))
    conn.execute(text("DELETE FROM queue_leases l USING queues q WHERE l.vhost = q.vhost AND l.queue = q.name "
                      "AND NOT q.durable"))
    conn.execute(text("DELETE FROM queues WHERE NOT durable"))
    conn.execute(text("DELETE FROM exchanges WHERE NOT durable"))


def members_of(live: dict[str, tuple[str, bool]]) -> dict[str, str]:
    """The members that take queues, of the live nodes ``LeadersStore.live`` read (queue_moves.py
    marks a node draining)."""
    return {name: address for name, (address, draining) in live.items() if not draining}
