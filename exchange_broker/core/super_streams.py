"""Super streams: growing one. What an ``x-super-stream`` exchange is, checks and does when it is
declared or deleted (its N partition stream queues) is the exchange type's, in
``routing/super_stream.py``; this module adds the one operation that is not a declaration:

* Growing adds empty partitions ``name-N .. name-(M-1)`` and routes by ``hash mod M`` from then on
  (the admin API's ``PUT /api/super-streams/{vhost}/{name}`` or ``exchange-broker admin
  super-stream grow``): a key may now land on another partition than its earlier messages, so
  per-key order holds within each partition but not across the change (keys whose partition
  changed start a new ordered history on the new one). Shrinking is refused.

Everything is an ordinary durable definition (exchange, queues, bindings), so a restart recovers
it with no code of its own. Synchronous domain logic, like the rest of ``core/``.
"""

from __future__ import annotations

from routing.super_stream import (MAX_PARTITIONS, PARTITIONS_ARG, X_SUPER_STREAM, check_partitions,
                                  create_partitions, partition_name, partitions)

from exchange_broker.protocol.errors import AMQPError

__all__ = ["grow", "partition_name", "partitions"]


def grow(vhost, name: str, count: int):
    """Raise a super stream's partition count (new partitions start empty); returns the exchange.
    ValueError (with the reason) for a missing super stream or a count that is not larger."""
    ex = vhost.exchanges.get(name)
    if ex is None or ex.type != X_SUPER_STREAM:
        raise LookupError(f"no super stream '{name}' in vhost '{vhost.name}'")
    if isinstance(count, bool) or not isinstance(count, int) or \
            not ex.index.partitions < count <= MAX_PARTITIONS:
        raise ValueError(f"'partitions' must be an integer above the current {ex.index.partitions} "
                         f"and at most {MAX_PARTITIONS} (partitions are never removed)")
    old = ex.index.partitions
    try:
        check_partitions(vhost, name, ex.arguments, old, count)
    except AMQPError as err:  # the retention arguments, refused as a stream declaration would
        raise ValueError(err.text) from None
    ex.arguments = {**ex.arguments, PARTITIONS_ARG: count}
    ex.index.partitions = count
    vhost.broker.durability.exchange_declared(ex)  # the stored definition's x-partitions
    create_partitions(vhost, ex, old)
    return ex
