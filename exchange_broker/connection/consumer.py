"""A consumer: a channel's subscription to one queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exchange_broker.protocol import codec

if TYPE_CHECKING:
    from exchange_broker.connection.channel import Channel
    from exchange_broker.queue_types.classic import Queue


class Consumer:
    __slots__ = ("tag", "tag_sh", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked",
                 "arguments", "priority", "active")

    def __init__(self, tag: str, channel: "Channel", queue: "Queue", no_ack: bool, exclusive: bool,
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

    def can_take(self) -> bool:
        """True when this consumer may be sent one more message now."""
        ch = self.channel
        if not ch.deliverable:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        if ch.global_prefetch and ch.global_unacked >= ch.global_prefetch:
            return False
        return True
