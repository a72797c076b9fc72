"""Consumer groups on super streams, over plain ``basic.consume``.

``basic.consume(queue=<super stream>, arguments={"x-consumer-group": "billing",
"x-stream-offset": "first"})`` joins the group ``billing`` of the super stream (the exchange of
type ``x-super-stream``, ``core/super_streams.py``). The broker assigns each partition to exactly
one member, spread evenly (``group_partitions.assign``: counts differ by at most one, and a
rebalance moves as few partitions as that allows), and delivers from it with the headers
``x-stream-partition`` (the partition's number) and ``x-stream-offset``.

* Rebalance on join, ``basic.cancel``, channel or connection close. A partition taken from a
  member is handed to its new owner only once the old owner's deliveries from it are settled:
  acked, or handed back by closing the channel (or ``basic.recover``). So no offset is ever out
  at two members at once, and a key's messages (one partition) are processed in order.
  A member that was cancelled keeps its channel's unacked deliveries, as AMQP has it: its
  partitions move when it acks them or closes the channel.
* Acks advance the group's offset per partition: the last offset of the acked prefix of the
  deliveries, stored as the named-consumer offset ``<group>`` of the partition's stream
  (``stream_offsets``; written at most every 0.2 s, and at once when a member leaves). A
  partition's reading starts after the stored offset; only a partition the group never acked
  starts at the member's ``x-stream-offset`` (default ``next``). The new owner of a moved
  partition starts at the first offset its old owner did not ack. Two groups (two names) read
  independently.
* The member needs ``basic.qos`` (a per-consumer prefetch, as for any stream), manual acks; its
  prefetch is shared fairly between its partitions.
* Deleting a partition (or the super stream) cancels the groups' members (``basic.cancel``).

State lives per broker (``groups_of``); the admin API reads it with :func:`describe`.
"""

from __future__ import annotations

import weakref

import routing

from exchange_broker.core import permissions as perms
from exchange_broker.core import super_streams
from exchange_broker.core.names import describe as describe_name
from exchange_broker.protocol.constants import NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.group_partitions import PartitionReader, assign
from exchange_broker.queue_types.stream_args import CONSUMER_NAME_ARG, _norm, parse_offset_spec

GROUP_ARG = "x-consumer-group"

_REGISTRIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def groups_of(broker) -> dict:
    """(vhost, super stream, group) -> ConsumerGroup, for one broker."""
    found = _REGISTRIES.get(broker)
    if found is None:
        found = _REGISTRIES[broker] = {}
    return found


class Slot:
    """One partition of a group: its owner, the reader delivering to it, those still draining."""

    __slots__ = ("number", "queue", "owner", "reader", "draining", "resume")

    def __init__(self, number: int, queue) -> None:
        self.number = number
        self.queue = queue            # the partition's StreamQueue (None once deleted)
        self.owner = None             # the member (Consumer) it is assigned to
        self.reader: PartitionReader | None = None   # the owner's, once handed over
        self.draining: list[PartitionReader] = []    # previous owners' readers with unsettled deliveries
        self.resume: int | None = None  # the first offset not acked by the last reader (this run)


