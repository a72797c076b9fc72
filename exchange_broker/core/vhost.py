"""A virtual host: its exchanges, queues and bindings, with RabbitMQ's declaration rules.

Every method here is synchronous domain logic. It raises AMQPError with the
reply code RabbitMQ uses and tells ``broker.durability`` what must be stored.
"""

from __future__ import annotations

import routing

from exchange_broker.core.exchange import Exchange, make_index
from exchange_broker.core.limits import check_queue_count
from exchange_broker.core.names import check_name, describe, generated
from exchange_broker.core.policies import VHostPolicies
from exchange_broker.protocol.constants import (ACCESS_REFUSED, COMMAND_INVALID, NOT_FOUND, PRECONDITION_FAILED,
                                 RESOURCE_LOCKED)
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.core.queue import QueueType

BUILTIN_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                     ("amq.headers", "headers"), ("amq.match", "headers"),
                     ("amq.rabbitmq.trace", "topic"))  # the firehose (core/tracing.py): internal

# Queue arguments whose values must match on redeclaration (RabbitMQ's equivalence list).
QUEUE_EQUIVALENT_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-expires",
                         "x-max-length", "x-max-length-bytes", "x-max-priority", "x-message-ttl",
                         "x-overflow", "x-queue-type", "x-single-active-consumer", "x-max-age",
                         "x-message-deduplication")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _val(value) -> str:
    """rabbit_misc:val/1: 'none' for a missing argument, else the value and its AMQP type."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "signedint" if -2 ** 31 <= value < 2 ** 31 else "long"
    elif isinstance(value, float):
        kind = "double"
    elif isinstance(value, dict):
        kind = "table"
    elif isinstance(value, (list, tuple)):
        kind = "array"
    else:
        kind = "longstr"
    return f"the value '{_fmt(value)}' of type '{kind}'"


def _arg_mismatch(got, have) -> str:
    """'received X but current is Y' as RabbitMQ words it for x-arguments."""
    if got is None or have is None:
        return f"received {_val(got)} but current is {_val(have)}"
    return f"received '{_fmt(got)}' but current is '{_fmt(have)}'"


def _norm(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _type_class(value) -> str:
    """RabbitMQ's rabbit_misc:type_class: every integer type is one class, floats another."""
    if isinstance(value, bool):
        return "bool"
    return "int" if isinstance(value, int) else "float" if isinstance(value, float) else type(value).__name__


def _same_arg(got, have) -> bool:
    """assert_args_equivalence: the same value in the same type class (1000.0 is not 1000)."""
    return got == have and _type_class(got) == _type_class(have)


def with_default_type(default: str, durable: bool, exclusive: bool, auto_delete: bool) -> str:
    """The x-queue-type a declaration without one gets in a vhost whose default queue type is
    ``default`` (RabbitMQ's augment_declare_args): a queue the type cannot be (quorum and stream
    queues are durable, not exclusive, not auto-delete) falls back to classic."""
    if default != "classic" and (not durable or exclusive or auto_delete):
        return "classic"
    return default


