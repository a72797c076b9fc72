"""Rebuild durable state from the store at start-up, without loading every message body."""

from __future__ import annotations

import logging

from pamqp import decode as pdecode

from exchange_broker.core import limits, permissions
from exchange_broker.core.broker import Broker
from exchange_broker.core.exchange import Exchange, make_index
from exchange_broker.durability.sql import SqlDurability, message_from_row
from exchange_broker.core.users import restore_access
from persistence import limits_store
from persistence.sql_policies import delete_vhost_policies, load_policies

log = logging.getLogger("exchange_broker.recovery")


def decode_args(raw: bytes | None) -> dict:
    if not raw:
        return {}
    return pdecode.field_table(raw)[1]


def restore(broker: Broker, durability: SqlDurability, window: int, place=None) -> dict:
    """Load vhosts, durable exchanges, queues and bindings; page in each queue's first window.
    ``place(vhost, row)``: a cluster node with per-queue leaders gives the object that stands for
    a queue another node leads (None: this node leads it and restores it)."""
    store = durability.store
    defs = store.load_definitions()
    if defs.users or not durability.seed_access(broker):  # a fresh store gets the defaults, once
        if not defs.users:  # another process seeded it just now
            defs = store.load_definitions()
        restore_access(broker, durability, defs)  # users and permissions
    counts = {"vhosts": 0, "exchanges": 0, "queues": 0, "bindings": 0, "messages": 0}
    for v in defs.vhosts:
        broker.add_vhost(v["name"], store=False).default_queue_type = v.get("default_queue_type")
        counts["vhosts"] += 1
    for x in defs.exchanges:
        vh = broker.add_vhost(x["vhost"], store=False)
        if x["name"] in vh.exchanges:
            continue
        args = decode_args(x["arguments"])
        ex = Exchange(vh.name, x["name"], x["type"], x["durable"], x["auto_delete"], x["internal"], args,
                      index=make_index(x["type"], args))
        vh._add_exchange(ex)
        counts["exchanges"] += 1
    max_id = 0
    to_page = []
    for r in defs.queues:
        vh = broker.add_vhost(r["vhost"], store=False)
        max_id = max(max_id, r["id"])
        elsewhere = place(vh, r) if place is not None else None
        if elsewhere is not None:
            elsewhere.store_id = r["id"]
            vh.queues[elsewhere.name] = elsewhere
            counts["queues"] += 1
            continue
        q = broker.make_queue(vh, r["name"], True, None, r["auto_delete"], decode_args(r["arguments"]))
        q.store_id = r["id"]
        if q.restore(durability, r, window):  # each queue type rebuilds its own state
            to_page.append(q)
        vh.queues[q.name] = q
        counts["queues"] += 1
        counts["messages"] += q.message_count
    durability.next_queue_id = max_id + 1
    durability.reserve_queue_ids()  # PostgreSQL: from the store's sequence (several processes)
    for b in defs.bindings:
        vh = broker.vhosts.get(b["vhost"])
        if vh is None:
            continue
        ex = vh.exchanges.get(b["source"])
        kind = "q" if b["destination_type"] == "queue" else "e"
        target = vh.queues if kind == "q" else vh.exchanges
        if ex is None or b["destination"] not in target:
            continue
        ex.index.bind((kind, b["destination"]), b["routing_key"], decode_args(b["arguments"]))
        counts["bindings"] += 1
    counts["policies"] = restore_policies(broker, durability)
    restore_limits_and_topics(broker, durability)
    # messages last: one that expired while the broker was down is dead-lettered now, and its
    # dead-letter exchange, bindings and queue must all be back by then
    for q in to_page:
        rows = store.load_messages(q.store_id, q.page_cursor, min(q.window or q.paged, q.paged))
        q.refilled([message_from_row(q, row) for row in rows], q.page_epoch)
    log.info("recovered %(vhosts)d vhosts, %(exchanges)d exchanges, %(queues)d queues, "
             "%(bindings)d bindings, %(policies)d policies, %(messages)d messages", counts)
    return counts


def restore_policies(broker: Broker, durability: SqlDurability) -> int:
    """Policies and operator policies back into their vhosts, then applied to what is restored
    (before messages are paged in). Rows of a vhost that is gone are dropped from the store."""
    n = 0
    gone = set()
    for row in load_policies(durability.store):
        vh = broker.vhosts.get(row["vhost"])
        if vh is None:
            gone.add(row["vhost"])
            continue
        if vh.policies.restore(row["kind"], row["name"], row["value"]) is not None:
            n += 1
    for name in gone:
        durability.write(lambda s, name=name: delete_vhost_policies(s, name))
    for vh in broker.vhosts.values():
        vh.policies.apply_all()
    return n


def restore_limits_and_topics(broker: Broker, durability: SqlDurability) -> None:
    """Vhost limits, user limits and topic permissions; rows whose vhost or user is gone are
    dropped from the store."""
    stored = limits_store.load(durability.store)
    for r in stored.vhost_limits:
        if r["vhost"] in broker.vhosts:
            limits.set_vhost_limit(broker, r["vhost"], r["name"], r["value"], store=False)
        else:
            durability.vhost_limit_cleared(r["vhost"], r["name"])
    for r in stored.user_limits:
        if r["user"] in broker.users:
            limits.set_user_limit(broker, r["user"], r["name"], r["value"], store=False)
        else:
            durability.user_limit_cleared(r["user"], r["name"])
    for r in stored.topic_permissions:
        if r["user"] in broker.users and r["vhost"] in broker.vhosts:
            permissions.set_topic_permission(broker, r["user"], r["vhost"], r["exchange"], r["write"],
                                             r["read"], store=False)
        else:
            durability.topic_permission_cleared(r["user"], r["vhost"], r["exchange"])
