"""A consumer: a channel's subscription to one queue, and the one narrow sink its queue delivers
through (``core/ports.Consumer``): ``can_take``, ``deliver``, ``queue_deleted``."""

from __future__ import annotations

from exchange_broker.core.queue import delivery_guard
from exchange_broker.protocol import codec

UNLIMITED = 1 << 30


class Consumer:
    __slots__ = ("tag", "tag_sh", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked",
                 "arguments", "priority", "active", "deliver", "deliver_run", "guard")

    def __init__(self, tag: str, channel, queue, no_ack: bool, exclusive: bool,
                 prefetch: int, arguments: dict) -> None:
        self.tag = tag
        self.tag_sh = codec.short_str(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments
        prio = arguments.get("x-priority", 0) if arguments else 0
        self.priority = prio if isinstance(prio, int) and not isinstance(prio, bool) else 0
        self.active = True
        # deliver(msg) -> delivery tag: the channel's one delivery routine, bound to this consumer
        self.deliver = channel.delivery_sink(self)
        self.deliver_run = channel.run_sink(self)
        self.guard = delivery_guard(queue)  # a cluster node that may no longer lead the queue: False


    def can_take(self) -> bool:
        """True when this consumer may be sent one more message now."""
        if self.guard is not None and not self.guard():
            return False
        ch = self.channel
        if not ch.session.writable or ch.closed:  # socket, channel
            return False
        # the channel's limit (basic.qos global=true) holds back no-ack consumers too, though their
        # deliveries do not count against it (rabbit_limiter's can_send)
        if ch.global_prefetch and ch.global_unacked >= ch.global_prefetch:
            return False
        if self.no_ack:
            return True
        return not (self.prefetch and self.unacked >= self.prefetch)

    def room(self) -> int:
        """After ``can_take``: how many messages it may take now, counted (its prefetch's and its
        channel's limit left; no-ack deliveries count against neither)."""
        if self.no_ack:
            return UNLIMITED
        ch = self.channel
        room = self.prefetch - self.unacked if self.prefetch else UNLIMITED
        if ch.global_prefetch:
            room = min(room, ch.global_prefetch - ch.global_unacked)
        return room

    def blocked_by_socket(self) -> bool:
        """The client's connection cannot take more output (not a prefetch limit)."""
        return not self.channel.session.writable

    @property
    def closed(self) -> bool:
        return self.channel.closed

    @property
    def outstanding(self):
        """The delivery tags still unacknowledged on the channel (supports ``in``)."""
        return self.channel.unacked

    def queue_deleted(self) -> None:
        self.channel.consumer_cancelled_by_broker(self)
