"""Definition writes through the SQL store (``core/ports.DefinitionDurability``): vhosts, users,
permissions, topic permissions, limits, policies, exchanges, queues and bindings, each an ordered
``write`` on the group-commit writer (declare-ok & co. wait for ``pending_definition``), and the
allocation of queue ids.

A mixin of :class:`exchange_broker.durability.sql.SqlDurability`, which provides ``write``,
``read``, ``attach``, ``store``, ``window`` and the cluster's hooks (``claim_queue``,
``on_queue_dropped``, ``after_queue_declared``).
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from pamqp import encode as pencode

from persistence import limits_store, sql_policies

log = logging.getLogger("exchange_broker.persistence")

QUEUE_ID_BLOCK = 256  # queue ids reserved from a shared store at a time (refilled at half)


def encode_args(arguments: dict | None) -> bytes:
    return pencode.field_table(arguments or {})


def _definition_write(store, fn: Callable):
    """On the writer thread: ``fn(store)`` as a definition change (a cluster node's store then
    announces it to the other nodes in the same transaction)."""
    run = getattr(store, "definition_write", None)
    return fn(store) if run is None else run(fn)


def _reserve_ids(store, n: int) -> list[int]:
    return store.reserve_queue_ids(n)


class DefinitionWrites:
    """The definition hooks of SqlDurability."""

    def vhost_added(self, name: str, default_queue_type: str | None = None) -> None:
        """A new vhost, or its default queue type changed (stored again)."""
        self.write(lambda s: s.put_vhost(name, default_queue_type=default_queue_type))

    def vhost_deleted(self, name: str) -> None:
        self.write(lambda s: s.delete_vhost(name))

    # users and permissions (users.py)
    def user_added(self, user) -> None:
        name, pw, algo, tags = user.name, user.password_hash, user.hashing_algorithm, list(user.tags)
        self.write(lambda s: s.put_user(name, pw, algo, tags))

    def seed_access(self, broker) -> bool:
        """At start-up (blocking): write the broker's default vhosts, users and permissions to a
        store without users, atomically; False if another process on the store seeded it first."""
        vhost_names = list(broker.vhosts)
        user_rows = [(u.name, u.password_hash, u.hashing_algorithm, list(u.tags)) for u in broker.users.values()]
        perm_rows = [(user, vhost, *triple) for (user, vhost), triple in broker.permissions.items()]
        return _definition_write(self.store, lambda s: s.seed_access(vhost_names, user_rows, perm_rows))

    def user_deleted(self, name: str) -> None:
        self.write(lambda s: s.delete_user(name))

    def permission_set(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.write(lambda s: s.put_permission(user, vhost, configure, write, read))

    def permission_cleared(self, user: str, vhost: str) -> None:
        self.write(lambda s: s.delete_permission(user, vhost))

    def exchange_declared(self, ex) -> None:
        args = encode_args(ex.arguments)
        self.write(lambda s: s.put_exchange(ex.vhost, ex.name, ex.type, ex.durable, ex.auto_delete,
                                                  ex.internal, args))

    def exchange_deleted(self, ex) -> None:
        self.write(lambda s: s.delete_exchange(ex.vhost, ex.name))

    def queue_declared(self, q) -> None:
        if q.exclusive and self.claim_queue is None:
            return  # exclusive queues die with their connection: never stored, as in RabbitMQ
        q.store_id = self._next_queue_id()
        args = encode_args(q.arguments)
        qid = q.store_id
        if q.durable:  # a transient queue's row (a cluster's shared definitions) holds no messages
            self.attach(q, self.window)
        claim = self.claim_queue
        vhost, name, exclusive = q.vhost, q.name, q.exclusive

        def put(s):
            # a cluster node claims the queue first (writer thread); declared elsewhere meanwhile,
            # the other node's row and messages stay and this node's queue becomes a placeholder
            if claim is None or claim(vhost, name, qid):
                s.put_queue(vhost, name, q.durable, exclusive, q.auto_delete, args, queue_id=qid)
        self.write(put)
        if self.after_queue_declared is not None:
            self.after_queue_declared(q)

    def reserve_queue_ids(self) -> None:
        """At start-up (blocking): a store shared by several processes (PostgreSQL) hands out
        queue ids from its sequence in blocks; otherwise this process counts from
        ``next_queue_id``."""
        reserve = getattr(self.store, "reserve_queue_ids", None)
        ids = reserve(QUEUE_ID_BLOCK) if reserve is not None else None
        if ids is not None:
            self._shared_ids = True
            self._queue_ids.extend(ids)

    def _next_queue_id(self) -> int:
        if not self._shared_ids:
            qid, self.next_queue_id = self.next_queue_id, self.next_queue_id + 1
            return qid
        if not self._queue_ids:  # declares outran a refill: reserve now (rare)
            log.debug("queue ids ran out before the refill came back: reserving on the loop")
            self._queue_ids.extend(self.store.reserve_queue_ids(QUEUE_ID_BLOCK))
        qid = self._queue_ids.popleft()
        if len(self._queue_ids) < QUEUE_ID_BLOCK // 2 and not self._reserving:
            self._reserving = True
            self.read(_reserve_ids, QUEUE_ID_BLOCK, done=self._reserved)
        return qid

    def _reserved(self, ids, exc: BaseException | None) -> None:
        self._reserving = False
        if exc is not None:
            log.warning("reserving queue ids failed (retried at the next declare): %s", exc)
            return
        self._queue_ids.extend(ids)

    def queue_deleted(self, q) -> None:
        if q.store_id is None:
            return
        dropped = self.on_queue_dropped
        vhost, name = q.vhost, q.name

        def delete(s):
            s.delete_queue(vhost, name)
            if dropped is not None:
                dropped(vhost, name)  # a cluster node: the queue's lease goes too (writer thread)
        self.write(delete)

    def binding_added(self, vhost, source, dest_type, dest, routing_key, arguments) -> None:
        args = encode_args(arguments)
        self.write(lambda s: s.put_binding(vhost, source, dest, dest_type, routing_key, args))

    def binding_removed(self, vhost, source, dest_type, dest, routing_key, arguments) -> None:
        args = encode_args(arguments)
        self.write(lambda s: s.delete_binding(vhost, source, dest, dest_type, routing_key, args))

    # policies and operator policies (core/policies.py)
    def policy_set(self, policy) -> None:
        kind, vhost, name, value = policy.kind, policy.vhost, policy.name, json.dumps(policy.value())
        self.write(lambda s: sql_policies.put_policy(s, kind, vhost, name, value))

    def policy_cleared(self, kind: str, vhost: str, name: str) -> None:
        self.write(lambda s: sql_policies.delete_policy(s, kind, vhost, name))

    # topic permissions (core/permissions.py), vhost and user limits (core/limits.py)
    def topic_permission_set(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        self.write(lambda s: limits_store.put_topic_permission(s, user, vhost, exchange, write, read))

    def topic_permission_cleared(self, user: str, vhost: str, exchange: str) -> None:
        self.write(lambda s: limits_store.delete_topic_permission(s, user, vhost, exchange))

    def vhost_limit_set(self, vhost: str, name: str, value: int) -> None:
        self.write(lambda s: limits_store.put_vhost_limit(s, vhost, name, value))

    def vhost_limit_cleared(self, vhost: str, name: str) -> None:
        self.write(lambda s: limits_store.delete_vhost_limit(s, vhost, name))

    def user_limit_set(self, user: str, name: str, value: int) -> None:
        self.write(lambda s: limits_store.put_user_limit(s, user, name, value))

    def user_limit_cleared(self, user: str, name: str) -> None:
        self.write(lambda s: limits_store.delete_user_limit(s, user, name))
