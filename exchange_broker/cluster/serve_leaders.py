"""Start a node of a cluster with per-queue leaders (``serve --cluster --cluster-mode leaders``).

The application (``app.py``) assembles it from above, with the functions here, in this order:

1. ``node_config`` and ``make_node``; ``open_store`` opens the shared store (its schema migrated
   by one node at a time: an advisory lock) and ``join`` registers the node
   (``leaders.LeaderNode``): every write of the store is fenced by the node's row from then on;
2. the application builds the durability and the broker as for a single node; ``plug_in`` wires
   the node into them and restores the store: the queues this node leads with their messages,
   the others as placeholders (``remote.RemoteQueue``) pointed at their leaders;
3. ``plug_in`` then follows the definitions and the leaders (``definitions.DefinitionsMirror``
   with ``placement.Placement``): queues given to this node become real, placeholders follow
   their leaders;
4. the application listens (AMQP, admin API) and calls ``node.serving``: the node beats.

The nodes log in to each other as ``leaders.LINK_USER`` with the cluster's link secret
(``Broker.link_login``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from persistence.cluster_leaders import LeadersStore
from persistence.cluster_store import tagged_url
from persistence.queue_moves import QueueMoves
from sqlalchemy import text

from exchange_broker.cluster.definitions import DefinitionsMirror, Placeholders, load_rows
from exchange_broker.cluster.delayed_leader import DelayedLeader
from exchange_broker.cluster.handoff import HandOff
from exchange_broker.cluster.leaders import LINK_USER, LeaderNode
from exchange_broker.cluster.links import Links
from exchange_broker.cluster.placement import Placement
from exchange_broker.cluster.remote import RemoteQueue, address_of
from exchange_broker.core.ports import Waiter
from exchange_broker.durability.recovery import decode_args, restore

log = logging.getLogger("exchange_broker.cluster")

MIGRATION_LOCK = "exchange-broker: migrate"


def open_shared_store(url: str, sqlite_synchronous: str):
    """The store every node writes to; one node at a time brings its schema up to date."""
    from persistence.sql_store import SqlStore
    store = SqlStore(url, sqlite_synchronous=sqlite_synchronous)
    store.open(migrate_schema=False)
    with store.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": MIGRATION_LOCK})
        try:
            store.open()
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": MIGRATION_LOCK})
            conn.commit()
    return store


def is_remote(q) -> bool:
    return isinstance(q, RemoteQueue)


def node_config(config):
    """The node's settings: its database sessions named after it (``tagged_url``)."""
    return dataclasses.replace(config, database_url=tagged_url(config.store_url))


def make_node(config, advertised) -> LeaderNode:
    """The node, not joined yet, with the addresses it will listen on (``advertised(host)``)."""
    node = LeaderNode(config.store_url, config.cluster_node_name, config.cluster_heartbeat,
                      config.cluster_failover_timeout)
    admin = f"{advertised(config.admin_listen_host)}:{config.admin_port}" if config.admin_port else ""
    node.listening = (f"{advertised(config.host)}:{config.port}", admin)
    return node


async def open_store(config):
    """Step 1: the shared store (off the loop)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, open_shared_store, config.store_url, config.sqlite_synchronous)


async def join(node: LeaderNode, store) -> None:
    """Step 1: register the node; from then on every write of ``store`` is fenced by its row. A
    node that cannot join raises ClusterStartError (one line)."""
    await node.join()
    store.write_fence = node.fence  # an evicted node's writes fail
    store.after_write = node.store.bump_definitions  # definition writes: version + NOTIFY


async def plug_in(node: LeaderNode, store, broker, durability, config) -> None:
    """Steps 2-3: the joined node takes the broker and durability the application built on
    ``store``; the application then listens and calls ``node.serving``."""
    loop = asyncio.get_running_loop()
    broker.link_login = (LINK_USER, node.link_secret)
    broker.definitions_shared = True  # transient queues and exchanges are routed to from every node
    broker.delivery_guard = node.guard  # the durable queues it leads wait while its lease may have run out
    broker.definitions_unavailable = node.definitions_unavailable  # 541 while the database is away
    node.links = Links(LINK_USER, node.link_secret, name=f"exchange-broker node {node.name}")
    if not config.no_cluster_connection_handoff:
        broker.handoff = HandOff()
        node.on_live = broker.handoff.live_now

    def make_remote(broker_, vhost: str, name: str, row: dict, leader):
        # a placeholder never forwards to its own node (it waits for the queue to be made real here)
        address = address_of(leader) if leader is None or leader.node != node.name else None
        return RemoteQueue(broker_, vhost, name, links=node.links, address=address,
                           leader=leader.node if leader is not None else "", durable=row["durable"],
                           auto_delete=row["auto_delete"], arguments=decode_args(row["arguments"]))

    placement = Placement(node, broker, durability, config.queue_window, make_remote, is_remote)
    node.on_evicted = placement.demote_all
    node.on_rejoined = placement.point_at_leaders

    async def drain() -> None:
        durability.flush()
        done = loop.create_future()
        waiter = Waiter()
        waiter.add(lambda _arg, _ok: done.done() or done.set_result(None), None)
        durability.writer.submit_call(waiter, lambda _store: None)
        await done

    node.drain = drain

    def claim(vhost: str, queue: str, queue_id: int) -> bool:  # the writer thread, before the row
        wanted = placement.for_node(vhost, queue)
        leader, elsewhere = node.claim(vhost, queue, queue_id, wanted)
        loop.call_soon_threadsafe(node.leaders.__setitem__, (vhost, queue), leader)
        if leader.node != (wanted or node.name) or elsewhere:
            loop.call_soon_threadsafe(placement.lost_declare, vhost, queue, queue_id, leader)
            return False
        return True

    durability.claim_queue = claim
    durability.on_queue_dropped = node.leaders_store.forget
    durability.after_queue_declared = placement.declared
    placement.locator = config.queue_leader_locator
    broker.place_queue = placement.place_new
    restore(broker, durability, config.queue_window,
            place=lambda vh, row: None if placement.leads((vh.name, row["name"]))
            else placement.placeholder(vh, row["name"], row))
    durability.start()
    placement.seen.update(q.store_id for vh in broker.vhosts.values() for q in vh.queues.values()
                          if q.store_id is not None)

    placement.moves = node.queue_moves = QueueMoves(node.store)  # (the admin API's /api/rebalance/queues)

    def load(cluster_store, store):
        rows = load_rows(cluster_store, store)
        leaders = LeadersStore(cluster_store)
        rows.leaders, rows.members = leaders.leaders(), leaders.members()
        rows.moves = placement.moves.requested(node.name)  # cluster rebalance / drain
        return rows

    def loaded(rows) -> None:
        node.leaders, node.members = rows.leaders, rows.members

    def applied(rows) -> None:
        if node.lease.state != "held":
            return  # it may have been evicted: nothing is placed until it knows (a regain or a rejoin reads again)
        placement.place(rows.defs.queues)
        placement.seen.update(r["id"] for r in rows.defs.queues)
        placement.hand_over_requested(rows.moves)

    node.mirror = DefinitionsMirror(node.store, store, broker, load=load,
                                    placeholders=Placeholders(make=placement.placeholder, keep=placement.keep),
                                    on_loaded=loaded, on_applied=applied,
                                    local_writes=lambda: (durability.definitions_issued, durability.definitions_done))
    await node.mirror.start()
    DelayedLeader(node, broker).start()  # x-delayed-message: one node fires, the others forward to it
