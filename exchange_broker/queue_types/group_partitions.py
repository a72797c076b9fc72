"""The parts of a consumer group that touch one partition: which member reads which partition
(:func:`assign`), and the :class:`PartitionReader` through which a partition's stream delivers to
the member that owns it, adding the ``x-stream-partition`` header.

A ``PartitionReader`` is an ordinary consumer of the partition's stream queue as far as the
stream is concerned (``core/ports.Consumer``): the stream keeps its position, reads older offsets
back from the store, wakes it on appends and records its acked offsets under the group's name
(named-consumer offsets, stored durably). Deliveries go out through the member's own sink, so
delivery tags, prefetch and acks are those of the member's channel.
"""

from __future__ import annotations

import struct

from exchange_broker.protocol import codec
from exchange_broker.queue_types.stream_delivery import _Delivery

PARTITION_HEADER = "x-stream-partition"
_KEY = codec.short_str(PARTITION_HEADER)
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


def assign(partitions: int, members: list, current: dict) -> dict:
    """Partition number -> member (None without members): each partition to exactly one member,
    counts differing by at most one, and as few moves from ``current`` as that allows (a member
    keeps what it holds up to its share; the rest goes to the least loaded, in join order)."""
    if not members:
        return {p: None for p in range(partitions)}
    base, extra = divmod(partitions, len(members))
    order = {m: i for i, m in enumerate(members)}
    held = {m: 0 for m in members}
    for p in range(partitions):
        if current.get(p) in held:
            held[current[p]] += 1
    # the members allowed one more than ``base``: those holding most now (fewest moves), then join order
    bigger = sorted(members, key=lambda m: (-held[m], order[m]))[:extra]
    cap = {m: base + (1 if m in bigger else 0) for m in members}
    out: dict = {}
    count = {m: 0 for m in members}
    for p in range(partitions):
        owner = current.get(p)
        if owner in cap and count[owner] < cap[owner]:
            out[p] = owner
            count[owner] += 1
    for p in range(partitions):
        if p not in out:
            owner = min((m for m in members if count[m] < cap[m]), key=lambda m: (count[m], order[m]))
            out[p] = owner
            count[owner] += 1
    return out


def with_partition_header(raw: bytes, number: int) -> bytes:
    """Raw properties (a stream delivery's: they have a headers table) with
    ``x-stream-partition: number`` (AMQP ``I``, signed 32-bit) appended to the headers."""
    flags, pos = codec.headers_offset(raw)
    entry = _KEY + b"I" + _I32.pack(number)
    if not flags & codec.FLAG_HEADERS:  # not expected (the offset header is always there)
        props = codec.parse_properties(raw)
        props["headers"] = {**(props.get("headers") or {}), PARTITION_HEADER: number}
        return codec.encode_properties(props)
    size = _U32.unpack_from(raw, pos)[0]
    end = pos + 4 + size
    return b"".join((raw[:pos], _U32.pack(size + len(entry)), raw[pos + 4:end], entry, raw[end:]))


class PartitionReader:
    """One member's subscription to one partition (a consumer of the partition's stream)."""

    __slots__ = ("member", "group", "number", "queue", "arguments", "active", "share", "reader")
    deliver_run = None  # one message at a time

    def __init__(self, member, group, number: int, queue, arguments: dict) -> None:
        self.member = member          # the member's own Consumer (connection/consumer.py)
        self.group = group
        self.number = number
        self.queue = queue            # the partition's StreamQueue
        self.arguments = arguments    # x-stream-offset and x-stream-consumer-name (the group)
        self.active = True            # False once revoked: the stream stops delivering to it
        self.share = member.prefetch  # at most this many unacked from this partition (fairness)
        self.reader = None            # the stream's Reader for it (set after add_consumer)

    # what the admin API shows for a queue's consumers
    tag = property(lambda self: self.member.tag)
    channel = property(lambda self: self.member.channel)
    prefetch = property(lambda self: self.member.prefetch)
    no_ack = False
    exclusive = False
    priority = 0

    @property
    def closed(self) -> bool:
        """Never: when the member's channel closes, its deliveries are handed back (the stream
        rewinds this reader to the first of them); the group then moves the partition."""
        return False

    @property
    def outstanding(self):
        return self.member.channel.unacked

    @property
    def inflight(self) -> int:
        r = self.reader
        return len(r.inflight) if r is not None else 0

    def can_take(self) -> bool:
        if not self.active or not self.member.can_take():
            return False
        r = self.reader
        if r is None:  # its first delivery, from inside the stream's add_consumer
            r = self.reader = self.queue.readers.get(self)
        return r is None or len(r.inflight) < self.share

    def deliver(self, msg) -> int:
        m = _Delivery(msg.exchange, msg.routing_key, with_partition_header(msg.properties, self.number),
                      msg.body, True, 0)
        m.seq = msg.seq
        m.created_ms = msg.created_ms
        m.queue = msg.queue
        return self.member.deliver(m)

    def queue_deleted(self) -> None:
        self.active = False
        self.group.partition_deleted(self.number)
