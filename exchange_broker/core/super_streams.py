"""Super streams: an exchange of type ``x-super-stream`` and the N stream queues it owns.

``exchange.declare(name, type="x-super-stream", durable=True, arguments={"x-partitions": N})``
creates the exchange and N durable stream queues ``name-0 .. name-(N-1)``, each bound with its
number as binding key (routing: ``routing/super_stream.py``). The stream retention arguments of
the declaration (``x-max-length-bytes``, ``x-max-age``, ``x-stream-max-segment-size-bytes``) are
passed on to every partition. Everything is an ordinary durable definition (exchange, queues,
bindings), so a restart recovers it with no code of its own.

* Declaring again with the same ``x-partitions`` is a no-op; another value is 406 (``x-partitions``
  is raised with :func:`grow`: the admin API's ``PUT /api/super-streams/{vhost}/{name}`` or
  ``exchange-broker admin super-stream grow``).
* Deleting the exchange deletes its partitions (RabbitMQ's ``delete_super_stream``).
* Growing adds empty partitions ``name-N .. name-(M-1)`` and routes by ``hash mod M`` from then on:
  a key may now land on another partition than its earlier messages, so per-key order holds
  within each partition but not across the change (keys whose partition changed start a new
  ordered history on the new one). Shrinking is refused.

Synchronous domain logic, like the rest of ``core/``.
"""

from __future__ import annotations

import routing
from routing.super_stream import MAX_PARTITIONS, PARTITIONS_ARG, X_SUPER_STREAM, partition_count

from exchange_broker.core.names import describe
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

RETENTION_ARGS = ("x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes")


def partition_name(stream: str, number: int) -> str:
    return f"{stream}-{number}"


def partition_arguments(arguments: dict) -> dict:
    """The queue arguments of every partition: a stream, with the declaration's retention."""
    out = {"x-queue-type": "stream"}
    out.update({k: arguments[k] for k in RETENTION_ARGS if k in arguments})
    return out


def _error(text: str, class_id: int = 40, method_id: int = 10) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, text, class_id, method_id, hard=False)


def count(arguments: dict, desc: str) -> int:
    """``x-partitions`` (406 when missing or not an integer from 1 to MAX_PARTITIONS)."""
    try:
        return partition_count(arguments)
    except routing.InvalidExchangeArguments as exc:
        text = str(exc).replace(f"'{PARTITIONS_ARG}'", f"'{PARTITIONS_ARG}' for {desc}", 1)
        raise _error(text) from None


def check_declare(vhost, name: str, durable: bool, auto_delete: bool, arguments: dict,
                  existing) -> None:
    """Before an exchange.declare of type x-super-stream changes anything: 406 for what cannot be."""
    desc = describe("exchange", name, vhost.name)
    n = count(arguments, desc)
    if existing is not None:
        if existing.type == X_SUPER_STREAM and n != existing.index.partitions:
            raise _error(f"inequivalent arg '{PARTITIONS_ARG}' for {desc}: received '{n}' but current "
                         f"is '{existing.index.partitions}' (raise it with the admin API: PUT "
                         f"/api/super-streams/{{vhost}}/{{name}})")
        return
    for bad, prop in ((not durable, "non-durable"), (auto_delete, "auto-delete")):
        if bad:
            raise _error(f"invalid property '{prop}' for {desc}: a super stream is durable and not "
                         f"auto-delete")
    _check_partitions(vhost, name, arguments, 0, n)


def _check_partitions(vhost, name: str, arguments: dict, start: int, end: int) -> None:
    qargs = partition_arguments(arguments)
    for i in range(start, end):
        pname = partition_name(name, i)
        q = vhost.queues.get(pname)
        if q is not None and not _adoptable(q, qargs):
            raise _error(f"cannot create partition {describe('queue', pname, vhost.name)} of super "
                         f"stream '{name}': a queue of that name exists (and is not a durable stream "
                         f"with these retention arguments)")
    # the retention arguments, checked as a stream declaration checks them (the object is dropped)
    vhost.broker.make_queue(vhost, partition_name(name, start), True, None, False, qargs)


def _adoptable(q, qargs: dict) -> bool:
    """An existing queue that can serve as the partition (e.g. definitions imported in another
    order): a durable stream whose retention arguments are those of the super stream."""
    return getattr(q, "queue_type", None) == "stream" and q.durable and all(
        _norm(q.arguments.get(k)) == _norm(qargs.get(k)) for k in RETENTION_ARGS)


def _norm(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def create_partitions(vhost, ex, start: int = 0) -> None:
    """Declare and bind partitions ``start .. x-partitions - 1`` of a super stream exchange."""
    qargs = partition_arguments(ex.arguments)
    for i in range(start, ex.index.partitions):
        pname = partition_name(ex.name, i)
        vhost.declare_queue(pname, durable=True, arguments=dict(qargs))
        vhost.bind(ex.name, "queue", pname, str(i), {}, 40, 10)


def grow(vhost, name: str, partitions: int):
    """Raise a super stream's partition count (new partitions start empty); returns the exchange.
    ValueError (with the reason) for a missing super stream or a count that is not larger."""
    ex = vhost.exchanges.get(name)
    if ex is None or ex.type != X_SUPER_STREAM:
        raise LookupError(f"no super stream '{name}' in vhost '{vhost.name}'")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or \
            not ex.index.partitions < partitions <= MAX_PARTITIONS:
        raise ValueError(f"'partitions' must be an integer above the current {ex.index.partitions} "
                         f"and at most {MAX_PARTITIONS} (partitions are never removed)")
    old = ex.index.partitions
    try:
        _check_partitions(vhost, name, ex.arguments, old, partitions)
    except AMQPError as err:
        raise ValueError(err.text) from None
    ex.arguments = {**ex.arguments, PARTITIONS_ARG: partitions}
    ex.index.partitions = partitions
    vhost.broker.durability.exchange_declared(ex)  # the stored definition's x-partitions
    create_partitions(vhost, ex, old)
    return ex


def partitions(vhost, ex) -> list:
    """The partition queues of a super stream exchange, by number (None: a deleted partition)."""
    out = []
    for i in range(ex.index.partitions):
        q = None
        for kind, qname in ex.index.by_number.get(i, ()):
            if kind == "q" and qname in vhost.queues:
                q = vhost.queues[qname]
                break
        out.append(q)
    return out


def delete_partitions(vhost, ex) -> None:
    """The exchange is being deleted: so are its partitions."""
    for q in partitions(vhost, ex):
        if q is not None:
            vhost.remove_queue(q)
