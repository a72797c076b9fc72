"""Exchange type ``x-super-stream``: a partitioned stream's entry point.

An exchange of this type is declared (durable, not auto-delete) with ``x-partitions: N`` and owns
N durable stream queues ``name-0 .. name-(N-1)``, created with it (:meth:`SuperStreamType.created`)
and deleted with it (RabbitMQ's ``delete_super_stream``), each bound with the partition's number as
its binding key (``"0"``, ``"1"``, ...), as RabbitMQ binds a super stream's partitions. The stream
retention arguments of the declaration (``x-max-length-bytes``, ``x-max-age``,
``x-stream-max-segment-size-bytes``) are passed on to every partition. Declaring again with the same
``x-partitions`` is a no-op, another value is refused (growing is ``core/super_streams.grow``).
A publish goes to exactly one partition:

* the one named by an ``x-partition`` header: its number (an integer, or a string of digits) or
  the partition queue's name (``orders-2``);
* otherwise partition ``murmur3_32(UTF-8 routing key, seed 104729) mod N``: the hash and seed
  RabbitMQ's stream clients use for super streams ("hash" routing strategy), unsigned, so a key
  lands on the same partition here, on every node, after every restart, and as a RabbitMQ
  stream client would place it.

Pure: no IO; the index only maps partition numbers to their bound destinations, and the
partitions are made through the virtual host's :class:`~routing.types.Definitions`.
"""
from __future__ import annotations

import mmh3

from .base import BindingKey, BindingTable, Dest
from .types import Definitions, ExchangeType, InvalidExchangeArguments

X_SUPER_STREAM = "x-super-stream"
PARTITIONS_ARG = "x-partitions"
PARTITION_HEADER = "x-partition"
MAX_PARTITIONS = 1024
HASH_SEED = 104729   # RabbitMQ stream clients' murmur3 seed for super stream routing
RETENTION_ARGS = ("x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes")


def partition_of(routing_key: str, partitions: int) -> int:
    """The partition a routing key goes to (stable: murmur3 32-bit, unsigned, seed 104729)."""
    # bytes, never str: mmh3 crashes on a str holding a lone surrogate (JSON can carry one)
    return mmh3.hash(routing_key.encode("utf-8", "surrogatepass"), HASH_SEED, signed=False) % partitions


def partition_count(arguments: dict | None) -> int:
    """``x-partitions`` of a declaration, checked: an integer from 1 to MAX_PARTITIONS."""
    value = (arguments or {}).get(PARTITIONS_ARG)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if value is None:
        raise InvalidExchangeArguments(f"invalid arg '{PARTITIONS_ARG}': required for exchange type "
                                       f"'{X_SUPER_STREAM}' (the number of partitions)")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise InvalidExchangeArguments(f"invalid arg '{PARTITIONS_ARG}': expected an integer from 1 "
                                       f"to {MAX_PARTITIONS}, got {value!r}")
    return value


class SuperStreamIndex(BindingTable):
    """Partition number -> destination; ``match`` picks one partition per message."""

    wants_headers = True   # the core passes message headers (for x-partition) to ``match``

    def __init__(self, partitions: int) -> None:
        super().__init__()
        self.partitions = partitions
        self.by_number: dict[int, list[Dest]] = {}

    def bind(self, dest: Dest, routing_key: str, arguments: dict | None = None) -> bool:
        if not routing_key.isdigit():
            raise ValueError(f"a super stream partition is bound with its number as binding key, "
                             f"not {routing_key!r}")
        return super().bind(dest, routing_key, arguments)

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        found = self.by_number.setdefault(int(routing_key), [])
        if dest not in found:
            found.append(dest)

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        n = int(routing_key)
        found = [d for d in self.by_number.get(n, []) if d != dest]
        if found:
            self.by_number[n] = found
        else:
            self.by_number.pop(n, None)

    def partition_for(self, routing_key: str, headers: dict | None) -> int | None:
        """The partition number a message goes to (None: an x-partition naming none)."""
        if headers:
            chosen = headers.get(PARTITION_HEADER)
            if chosen is not None:
                return self._named(chosen)
        return partition_of(routing_key, self.partitions)

    def _named(self, value) -> int | None:
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        if isinstance(value, bool):
            return None
        if isinstance(value, str):
            if not value.isdigit():
                for number, dests in self.by_number.items():
                    if any(d[1] == value for d in dests if isinstance(d, tuple) and len(d) == 2):
                        return number
                return None
            value = int(value)
        if isinstance(value, int) and 0 <= value < self.partitions:
            return value
        return None

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        number = self.partition_for(routing_key, headers)
        return self.by_number.get(number, []) if number is not None else []


