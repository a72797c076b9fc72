"""Which node fires the delayed messages of a cluster with per-queue leaders.

``x-delayed-message`` exchanges hold their messages in one table for the whole cluster; one node
at a time (the *delayed leader*) holds them in memory and routes each when due, the others forward
delayed publishes to it. Its lease is a row of ``queue_leases`` under the reserved key
:data:`DELAYED_LEASE` (no queue has it: the queue leaders' spreading and rebalancing leave it
alone, and once its node is evicted the row goes with the node's transient queues).

:meth:`DelayedLease.claim` (every node, each beat) takes the lease only when no node holds it or
its node was *evicted* (its ``cluster_nodes`` row is gone): a node that merely missed beats may
still be firing, and every write of an evicted node fails (``node_fence``), so two nodes never
fire the same stored row.
"""

from __future__ import annotations

from sqlalchemy import text

from .cluster_leaders import N_ALIVE, Leader, node_fence
from .cluster_store import ClusterStore, _interval

DELAYED_LEASE = ("", "*delayed-messages*")  # (vhost, queue) of the lease row; "" is no vhost's name


class DelayedLease:
    def __init__(self, store: ClusterStore) -> None:
        self.store = store

    def claim(self, node: str, incarnation: int) -> Leader | None:
        """The delayed leader after this call (``node`` if it took or held the lease), or None
        when its node is not a live node but not evicted yet (wait)."""
        key = {"v": DELAYED_LEASE[0], "q": DELAYED_LEASE[1], "me": node}
        with self.store.transaction() as conn:
            node_fence(conn, node, incarnation)
            conn.execute(text(f"INSERT INTO queue_leases (vhost, queue, leader, epoch, expires_at) VALUES "
                              f"(:v, :q, :me, 1, now() + {_interval(self.store.failover_timeout)}) "
                              f"ON CONFLICT DO NOTHING"), key)
            row = conn.execute(text(
                f"SELECT l.leader, l.epoch, n.amqp_address, n.name IS NOT NULL AS present, "
                f"(n.name IS NOT NULL AND {N_ALIVE}) AS alive FROM queue_leases l LEFT JOIN cluster_nodes n "
                f"ON n.name = l.leader WHERE l.vhost = :v AND l.queue = :q FOR UPDATE OF l"), key).one()
            if row.leader == node:
                return Leader(node, row.epoch, row.amqp_address or "")
            if row.alive:
                return Leader(row.leader, row.epoch, row.amqp_address or "")
            if row.present:
                return None  # missed its beats, not evicted yet: it may still fire
            conn.execute(text("UPDATE queue_leases SET leader = :me, epoch = epoch + 1 WHERE vhost = :v AND queue = :q"),
                         key)
            return Leader(node, row.epoch + 1, "")
