"""Moving queue leaders between live nodes (``--cluster-mode leaders``): RabbitMQ's
``rabbitmq-queues rebalance all`` and ``rabbitmq-upgrade drain`` / ``revive``, in SQL.

A move is asked for, not done, here: :meth:`QueueMoves.rebalance` and :meth:`QueueMoves.drain`
set ``queue_leases.moving_to`` (under the settle lock, so they never race the spreading of a dead
node's queues) and bump the definitions version. The queue's leader hears of it with its next
read of the definitions and hands the queue over itself (``exchange_broker/cluster/placement.py``,
``Placement.hand_over``): it stops delivering, its writes for that queue are all committed, then
:meth:`QueueMoves.handed_over` gives the lease to the target (epoch + 1, as an eviction does) in a
transaction fenced by the old leader's own row. The target then restores the queue from the store
as after a failover.

``cluster_nodes.draining`` marks a node drained: it gets no queue from a rebalance, a drain or the
spreading of a dead node's queues, and the balanced locator places none on it, until
:meth:`QueueMoves.revive`.

Blocking calls: run them off the event loop.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .cluster_leaders import SETTLE_LOCK, node_fence
from .cluster_store import ALIVE, STORE_LEASE, ClusterStore


class QueueMoves:
    def __init__(self, store: ClusterStore) -> None:
        self.store = store

    # -- asking (the CLI, the admin API) --------------------------------------------------------------
    def rebalance(self) -> list[tuple[str, str, str, str]]:
        """Spread the queue leaders evenly over the live nodes that are not drained: queues move
        from the node leading the most to the one leading the fewest until they differ by at most
        one. Returns the moves asked for: (vhost, queue, from node, to node)."""
        with self.store.transaction() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": SETTLE_LOCK})
            targets = self._targets(conn)
            if not targets:
                return []
            count = dict.fromkeys(targets, 0)
            movable: dict[str, list[tuple[str, str]]] = {n: [] for n in targets}
            for vhost, queue, leader, moving_to in self._leases(conn):
                owner = moving_to or leader
                if owner in count:
                    count[owner] += 1
                    if moving_to is None:
                        movable[owner].append((vhost, queue))
            moves = []
            while True:
                most = max(count, key=lambda n: (count[n], n))
                fewest = min(count, key=lambda n: (count[n], n))
                if count[most] - count[fewest] <= 1 or not movable[most]:
                    break
                vhost, queue = movable[most].pop()
                count[most] -= 1
                count[fewest] += 1
                moves.append((vhost, queue, most, fewest))
            return self._ask(conn, moves)

    def drain(self, node: str) -> list[tuple[str, str, str, str]]:
        """Mark ``node`` drained and ask for every queue it leads to move to the other live nodes
        (the fewest-led first). Raises LookupError when there is no such node."""
        with self.store.transaction() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": SETTLE_LOCK})
            if not conn.execute(text("UPDATE cluster_nodes SET draining = true WHERE name = :n"),
                                {"n": node}).rowcount:
                raise LookupError(f"no node named '{node}' in the cluster")
            targets = self._targets(conn)
            moves = []
            for vhost, queue, leader, _moving_to in self._leases(conn):
                if leader == node and targets:
                    target = min(targets, key=lambda n: (targets[n], n))
                    targets[target] += 1
                    moves.append((vhost, queue, node, target))
            self._ask(conn, moves)
            self.store.bump_definitions(conn)  # the drained mark reaches every node's placement
            return moves

    def revive(self, node: str) -> None:
        """Queues may be placed on ``node`` again (it gets its share at the next rebalance)."""
        with self.store.transaction() as conn:
            if not conn.execute(text("UPDATE cluster_nodes SET draining = false WHERE name = :n"),
                                {"n": node}).rowcount:
                raise LookupError(f"no node named '{node}' in the cluster")
            self.store.bump_definitions(conn)

    def pending(self) -> int:
        """Moves asked for and not done yet."""
        with self.store.transaction() as conn:
            return conn.execute(text("SELECT count(*) FROM queue_leases WHERE moving_to IS NOT NULL")).scalar_one()

    def _targets(self, conn: Connection) -> dict[str, int]:
        """Live, not drained nodes -> the queues they lead or are to lead."""
        return {r.name: r.led for r in conn.execute(text(
            f"SELECT n.name, (SELECT count(*) FROM queue_leases l WHERE coalesce(l.moving_to, l.leader) = n.name "
            f"AND l.vhost <> :store) AS led FROM cluster_nodes n WHERE {ALIVE} AND n.role = 'leader' "
            f"AND NOT n.draining"), {"store": STORE_LEASE[0]}).all()}

    def _leases(self, conn: Connection):
        return conn.execute(text(
            "SELECT l.vhost, l.queue, l.leader, l.moving_to FROM queue_leases l JOIN queues q ON q.vhost = l.vhost "
            "AND q.name = l.queue WHERE q.durable AND l.vhost <> :store ORDER BY l.vhost, l.queue FOR UPDATE OF l"),
            {"store": STORE_LEASE[0]}).all()

    def _ask(self, conn: Connection, moves: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
        for vhost, queue, _old, new in moves:
            conn.execute(text("UPDATE queue_leases SET moving_to = :t WHERE vhost = :v AND queue = :q"),
                         {"t": new, "v": vhost, "q": queue})
        if moves:
            self.store.bump_definitions(conn)  # the leaders hear of it at once (NOTIFY)
        return moves

    # -- doing (the queue's leader) -----------------------------------------------------------------
    def requested(self, node: str) -> list[tuple[str, str, str]]:
        """The moves asked of ``node``: (vhost, queue, to node)."""
        with self.store.transaction() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT vhost, queue, moving_to FROM queue_leases WHERE leader = :n AND moving_to IS NOT NULL "
                "AND vhost <> :store ORDER BY vhost, queue"), {"n": node, "store": STORE_LEASE[0]}).all()]

    def draining(self) -> set[str]:
        with self.store.transaction() as conn:
            return {r[0] for r in conn.execute(text("SELECT name FROM cluster_nodes WHERE draining")).all()}

    def handed_over(self, vhost: str, queue: str, node: str, incarnation: int, to: str) -> bool:
        """``node`` stopped serving the queue and its writes for it are committed: the target leads
        it now (epoch + 1). Fenced by ``node``'s own row (an evicted node hands nothing over).
        False when the lease is not ``node``'s any more or the target is not a live, undrained node
        (the request is dropped then; the queue stays with ``node``, or settle gives it out)."""
        key = {"v": vhost, "q": queue, "me": node, "to": to}
        with self.store.transaction() as conn:
            node_fence(conn, node, incarnation)
            target_ok = conn.execute(text(f"SELECT 1 FROM cluster_nodes WHERE name = :to AND {ALIVE} "
                                          f"AND NOT draining AND role = 'leader'"), key).first() is not None
            if not target_ok:
                conn.execute(text("UPDATE queue_leases SET moving_to = NULL WHERE vhost = :v AND queue = :q "
                                  "AND leader = :me"), key)
                self.store.bump_definitions(conn)
                return False
            done = conn.execute(text("UPDATE queue_leases SET leader = :to, epoch = epoch + 1, moving_to = NULL "
                                     "WHERE vhost = :v AND queue = :q AND leader = :me"), key).rowcount
            self.store.bump_definitions(conn)
            return bool(done)