class SuperStreamType(ExchangeType):
    name = X_SUPER_STREAM

    def make_index(self, arguments: dict | None, registry: dict[str, ExchangeType]) -> BindingTable:
        return SuperStreamIndex(partition_count(arguments))

    def check_declare(self, defs: Definitions, name: str, durable: bool, auto_delete: bool,
                      arguments: dict, existing) -> None:
        desc = defs.describe("exchange", name)
        try:
            n = partition_count(arguments)
        except InvalidExchangeArguments as exc:
            raise InvalidExchangeArguments(str(exc).replace(f"'{PARTITIONS_ARG}'",
                                                            f"'{PARTITIONS_ARG}' for {desc}", 1)) from None
        if existing is not None:
            if existing.type == X_SUPER_STREAM and n != existing.index.partitions:
                raise InvalidExchangeArguments(
                    f"inequivalent arg '{PARTITIONS_ARG}' for {desc}: received '{n}' but current is "
                    f"'{existing.index.partitions}' (raise it with the admin API: PUT "
                    f"/api/super-streams/{{vhost}}/{{name}})")
            return
        for bad, prop in ((not durable, "non-durable"), (auto_delete, "auto-delete")):
            if bad:
                raise InvalidExchangeArguments(f"invalid property '{prop}' for {desc}: a super stream "
                                               f"is durable and not auto-delete")
        check_partitions(defs, name, arguments, 0, n)

    def created(self, defs: Definitions, exchange) -> None:
        create_partitions(defs, exchange)

    def deleting(self, defs: Definitions, exchange) -> None:
        for q in partitions(defs, exchange):
            if q is not None:
                defs.remove_queue(q)


# -- the partitions ---------------------------------------------------------------------------------
def partition_name(stream: str, number: int) -> str:
    return f"{stream}-{number}"


def partition_arguments(arguments: dict) -> dict:
    """The queue arguments of every partition: a stream, with the declaration's retention."""
    out = {"x-queue-type": "stream"}
    out.update({k: arguments[k] for k in RETENTION_ARGS if k in arguments})
    return out


def check_partitions(defs: Definitions, name: str, arguments: dict, start: int, end: int) -> None:
    """Partitions ``start .. end - 1`` can be made: no other queue has their names (one that can
    serve as the partition is adopted) and the retention arguments are valid for a stream."""
    qargs = partition_arguments(arguments)
    for i in range(start, end):
        pname = partition_name(name, i)
        q = defs.queues.get(pname)
        if q is not None and not _adoptable(q, qargs):
            raise InvalidExchangeArguments(
                f"cannot create partition {defs.describe('queue', pname)} of super stream '{name}': "
                f"a queue of that name exists (and is not a durable stream with these retention "
                f"arguments)")
    defs.check_queue(partition_name(name, start), qargs)


def _adoptable(q, qargs: dict) -> bool:
    """An existing queue that can serve as the partition (e.g. definitions imported in another
    order): a durable stream whose retention arguments are those of the super stream."""
    return getattr(q, "queue_type", None) == "stream" and q.durable and all(
        _text(q.arguments.get(k)) == _text(qargs.get(k)) for k in RETENTION_ARGS)


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def create_partitions(defs: Definitions, exchange, start: int = 0) -> None:
    """Declare and bind partitions ``start .. x-partitions - 1`` of a super stream exchange."""
    qargs = partition_arguments(exchange.arguments)
    for i in range(start, exchange.index.partitions):
        pname = partition_name(exchange.name, i)
        defs.declare_queue(pname, durable=True, arguments=dict(qargs))
        defs.bind(exchange.name, "queue", pname, str(i), {}, 40, 10)


def partitions(defs: Definitions, exchange) -> list:
    """The partition queues of a super stream exchange, by number (None: a deleted partition)."""
    out = []
    for i in range(exchange.index.partitions):
        q = None
        for kind, qname in exchange.index.by_number.get(i, ()):
            if kind == "q" and qname in defs.queues:
                q = defs.queues[qname]
                break
        out.append(q)
    return out