class VHost:
    def __init__(self, broker, name: str) -> None:
        self.broker = broker
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueType] = {}
        self.headers_exchanges = 0
        self.property_exchanges = 0  # routing reads message properties (x-consistent-hash hash-property)
        self.policies = VHostPolicies(self)  # policies and operator policies (core/policies.py)
        self.default_queue_type: str | None = None  # RabbitMQ's default_queue_type (None: classic)
        default = Exchange(name, "", "direct", durable=True,
                           index=routing.DefaultIndex(self.queues.__contains__))
        self.exchanges[""] = default
        for xname, xtype in BUILTIN_EXCHANGES:
            self._add_exchange(Exchange(name, xname, xtype, durable=True,
                                        internal=xname == "amq.rabbitmq.trace"))
        self.tracing = False  # the firehose is on (core/tracing.py)

    def _add_exchange(self, ex: Exchange) -> None:
        self.exchanges[ex.name] = ex
        if ex.index.wants_headers:  # headers (also as x-delayed-type), a super stream's x-partition
            self.headers_exchanges += 1
        if getattr(ex.index, "wants_properties", False):
            self.property_exchanges += 1
        if hasattr(ex.index, "attach"):  # x-local-random: sees the queues' types and locality
            ex.index.attach(self.queues)

    def describe(self, kind: str, name: str) -> str:
        return describe(kind, name, self.name)

    # -- routing -------------------------------------------------------------------------------
    def route(self, exchange: Exchange, routing_key: str, headers: dict | None) -> list[QueueType]:
        queues = self.queues
        if exchange.name == "":
            q = queues.get(routing_key)
            return [q] if q is not None else []
        names = routing.route(self.exchanges.get, exchange.name, routing_key, headers)
        return [queues[n] for n in names if n in queues]

    # -- exchanges -----------------------------------------------------------------------------
    def get_exchange(self, name: str, class_id: int = 0, method_id: int = 0) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise AMQPError(NOT_FOUND, f"no {self.describe('exchange', name)}", class_id, method_id,
                            hard=False)
        return ex

    def declare_exchange(self, name: str, type: str, passive: bool = False, durable: bool = False,
                         auto_delete: bool = False, internal: bool = False,
                         arguments: dict | None = None) -> Exchange:
        cid, mid = 40, 10
        arguments = arguments or {}
        if name == "":  # RabbitMQ refuses even a passive declare of the default exchange
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange", cid, mid,
                            hard=False)
        if passive:
            return self.get_exchange(name, cid, mid)
        check_name("exchange", name, cid, mid)
        existing = self.exchanges.get(name)
        if name.startswith("amq.") and existing is None:
            raise AMQPError(ACCESS_REFUSED, f"exchange name '{name}' contains reserved "
                            f"prefix 'amq.*'", cid, mid, hard=False)
        kind = routing.TYPES.get(type)
        if kind is None:
            raise AMQPError(COMMAND_INVALID, f"unknown exchange type '{type}'", cid, mid, hard=True)
        if not kind.in_leaders_cluster and self.broker.definitions_shared and existing is None:
            raise AMQPError(PRECONDITION_FAILED, f"exchange type '{type}' is not available in a cluster "
                            f"with per-queue leaders (--cluster-mode leaders)", cid, mid, hard=False)
        try:  # what the type itself refuses (a super stream's x-partitions, durability, partitions)
            kind.check_declare(self, name, durable, auto_delete, arguments, existing)
        except routing.InvalidExchangeArguments as exc:
            raise AMQPError(PRECONDITION_FAILED, str(exc), cid, mid, hard=False) from None
        if existing is not None:
            desc = self.describe("exchange", name)
            for field, got, have in (("type", type, existing.type), ("durable", durable, existing.durable),
                                     ("auto_delete", auto_delete, existing.auto_delete),
                                     ("internal", internal, existing.internal)):
                if got != have:
                    raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg '{field}' for {desc}: "
                                    f"received '{_fmt(got)}' but current is '{_fmt(have)}'", cid, mid,
                                    hard=False)
            got = _norm(arguments.get("alternate-exchange"))
            have = _norm(existing.arguments.get("alternate-exchange"))
            if got != have:
                raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg 'alternate-exchange' for {desc}: "
                                f"{_arg_mismatch(got, have)}", cid, mid, hard=False)
            return existing
        index = make_index(type, arguments)
        ex = Exchange(self.name, name, type, durable, auto_delete, internal, arguments, index=index)
        self._add_exchange(ex)
        self.policies.apply_exchange(ex)
        if durable or self.broker.definitions_shared:
            self.broker.durability.exchange_declared(ex)
        kind.created(self, ex)  # what the type owns (a super stream's partitions)
        if self.broker.events is not None:
            self.broker.events.exchange_created(ex)
        return ex

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        cid, mid = 40, 20
        if name == "" or name.startswith("amq."):
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange"
                            if name == "" else f"deletion of system {self.describe('exchange', name)} "
                            f"not allowed", cid, mid, hard=False)
        ex = self.exchanges.get(name)
        if ex is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        if if_unused and len(ex.index):
            raise AMQPError(PRECONDITION_FAILED, f"{self.describe('exchange', name)} in use", cid, mid,
                            hard=False)
        self._remove_exchange(ex)

    def _remove_exchange(self, ex: Exchange, store: bool = True) -> None:
        """``store`` False: the deletion was written elsewhere (``remove_queue``); what the type
        owns (a super stream's partitions) then goes with the definitions that follow."""
        kind = routing.TYPES.get(ex.type)
        if kind is not None and store:
            kind.deleting(self, ex)  # what the type owns goes too (a super stream's partitions)
        del self.exchanges[ex.name]
        if ex.index.wants_headers:
            self.headers_exchanges -= 1
        if getattr(ex.index, "wants_properties", False):
            self.property_exchanges -= 1
        dest = ("e", ex.name)
        for other in list(self.exchanges.values()):
            if other.index.has_destination(dest):
                other.index.remove_destination(dest)
                self._maybe_auto_delete(other, store)
        if store and (ex.durable or self.broker.definitions_shared):
            self.broker.durability.exchange_deleted(ex)
        self.broker.on_exchange_deleted(ex)
        if self.broker.events is not None:
            self.broker.events.exchange_deleted(ex)

    def _maybe_auto_delete(self, ex: Exchange, store: bool = True) -> None:
        if ex.auto_delete and not len(ex.index) and ex.name in self.exchanges:
            self._remove_exchange(ex, store)

    def bindings(self) -> list[tuple[str, str, str, str, dict]]:
        """All bindings: (source, destination_type, destination, routing_key, arguments)."""
        out = []
        for ex in self.exchanges.values():
            if ex.name == "":
                continue
            for (kind, dname), rk, args in ex.index.bindings():
                out.append((ex.name, "queue" if kind == "q" else "exchange", dname, rk, args))
        return out

    def bind(self, source: str, dest_type: str, dest: str, routing_key: str, arguments: dict | None,
             class_id: int, method_id: int, owner: object = None) -> None:
        arguments = arguments or {}
        if source == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange",
                            class_id, method_id, hard=False)
        if dest_type == "queue":
            self.get_queue(dest, owner, class_id, method_id)
        else:
            self.get_exchange(dest, class_id, method_id)
        ex = self.get_exchange(source, class_id, method_id)
        key = ("q" if dest_type == "queue" else "e", dest)
        try:
            added = ex.index.bind(key, routing_key, arguments)
        except ValueError as exc:
            raise AMQPError(PRECONDITION_FAILED, f"invalid binding arguments: {exc}", class_id,
                            method_id, hard=False) from None
        if added and self._durable_binding(ex, dest_type, dest):
            self.broker.durability.binding_added(self.name, source, dest_type, dest, routing_key, arguments)
        if added and self.broker.events is not None:
            self.broker.events.binding(True, self.name, source, dest_type, dest, routing_key, arguments, owner)

    def unbind(self, source: str, dest_type: str, dest: str, routing_key: str, arguments: dict | None,
               class_id: int, method_id: int, owner: object = None) -> None:
        arguments = arguments or {}
        if source == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange",
                            class_id, method_id, hard=False)
        ex = self.exchanges.get(source)
        target = self.queues.get(dest) if dest_type == "queue" else self.exchanges.get(dest)
        if ex is None or target is None:
            return  # RabbitMQ: unbinding a binding that does not exist succeeds
        key = ("q" if dest_type == "queue" else "e", dest)
        if dest_type == "queue" and target.exclusive_owner not in (None, owner):
            if not any(d == key and rk == routing_key and a == arguments
                       for d, rk, a in ex.index.bindings()):
                return
            self.get_queue(dest, owner, class_id, method_id)  # 405 for an existing binding
        try:
            removed = ex.index.unbind(key, routing_key, arguments)
        except ValueError:
            removed = False
        if removed:
            if self.broker.events is not None:
                self.broker.events.binding(False, self.name, source, dest_type, dest, routing_key, arguments,
                                           owner)
            if self._durable_binding(ex, dest_type, dest):
                self.broker.durability.binding_removed(self.name, source, dest_type, dest, routing_key,
                                                       arguments)
            self._maybe_auto_delete(ex)

    def _durable_binding(self, ex: Exchange, dest_type: str, dest: str) -> bool:
        """A binding the store keeps: both ends durable (or, in a cluster with per-queue leaders,
        every binding: ``Broker.definitions_shared``)."""
        shared = self.broker.definitions_shared
        if not (ex.durable or shared):
            return False
        if dest_type == "queue":
            q = self.queues.get(dest)
            return q is not None and (q.durable or shared)
        d = self.exchanges.get(dest)
        return d is not None and (d.durable or shared)

    # -- queues ----------------------------------------------------------------------------------
    def get_queue(self, name: str, owner: object = None, class_id: int = 0, method_id: int = 0) -> QueueType:
        q = self.queues.get(name)
        if q is None:
            raise AMQPError(NOT_FOUND, f"no {self.describe('queue', name)}", class_id, method_id,
                            hard=False)
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name, class_id, method_id)
        return q

    def _locked(self, name: str, class_id: int, method_id: int) -> AMQPError:
        return AMQPError(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked "
                         f"{self.describe('queue', name)}. It could be originally declared on "
                         f"another connection or the exclusive property value does not match "
                         f"that of the original declaration.", class_id, method_id, hard=False)

    def check_queue(self, name: str, arguments: dict) -> None:
        """What declaring a durable queue ``name`` with ``arguments`` would refuse (the queue
        object is made and dropped; nothing is stored): an exchange type's check before it makes
        queues of its own (``routing.types.Definitions``)."""
        self.broker.make_queue(self, name, True, None, False, arguments)

    def declare_queue(self, name: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None, owner: object = None,
                      server_name: str | None = None) -> QueueType:
        cid, mid = 50, 10
        arguments = arguments or {}
        if passive:
            q = self.get_queue(name, owner, cid, mid)
            q.touch()  # RabbitMQ: a passive declare also restarts the x-expires countdown
            return q
        server_named = name == ""
        if server_named:
            name = server_name or generated("amq.gen-")  # server_name: checked for permission
        check_name("queue", name, cid, mid)
        if self.default_queue_type is not None and _norm(arguments.get("x-queue-type")) in (None, ""):
            arguments = {**arguments, "x-queue-type": with_default_type(
                self.default_queue_type, durable, exclusive, auto_delete)}
        existing = self.queues.get(name)
        if name.startswith("amq.") and not server_named:  # RabbitMQ: even when it exists
            raise AMQPError(ACCESS_REFUSED, f"queue name '{name}' contains reserved "
                            f"prefix 'amq.*'", cid, mid, hard=False)
        if existing is not None:
            if existing.exclusive_owner is not (owner if exclusive else None):
                raise self._locked(name, cid, mid)  # strict: exclusive flag and owner must match
            desc = self.describe("queue", name)
            for field, got, have in (("durable", durable, existing.durable),
                                     ("exclusive", exclusive, existing.exclusive),
                                     ("auto_delete", auto_delete, existing.auto_delete)):
                if got != have:
                    raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg '{field}' for {desc}: "
                                    f"received '{_fmt(got)}' but current is '{_fmt(have)}'", cid, mid,
                                    hard=False)
            for arg in QUEUE_EQUIVALENT_ARGS:
                got, have = _norm(arguments.get(arg)), _norm(existing.arguments.get(arg))
                if not _same_arg(got, have) and not (arg == "x-queue-type" and got in (None, "classic")
                                        and have in (None, "classic")):  # values may be unhashable
                    raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg '{arg}' for {desc}: "
                                    f"{_arg_mismatch(got, have)}", cid, mid, hard=False)
            existing.touch()
            return existing
        if self.broker.vhost_limits:
            check_queue_count(self.broker, self, name)  # max-queues (406)
        q = self.broker.make_queue(self, name, durable, owner if exclusive else None, auto_delete,
                                   arguments)
        if self.broker.place_queue is not None:  # a cluster may have another node lead it
            q = self.broker.place_queue(self, q)
        self.queues[name] = q
        self.policies.apply_queue(q)
        if durable or self.broker.definitions_shared:
            self.broker.durability.queue_declared(q)
        if self.broker.events is not None:
            self.broker.events.queue_created(q, owner)
        return q

    def delete_queue(self, name: str, if_unused: bool = False, if_empty: bool = False,
                     owner: object = None) -> int:
        cid, mid = 50, 40
        q = self.queues.get(name)
        if q is None:
            return 0  # RabbitMQ: deleting a missing queue succeeds with count 0
        self.get_queue(name, owner, cid, mid)
        if if_unused and q.consumers:
            raise AMQPError(PRECONDITION_FAILED, f"{self.describe('queue', name)} in use", cid, mid,
                            hard=False)
        if if_empty and q.message_count:
            raise AMQPError(PRECONDITION_FAILED, f"{self.describe('queue', name)} not empty", cid, mid,
                            hard=False)
        return self.remove_queue(q)

    def remove_queue(self, q: QueueType, store: bool = True) -> int:
        """Remove ``q`` (and exchanges auto-deleted with it). ``store`` False: nothing is written,
        the deletion was written elsewhere (a cluster's placeholder, once the queue's leader deleted
        it: ``cluster/remote.py``)."""
        if q.deleted:
            return 0
        count = q.message_count
        q.deleted = True
        self.queues.pop(q.name, None)
        dest = ("q", q.name)
        for ex in list(self.exchanges.values()):
            if ex.index.has_destination(dest):
                ex.index.remove_destination(dest)
                self._maybe_auto_delete(ex, store)
        self.broker.on_queue_deleted(q)
        if store and (q.durable or self.broker.definitions_shared):
            self.broker.durability.queue_deleted(q)
        if self.broker.events is not None:
            self.broker.events.queue_deleted(q)
        q.on_deleted()
        return count

    def purge_queue(self, name: str, owner: object = None) -> int:
        q = self.get_queue(name, owner, 50, 30)
        purged = q.purge()
        self.broker.durability.messages_purged(q, purged)
        return len(purged)