class ConsumerGroup:
    """A group's members and partitions; it is the ``queue`` of its members' consumers (the
    channel calls ``dispatch`` after their acks and ``remove_consumer`` on cancel)."""

    wants_dispatch = True
    deleted = False

    def __init__(self, broker, vhost: str, stream: str, name: str, queues: list) -> None:
        self.broker = broker
        self.vhost = vhost
        self.name = stream            # what channel code and the admin API show as the "queue"
        self.group = name
        self.consumers: list = []     # the members, in join order
        self.slots = [Slot(i, q) for i, q in enumerate(queues)]
        self._turn = 0

    # -- the queue-like interface the channel uses ---------------------------------------------------
    def check_consume(self, channel, method) -> None:
        pass  # checked by find_group before the group was found or made

    def add_consumer(self, member) -> None:
        self.consumers.append(member)
        self.rebalance()

    def remove_consumer(self, member) -> None:
        try:
            self.consumers.remove(member)
        except ValueError:
            return
        self.rebalance()
        self._forget_if_idle()

    def dispatch(self) -> None:
        """After acks (or a recover, a close): settle draining readers, hand partitions over,
        deliver (the partitions in turn, so none starves the others of the members' prefetch)."""
        slots = [s for s in self.slots if s.queue is not None]
        if not slots:
            return
        self._turn = (self._turn + 1) % len(slots)
        for s in slots[self._turn:] + slots[:self._turn]:
            s.queue.dispatch()  # the stream reconciles acks (stores the offsets) and pumps
        self._settle_draining()
        self._forget_if_idle()

    # -- assignment ----------------------------------------------------------------------------------
    def rebalance(self) -> None:
        live = [s for s in self.slots if s.queue is not None]
        target = assign(len(live), self.consumers, {i: s.owner for i, s in enumerate(live)})
        for i, s in enumerate(live):
            owner = target[i]
            if s.owner is owner:
                continue
            if s.reader is not None:
                r, s.reader = s.reader, None
                r.active = False        # the stream delivers nothing more to it
                s.draining.append(r)
            s.owner = owner
        self._shares()
        self.dispatch()
        self._settle_draining()

    def _settle_draining(self) -> None:
        for s in self.slots:
            if s.queue is None:
                continue
            if s.draining:
                kept = []
                for r in s.draining:
                    if r.inflight:
                        kept.append(r)
                    else:
                        self._detach(s, r)
                s.draining = kept
            if s.owner is not None and s.reader is None and not s.draining:
                self._hand_over(s)

    def _detach(self, s: Slot, r: PartitionReader) -> None:
        reader = r.reader
        if reader is not None and reader.ready:
            s.resume = reader.cursor  # everything before it was acked (or handed back: rewound)
        s.queue.remove_consumer(r)    # stores the group's offset at once

    def _hand_over(self, s: Slot) -> None:
        member = s.owner
        q = s.queue
        stored = q.offsets.get(self.group)
        start = max(stored + 1 if stored is not None else -1, s.resume if s.resume is not None else -1)
        offset = start if start >= 0 else (member.arguments or {}).get("x-stream-offset")
        args = {CONSUMER_NAME_ARG: self.group}
        if offset is not None:
            args["x-stream-offset"] = offset
        r = PartitionReader(member, self, s.number, q, args)
        r.share = self._share_of(member)
        s.reader = r
        q.add_consumer(r)
        r.reader = q.readers.get(r)

    def _share_of(self, member) -> int:
        n = sum(1 for s in self.slots if s.owner is member and s.queue is not None)
        return max(1, -(-member.prefetch // max(n, 1)))

    def _shares(self) -> None:
        for s in self.slots:
            if s.reader is not None:
                s.reader.share = self._share_of(s.reader.member)

    def _forget_if_idle(self) -> None:
        if self.consumers or any(s.draining or s.reader for s in self.slots):
            return
        reg = groups_of(self.broker)
        key = (self.vhost, self.name, self.group)
        if reg.get(key) is self:
            del reg[key]

    # -- partitions appearing and going -------------------------------------------------------------
    def partitions_changed(self, queues: list) -> None:
        """The super stream grew: new partitions join the assignment."""
        for i in range(len(self.slots), len(queues)):
            self.slots.append(Slot(i, queues[i]))
        self.rebalance()

    def partition_deleted(self, number: int) -> None:
        """A partition (or the whole super stream) was deleted: the group ends; members are told
        with basic.cancel (consumer_cancel_notify), as for a deleted queue."""
        for s in self.slots:
            q = s.queue
            for r in ([s.reader] if s.reader is not None else []) + s.draining:
                r.active = False
                if q is not None and not q.deleted and s.number != number:
                    q.remove_consumer(r)  # the other partitions stop delivering to the members
            s.queue = None
            s.reader = None
            s.draining = []
        members, self.consumers = self.consumers, []
        for m in members:
            m.queue_deleted()
        self._forget_if_idle()

    # -- the admin API ----------------------------------------------------------------------------------
    def info(self) -> dict:
        members = []
        for m in self.consumers:
            ch = m.channel
            members.append({"consumer_tag": m.tag, "channel": ch.number, "prefetch_count": m.prefetch,
                            "session": ch.session, "user": ch.session.user,
                            "partitions": [s.number for s in self.slots if s.owner is m]})
        return {"group": self.group, "members": members, "partitions": [
            {"partition": s.number, "queue": s.queue.name if s.queue is not None else None,
             "owner": s.owner.tag if s.owner is not None else None,
             "state": ("active" if s.reader is not None else
                       "draining" if s.draining else "unassigned"),
             "unacked": sum(r.inflight for r in ([s.reader] if s.reader else []) + s.draining)}
            for s in self.slots]}


# -- joining: the channel's hook ------------------------------------------------------------------
def find_group(channel, method, name: str) -> ConsumerGroup:
    """basic.consume with x-consumer-group on ``name``: the group to join (made if new), after
    every check RabbitMQ makes for a stream consumer, and the group's own (404, 406, 540, 403)."""
    sess = channel.session
    vh = sess.vhost
    args = method.arguments or {}
    group = _norm(args.get(GROUP_ARG))
    ex = vh.exchanges.get(name)
    if ex is None or ex.type != routing.X_SUPER_STREAM:
        if name in vh.queues:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{GROUP_ARG}' for "
                            f"{describe_name('queue', name, vh.name)}: consumer groups read a super "
                            f"stream (an exchange of type '{routing.X_SUPER_STREAM}'), not a queue",
                            60, 20, hard=False)
        raise AMQPError(NOT_FOUND, f"no super stream '{name}' in vhost '{vh.name}'", 60, 20, hard=False)
    desc = f"super stream '{name}' in vhost '{vh.name}'"
    if not isinstance(group, str) or not group:
        raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{GROUP_ARG}' for {desc}: expected a "
                        f"non-empty string", 60, 20, hard=False)
    queues = super_streams.partitions(vh, ex)
    for q in queues:
        perms.check(sess, perms.READ, "queue", q.name if q is not None else name)
    if None in queues:
        raise AMQPError(NOT_FOUND, f"{desc} lost partition(s) "
                        f"{[i for i, q in enumerate(queues) if q is None]}", 60, 20, hard=False)
    for arg in ("x-priority", CONSUMER_NAME_ARG):
        if arg in args:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{arg}' for {desc}: not with "
                            f"'{GROUP_ARG}'", 60, 20, hard=False)
    parse_offset_spec(args.get("x-stream-offset"), desc, 0)  # checked only
    if not channel.prefetch:
        raise AMQPError(PRECONDITION_FAILED, f"consumer prefetch count is not set for '{desc}'",
                        60, 20, hard=False)
    if method.no_ack:
        raise AMQPError(NOT_IMPLEMENTED, f"automatic acknowledgement not supported by consumer "
                        f"groups of {desc}", 60, 20, hard=True)
    if method.exclusive:
        raise AMQPError(PRECONDITION_FAILED, f"exclusive consume not supported by consumer groups "
                        f"of {desc}", 60, 20, hard=False)
    reg = groups_of(sess.broker)
    key = (vh.name, name, group)
    found = reg.get(key)
    if found is None or any(s.queue is None for s in found.slots):
        found = reg[key] = ConsumerGroup(sess.broker, vh.name, name, group, queues)
    elif len(found.slots) < len(queues):
        found.partitions_changed(queues)
    return found


def partitions_changed(broker, vhost: str, stream: str, queues: list) -> None:
    """After a super stream grew (admin API): every group of it takes the new partitions."""
    for (v, s, _g), group in list(groups_of(broker).items()):
        if v == vhost and s == stream:
            group.partitions_changed(queues)


def groups(broker, vhost: str, stream: str) -> list[ConsumerGroup]:
    return [g for (v, s, _n), g in groups_of(broker).items() if v == vhost and s == stream]
