"""Definitions shared by the nodes of a cluster: a node's broker follows the store's definitions.

Every definition write of a clustered node (``SqlDurability.write`` → ``SqlStore.definition_write``)
bumps the ``definitions`` version and sends ``NOTIFY eb_definitions`` in the same transaction.
:class:`DefinitionsMirror` keeps a running broker equal to the store:

* a :class:`persistence.cluster_store.DefinitionsListener` thread hears each new version;
* the mirror reads the version, then every definition row, off the event loop
  (:func:`load_rows`), and applies the difference to the broker on the loop
  (:func:`apply_rows`): vhosts, users, permissions, topic permissions, durable exchanges,
  durable queues (empty placeholders: messages stay in the store), durable bindings, policies,
  vhost and user limits;
* the difference is applied without a definition write back to the store: each change is made
  with ``store=False`` (what another node wrote; the broker keeps its durability, so what follows
  from a change here, such as messages a new policy's length limit drops, is still stored);
* versions heard while a reload runs are folded into one more reload.

Step one of the cluster runs it on standby nodes (a warm copy of the definitions, and
``cluster_nodes.definitions_version`` tells how far each node is); the next step runs it on every
serving node.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from persistence import limits_store
from persistence.cluster_store import ClusterStore, DefinitionsListener
from persistence.sql_policies import load_policies
from persistence.store import Definitions

from exchange_broker.core.auth import HASHING_SHA256, User
from exchange_broker.core.exchange import Exchange, make_index
from exchange_broker.cluster.node import cancel_task
from exchange_broker.core.vhost import BUILTIN_EXCHANGES
from exchange_broker.durability.recovery import decode_args
from exchange_broker.durability.sql import encode_args

log = logging.getLogger("exchange_broker.cluster")

BUILTIN = {"", *(name for name, _type in BUILTIN_EXCHANGES)}
RETRY = 1.0  # seconds before a failed reload is tried again


@dataclass
class DefinitionRows:
    """Everything a broker's definitions are made of, as read from the store at ``version``."""
    version: int
    defs: Definitions
    policies: list[dict] = field(default_factory=list)
    limits: limits_store.LimitsAndTopics | None = None
    leaders: dict | None = None  # (vhost, queue) -> Leader: a cluster with per-queue leaders
    members: dict | None = None  # and its live nodes -> AMQP address


@dataclass
class Placeholders:
    """How a node with per-queue leaders stands for queues: ``make(vh, name, row)`` builds the
    object for a stored queue it has none for, ``keep(q)`` protects a queue from removal (one
    declared here whose row this read did not see yet)."""
    make: Callable
    keep: Callable


def load_rows(cluster_store: ClusterStore, store) -> DefinitionRows:
    """Blocking (off the loop). The version is read first: the rows are at least that new."""
    version = cluster_store.definitions_version()
    return DefinitionRows(version, store.load_definitions(), load_policies(store), limits_store.load(store))


def apply_rows(broker, rows: DefinitionRows, placeholders: Placeholders | None = None) -> dict:
    """Make ``broker``'s definitions those of ``rows``, changing only what differs, without a
    write to the store. Returns how many things were added/changed and removed."""
    counts = {"changed": 0, "removed": 0}
    _vhosts(broker, rows.defs, counts)
    _users(broker, rows.defs, counts)
    _exchanges(broker, rows.defs, counts)
    _queues(broker, rows.defs, counts, placeholders)
    _bindings(broker, rows.defs, counts)
    _policies(broker, rows.policies, counts)
    if rows.limits is not None:
        _limits_and_topics(broker, rows.limits, counts)
    return counts


def _vhosts(broker, defs: Definitions, counts: dict) -> None:
    wanted = {v["name"] for v in defs.vhosts}
    for name in wanted - set(broker.vhosts):
        broker.add_vhost(name, store=False)
        counts["changed"] += 1
    for name in set(broker.vhosts) - wanted:
        broker.delete_vhost(name, store=False)
        counts["removed"] += 1
    for v in defs.vhosts:  # RabbitMQ's default_queue_type, set on any node
        broker.vhosts[v["name"]].default_queue_type = v.get("default_queue_type")


def _users(broker, defs: Definitions, counts: dict) -> None:
    wanted = {}
    for u in defs.users:
        wanted[u["name"]] = (u["password_hash"] or "", u["hashing_algorithm"] or HASHING_SHA256, list(u["tags"] or []))
    for name, (pw, algo, tags) in wanted.items():
        have = broker.users.get(name)
        if have is None or (have.password_hash, have.hashing_algorithm, list(have.tags)) != (pw, algo, tags):
            broker.users[name] = User(name, pw, algo, tags)
            counts["changed"] += 1
    for name in set(broker.users) - set(wanted):
        broker.delete_user(name, store=False)
        counts["removed"] += 1
    perm_rows = {(p["user"], p["vhost"]): (p["configure"], p["write"], p["read"]) for p in defs.permissions}
    for key, triple in perm_rows.items():
        if broker.permissions.get(key) != triple:
            broker.permissions[key] = triple
            counts["changed"] += 1
    for user, vhost in set(broker.permissions) - set(perm_rows):
        broker.clear_permissions(user, vhost, store=False)
        counts["removed"] += 1


