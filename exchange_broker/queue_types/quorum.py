"""Quorum queues (``x-queue-type: quorum``), as RabbitMQ 4 presents them to a client.

On one node a quorum queue is a classic queue with the quorum type's rules (its Raft replication
is the cluster's business): always durable, never exclusive, auto-delete or server-named (406 as
RabbitMQ); every message is stored, persistent or not; only the arguments the quorum type knows
(others RabbitMQ knows are 406 ``... of queue type rabbit_quorum_queue``); and

* ``x-delivery-limit`` (RabbitMQ 4: 20 unless the argument or a ``delivery-limit`` policy says
  otherwise; a negative value, e.g. -1, lifts the limit): each return to the queue (nack or reject with requeue, a channel closed or
  a consumer cancelled with the message unacknowledged) counts; a redelivered message carries the
  ``x-delivery-count`` header; past the limit it is dead-lettered with reason ``delivery_limit``
  (or dropped when there is no dead-letter exchange). The count is kept in memory: a broker
  restart starts it again at 0 (the message is then delivered more, never lost).
* ``x-dead-letter-strategy``: ``at-most-once`` (default) or ``at-least-once``. Dead-lettered copies
  are written in the same ordered store batch as the source's removal, so a crash can duplicate,
  never lose, either way; ``at-least-once`` without ``x-overflow: reject-publish`` falls back to
  ``at-most-once`` with a warning, as RabbitMQ does.
* ``x-overflow``: ``drop-head`` or ``reject-publish``; ``reject-publish-dlx`` is treated as
  ``reject-publish`` (logged), since quorum queues do not dead-letter refused publishes.
"""

from __future__ import annotations

import logging
from typing import Iterable

from exchange_broker.core.message import Message
from exchange_broker.core.names import describe
from exchange_broker.core.queue import CANCEL_ON_TIMEOUT
from exchange_broker.core.queue_args import amqp_type, parse_queue_arguments
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.classic import ClassicQueue
from exchange_broker.queue_types.ready import PriorityReady
from exchange_broker.queue_types.stream_args import KNOWN_QUEUE_ARGS, _norm

log = logging.getLogger("exchange_broker.quorum")

# RabbitMQ 3.13's rabbit_quorum_queue:capabilities() queue_arguments
QUORUM_ARGS = frozenset((
    "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", "x-expires",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-overflow", "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size",
    "x-delivery-limit", "x-message-ttl", "x-queue-leader-locator"))
DLX_STRATEGIES = ("at-most-once", "at-least-once")
COUNT_HEADER = "x-delivery-count"
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4.0's ?DEFAULT_DELIVERY_LIMIT
MAX_PRIORITY = 31            # rabbit_fifo's ?MAX_PRIORITY (RabbitMQ 4.3: 32 levels, rabbit_fifo_pq)
DEFAULT_PRIORITY = 4         # rabbit_fifo's ?DEFAULT_PRIORITY: a message without a priority


def message_priority(properties: bytes) -> int:
    """rabbit_fifo:msg_priority/1: the priority property clamped to 0-31; none: 4."""
    _dm, prio, flags = codec.quick_properties(properties)
    return min(prio, MAX_PRIORITY) if flags & codec.FLAG_PRIORITY else DEFAULT_PRIORITY


def _bad(desc: str, arg: str, why: str | None = None) -> AMQPError:
    text = f"invalid arg '{arg}' for {desc}"
    text += f": {why}" if why is not None else " of queue type rabbit_quorum_queue"
    return AMQPError(PRECONDITION_FAILED, text, 50, 10, hard=False)


def quorum_settings(arguments: dict, desc: str) -> tuple[int | None, str]:
    """(delivery limit or None for none, dead-letter strategy), with RabbitMQ's 406s. As RabbitMQ
    4: without ``x-delivery-limit`` (or a ``delivery-limit`` policy) the limit is 20; a negative
    value lifts it."""
    limit = arguments.get("x-delivery-limit")
    if limit is None:
        limit = DEFAULT_DELIVERY_LIMIT
    else:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise _bad(desc, "x-delivery-limit", f'"expected integer, got {amqp_type(limit)}"')
        if limit < 0:
            limit = None
    strategy = _norm(arguments.get("x-dead-letter-strategy", "at-most-once"))
    if strategy not in DLX_STRATEGIES:
        raise _bad(desc, "x-dead-letter-strategy", "invalid_dlx_strategy")
    return limit, strategy


def _without_count(raw: bytes) -> bytes | None:
    """Raw properties without the x-delivery-count header (None: it has none)."""
    if COUNT_HEADER.encode() not in raw:
        return None
    props = codec.parse_properties(raw)
    headers = dict(props.get("headers") or {})
    if headers.pop(COUNT_HEADER, None) is None:
        return None
    props["headers"] = headers
    return codec.encode_properties(props)