def _exchange_key(ex) -> tuple:
    return (ex.type, bool(ex.auto_delete), bool(ex.internal), encode_args(ex.arguments))


def _exchanges(broker, defs: Definitions, counts: dict) -> None:
    wanted: dict[tuple[str, str], dict] = {(x["vhost"], x["name"]): x for x in defs.exchanges}
    for (vhost, name), x in wanted.items():
        vh = broker.vhosts.get(vhost)
        if vh is None or name in BUILTIN:
            continue
        args = decode_args(x["arguments"])
        have = vh.exchanges.get(name)
        if have is not None:
            if _exchange_key(have) == (x["type"], bool(x["auto_delete"]), bool(x["internal"]), encode_args(args)):
                continue
            vh._remove_exchange(have, store=False)  # redeclared differently (deleted and declared again)
        vh._add_exchange(Exchange(vhost, name, x["type"], x["durable"], x["auto_delete"], x["internal"], args,
                                  index=make_index(x["type"], args)))
        counts["changed"] += 1
    for vh in list(broker.vhosts.values()):
        for name, ex in list(vh.exchanges.items()):
            if (ex.durable or broker.definitions_shared) and name not in BUILTIN and (vh.name, name) not in wanted \
                    and name in vh.exchanges:
                vh._remove_exchange(ex, store=False)
                counts["removed"] += 1


def _queues(broker, defs: Definitions, counts: dict, placeholders: Placeholders | None) -> None:
    wanted = {(r["vhost"], r["name"]): r for r in defs.queues}
    for (vhost, name), r in wanted.items():
        vh = broker.vhosts.get(vhost)
        if vh is None:
            continue
        have = vh.queues.get(name)
        if have is not None and have.store_id == r["id"]:
            continue
        if have is not None:  # deleted and declared again
            if placeholders is not None and placeholders.keep(have):
                continue
            vh.remove_queue(have, store=False)
        try:
            if placeholders is not None:
                q = placeholders.make(vh, name, r)
            else:
                q = broker.make_queue(vh, name, True, None, r["auto_delete"], decode_args(r["arguments"]))
        except Exception as exc:  # noqa: BLE001 - a row this broker cannot declare: the others still load
            log.warning("cluster: stored queue '%s' in vhost '%s' cannot be loaded: %s", name, vhost, exc)
            continue
        q.store_id = r["id"]  # an empty placeholder: its messages stay in the store
        vh.queues[name] = q
        counts["changed"] += 1
    for vh in list(broker.vhosts.values()):
        for name, q in list(vh.queues.items()):
            if q.store_id is not None and (vh.name, name) not in wanted:
                if placeholders is not None and placeholders.keep(q):
                    continue
                vh.remove_queue(q, store=False)
                counts["removed"] += 1


def _bindings(broker, defs: Definitions, counts: dict) -> None:
    """Durable bindings (both ends durable), keyed with their arguments encoded the same way."""
    wanted: dict[tuple, dict] = {}
    for b in defs.bindings:
        kind = "q" if b["destination_type"] == "queue" else "e"
        args = decode_args(b["arguments"])
        wanted[(b["vhost"], b["source"], kind, b["destination"], b["routing_key"], encode_args(args))] = args
    have: dict[tuple, dict] = {}
    for vh in broker.vhosts.values():
        for source, dest_type, dest, rk, args in vh.bindings():
            if vh._durable_binding(vh.exchanges[source], dest_type, dest):
                kind = "q" if dest_type == "queue" else "e"
                have[(vh.name, source, kind, dest, rk, encode_args(args))] = args
    for key in have.keys() - wanted.keys():
        vhost, source, kind, dest, rk, _raw = key
        broker.vhosts[vhost].exchanges[source].index.unbind((kind, dest), rk, have[key])
        counts["removed"] += 1
    for key in wanted.keys() - have.keys():
        vhost, source, kind, dest, rk, _raw = key
        vh = broker.vhosts.get(vhost)
        if vh is None or source not in vh.exchanges or dest not in (vh.queues if kind == "q" else vh.exchanges):
            continue
        vh.exchanges[source].index.bind((kind, dest), rk, wanted[key])
        counts["changed"] += 1


def _policies(broker, rows: list[dict], counts: dict) -> None:
    wanted: dict[str, dict[tuple[str, str], dict]] = {}
    for r in rows:
        wanted.setdefault(r["vhost"], {})[(r["kind"], r["name"])] = r["value"]
    for vh in broker.vhosts.values():
        mine = wanted.get(vh.name, {})
        changed = False
        for kind, table in vh.policies.tables.items():
            for name in [n for n in table if (kind, n) not in mine]:
                table.pop(name)
                counts["removed"] += 1
                changed = True
        for (kind, name), value in mine.items():
            have = vh.policies.get(kind, name)
            if have is None or have.value() != value:
                vh.policies.restore(kind, name, value)
                counts["changed"] += 1
                changed = True
        if changed:
            vh.policies.apply_all()


def _limits_and_topics(broker, stored: limits_store.LimitsAndTopics, counts: dict) -> None:
    vhost_limits: dict[str, dict[str, int]] = {}
    for r in stored.vhost_limits:
        if r["vhost"] in broker.vhosts:
            vhost_limits.setdefault(r["vhost"], {})[r["name"]] = r["value"]
    user_limits: dict[str, dict[str, int]] = {}
    for r in stored.user_limits:
        if r["user"] in broker.users:
            user_limits.setdefault(r["user"], {})[r["name"]] = r["value"]
    topics: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    for r in stored.topic_permissions:
        if r["user"] in broker.users and r["vhost"] in broker.vhosts:
            topics.setdefault((r["user"], r["vhost"]), {})[r["exchange"]] = (r["write"], r["read"])
    for have, want in ((broker.vhost_limits, vhost_limits), (broker.user_limits, user_limits),
                       (broker.topic_permissions, topics)):
        if have != want:
            counts["changed"] += 1
            have.clear()
            have.update(want)


def take_over(broker, rows: DefinitionRows, clock, durability) -> bool:
    """A standby becomes active: its warm ``broker`` gets the store's latest ``rows`` (what the
    listener had not applied yet), the serving node's ``clock`` (it had none: a placeholder's
    x-expires never fired) and ``durability``; recovery then restores each queue's messages into
    it. False (use a fresh broker) for a store that was never seeded (no user): the defaults of a
    fresh broker seed it."""
    if not rows.defs.users:
        return False
    apply_rows(broker, rows)
    broker.clock = clock
    broker.delayed.clock = clock  # the delayed-message exchange keeps its own reference
    broker.durability = durability
    log.info("cluster: serving the definitions followed as a standby (version %d)", rows.version)
    return True


class DefinitionsMirror:
    """Keeps ``broker``'s definitions equal to the store's (see the module's docstring).
    ``on_version(v)`` is called on the loop after version ``v`` is applied."""

    def __init__(self, cluster_store: ClusterStore, store, broker,
                 on_version: Callable[[int], None] = lambda v: None, owns_store: bool = False,
                 load: Callable[..., DefinitionRows] = load_rows, placeholders: Placeholders | None = None,
                 on_loaded: Callable[[DefinitionRows], None] = lambda rows: None,
                 on_applied: Callable[[DefinitionRows], None] = lambda rows: None,
                 local_writes: Callable[[], tuple[int, int]] | None = None) -> None:
        self.load = load  # (cluster_store, store) -> rows, blocking
        # a node that also writes definitions: (issued, done) counts of its own definition writes;
        # a read that one of them may have missed is not applied (the broker is ahead of it): the
        # mirror reads again
        self.local_writes = local_writes
        self.on_loaded = on_loaded  # on the loop, before each apply
        self.placeholders = placeholders
        self.on_applied = on_applied  # on the loop, after each apply
        self.cluster_store = cluster_store
        self.store = store
        self.owns_store = owns_store  # close the store on stop
        self.broker = broker
        self.on_version = on_version
        self.version = -1  # nothing loaded yet
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener: DefinitionsListener | None = None
        self._task: asyncio.Task | None = None
        self._again = False

    async def start(self) -> None:
        """Load the definitions now, then follow every change."""
        self.loop = asyncio.get_running_loop()
        while not await self._reload():
            pass
        self.listener = DefinitionsListener(self.cluster_store, self.version, self._heard, self._heard).start()

    def _heard(self, version: int) -> None:  # on the listener's thread
        try:
            self.loop.call_soon_threadsafe(self.request)
        except RuntimeError:
            pass  # the loop is closed: shutting down

    def request(self) -> None:
        """Reload soon (on the loop); requests made while one runs give one more reload."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = self.loop.create_task(self._follow(), name="cluster-definitions")

    async def _follow(self) -> None:
        while True:
            self._again = False
            try:
                if not await self._reload():
                    self._again = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a database hiccup: try again shortly
                log.warning("cluster: reloading the definitions failed (trying again): %s",
                            " ".join(str(exc).split())[:300])
                await asyncio.sleep(RETRY)
                self._again = True
            if not self._again:
                return

    async def _reload(self) -> bool:
        """Read and apply the store's definitions; False: read again (see ``local_writes``)."""
        before = self.local_writes() if self.local_writes is not None else None
        rows = await self.loop.run_in_executor(None, self.load, self.cluster_store, self.store)
        if rows.version < self.version:
            return True  # an older read finished late
        if before is not None and (before[0] != before[1] or self.local_writes() != before):
            await asyncio.sleep(0.05)  # this node's own writes were under way: read again
            return False
        self.on_loaded(rows)
        counts = apply_rows(self.broker, rows, self.placeholders)
        self.on_applied(rows)
        self.version = rows.version
        log.debug("cluster: definitions version %d applied (%d changed, %d removed)", rows.version,
                  counts["changed"], counts["removed"])
        self.on_version(rows.version)
        return True

    async def stop(self) -> None:
        if self.listener is not None:
            listener, self.listener = self.listener, None
            await asyncio.get_running_loop().run_in_executor(None, listener.stop)
        await cancel_task(self._task)
        if self.owns_store:
            self.store.close()