class QuorumQueue(ClassicQueue):
    rabbit_type = "rabbit_quorum_queue"
    queue_type = "quorum"
    stores_all = True  # transient publishes are stored too (classic.enqueue)
    # RabbitMQ 4.3: a consumer timeout cancels the consumer (connection/timeouts.py)
    CAPABILITIES = ClassicQueue.CAPABILITIES | {CANCEL_ON_TIMEOUT}

    def __init__(self, broker, vhost: str, name: str, arguments: dict, options,
                 delivery_limit: int | None, strategy: str) -> None:
        super().__init__(broker, vhost, name, True, None, False, arguments, options)
        self.delivery_limit = delivery_limit
        self.dead_letter_strategy = strategy
        self.returns: dict[int, int] = {}  # seq -> times returned to the queue (only those > 0)
        # RabbitMQ 4.3: every quorum queue has 32 priorities, highest first, FIFO within one
        self.ready = PriorityReady(MAX_PRIORITY)

    def enqueue(self, m: Message, publisher, per_message_ttl: int | None):
        m.priority = message_priority(m.properties)
        return super().enqueue(m, publisher, per_message_ttl)

    @classmethod
    def declare(cls, broker, vhost, name: str, durable: bool, owner, auto_delete: bool,
                arguments: dict) -> "QuorumQueue":
        desc = describe("queue", name, vhost.name)
        for arg in arguments:
            if arg in KNOWN_QUEUE_ARGS and arg not in QUORUM_ARGS:
                raise _bad(desc, arg)
        for bad, prop in ((not durable, "non-durable"), (owner is not None, "exclusive-owner"),
                          (auto_delete, "auto-delete")):
            if bad:
                raise AMQPError(PRECONDITION_FAILED, f"invalid property '{prop}' for {desc}", 50, 10,
                                hard=False)
        if name.startswith("amq.gen-"):  # the vhost generated it: a server-named declare
            raise AMQPError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type "
                            "rabbit_quorum_queue", 50, 10, hard=False)
        options = cls._options(arguments, desc)
        limit, strategy = quorum_settings(arguments, desc)
        return cls(broker, vhost.name, name, arguments, options, limit, strategy)

    @staticmethod
    def _options(arguments: dict, desc: str):
        options = parse_queue_arguments(arguments, desc)
        if options.overflow == "reject-publish-dlx":
            log.warning("%s: overflow reject-publish-dlx is not supported by quorum queues; "
                        "using reject-publish", desc)
            options.overflow = "reject-publish"
        return options

    def apply_policy(self, effective: dict, policy: str | None = None,
                     operator_policy: str | None = None) -> None:
        super().apply_policy(effective, policy, operator_policy)
        if self.options.overflow == "reject-publish-dlx":
            self.options.overflow = "reject-publish"
        desc = describe("queue", self.name, self.vhost)
        self.delivery_limit, self.dead_letter_strategy = quorum_settings(effective, desc)

    def check_consume(self, channel, method) -> None:
        """A channel with a global prefetch (basic.qos global=true) cannot consume: 540."""
        if channel.global_prefetch:
            raise AMQPError(NOT_IMPLEMENTED, f"{describe('queue', self.name, self.vhost)} does not "
                            f"support global qos", 60, 20, hard=True)
        super().check_consume(channel, method)

    # -- delivery counting ------------------------------------------------------------------------------
    def requeue(self, msgs: Iterable[Message]) -> None:
        back = []
        limit = self.delivery_limit
        for msg in msgs:
            count = self.returns.get(msg.seq, 0) + 1
            if limit is not None and count > limit:
                self.returns.pop(msg.seq, None)
                self._dead_letter(msg, "delivery_limit")
                continue
            self.returns[msg.seq] = count
            props = dict(msg.props)
            props["headers"] = {**(props.get("headers") or {}), COUNT_HEADER: count}
            msg.properties = codec.encode_properties(props)
            msg._props = props
            back.append(msg)
        if back:
            super().requeue(back)

    def settle(self, msg: Message) -> None:
        if self.returns:
            self.returns.pop(msg.seq, None)
        super().settle(msg)

    def reject(self, msg: Message) -> None:
        self.returns.pop(msg.seq, None)
        self._dead_letter(msg, "rejected")

    def _discard(self, msg: Message, reason: str) -> None:
        """Expired or over a length limit (drop-head): dead-lettered without the count header."""
        self.returns.pop(msg.seq, None)
        self._strip_count(msg)
        super()._discard(msg, reason)

    def _dead_letter(self, msg: Message, reason: str) -> None:
        if self.options.dead_letter_exchange is not None and not self.deleted:
            self._strip_count(msg)
            self.broker.dead_letter(self, msg, reason)
        else:
            super().settle(msg)

    @staticmethod
    def _strip_count(msg: Message) -> None:
        raw = _without_count(msg.properties)
        if raw is not None:
            msg.properties = raw
            msg._props = None
