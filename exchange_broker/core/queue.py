"""The queue-type interface: what the broker and the channel call on any queue, without asking
which type it is. Each type (``queue_types/classic.py``, ``queue_types/stream.py``, ...) is a
subclass registered under its ``x-queue-type`` name; the broker is given that registry.

The defaults here are the classic behaviour where one is natural; a type overrides what it does
differently (a stream refuses basic.get, purge and nacks; it keeps no per-message store rows).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

from exchange_broker.core.message import Message
from exchange_broker.core.names import describe
from exchange_broker.core.queue_args import QueueOptions
from exchange_broker.protocol.constants import INTERNAL_ERROR
from exchange_broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from exchange_broker.core.ports import Waiter

# What a queue type can do, asked by the channel, the admin API and the cluster instead of its class
# (``QueueType.capabilities()``; RabbitMQ's ``rabbit_queue_type:capabilities``):
HELD_HERE = "held_here"  # this node holds and delivers the queue's messages (every type but a
#                          cluster's placeholder for a queue another node leads: cluster/remote.py)
CANCEL_ON_TIMEOUT = "cancel_on_consumer_timeout"  # a consumer timeout cancels the consumer (basic.cancel,
#                          to a client with consumer_cancel_notify) instead of closing its channel


def delivery_guard(queue) -> Callable[[], bool] | None:
    """What a consumer (or basic.get) of ``queue`` asks before it takes a message: a cluster
    node's check (``Broker.delivery_guard``, False while its lease on the database may have run
    out) for a queue another node could take over (a durable queue it leads, not a placeholder);
    None for every other queue (transient ones die with their node: nobody else can deliver them)."""
    guard = queue.broker.delivery_guard
    return guard if guard is not None and queue.durable and HELD_HERE in queue.capabilities() else None


def dispatch_guarded(broker) -> int:
    """The guard says True again: every queue it may have held (durable, led here, consumed from)
    hands out what waited. Returns how many queues were asked to dispatch."""
    held = [q for vh in broker.vhosts.values() for q in list(vh.queues.values())
            if q.durable and HELD_HERE in q.capabilities() and q.consumers and not q.deleted]
    for q in held:
        q.dispatch()
    return len(held)


class QueueType:
    queue_type = "classic"     # the x-queue-type name (admin API "type")
    pages_to_store = False     # ready messages page to the store past a window (durability.attach)
    CAPABILITIES: frozenset[str] = frozenset({HELD_HERE})  # a type declares its own (the names above)

    def __init__(self, broker, vhost: str, name: str, durable: bool = False,
                 exclusive_owner: object = None, auto_delete: bool = False,
                 arguments: dict | None = None, options: QueueOptions | None = None) -> None:
        self.broker = broker
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.options = options or QueueOptions()
        self.consumers: deque = deque()
        self.unacked = 0
        self.bytes = 0
        self.next_seq = 1
        self.had_consumer = False
        self.deleted = False
        self.store_id: int | None = None       # row id in the durable store
        self.stats_published = 0
        self.stats_delivered = 0
        # per-delivery counters (the channel counts them; admin API message_stats)
        self.stats_deliver = self.stats_deliver_no_ack = self.stats_get = self.stats_get_no_ack = 0
        self.stats_get_empty = self.stats_ack = self.stats_redeliver = 0
        self.flow_blocked: set = set()         # publishers paused until this queue drains
        self.waiting_gets: list[Callable[[], None]] = []  # basic.get retries (paged queues)
        self.on_empty_consumers: Callable[["QueueType"], None] | None = None

    # -- declaring (the registry calls this) -------------------------------------------------------
    @classmethod
    def declare(cls, broker, vhost, name: str, durable: bool, owner, auto_delete: bool,
                arguments: dict) -> "QueueType":
        """Validate the declaration (406 with RabbitMQ's text) and build the queue."""
        raise NotImplementedError

    # -- state ------------------------------------------------------------------------------------
    def capabilities(self) -> frozenset[str]:
        """What this queue can do (the names at the top of this module): asked instead of its type."""
        return self.CAPABILITIES

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        raise NotImplementedError

    @property
    def message_bytes(self) -> int:
        """Body bytes of the messages the queue holds (admin API ``message_bytes_ready``)."""
        return self.bytes

    @property
    def wants_dispatch(self) -> bool:
        """Something could be delivered if a consumer had credit (after acks, qos, writability)."""
        raise NotImplementedError

    # -- publishing ---------------------------------------------------------------------------------
    def enqueue(self, msg: Message, publisher, per_message_ttl: int | None):
        """Take one routed message. Returns what the publisher's connection is to do
        (``core/actions.py``): None, the durability waiter, or a ``Block`` (stop reading
        ``publisher``, which is never called). A refused message is not enqueued and
        ``msg.rejected`` tells whether its publisher must be nacked."""
        raise NotImplementedError

    def congested(self) -> bool:
        return False

    def release_publishers(self) -> None:
        blocked, self.flow_blocked = self.flow_blocked, set()
        for session in blocked:
            session.unthrottle(self)

    # -- consuming ----------------------------------------------------------------------------------
    def check_consume(self, channel, method) -> None:
        """basic.consume rules of this type, checked before consume-ok."""

    def add_consumer(self, consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer) -> None:
        raise NotImplementedError

    def dispatch(self) -> None:
        raise NotImplementedError

    def get(self) -> Message | None:
        """basic.get: the next message (None: empty)."""
        raise NotImplementedError

    @property
    def get_pending(self) -> bool:
        """An empty basic.get should wait (the queue is reading messages back from the store)."""
        return False

    # -- settling deliveries ----------------------------------------------------------------------------
    def settle(self, msg: Message) -> None:
        """Acked, or delivered with no_ack: forget it (its store row too)."""
        if msg.stored:
            self.broker.durability.remove(msg)

    def delivered(self, msg: Message) -> None:
        """Delivered and awaiting an ack: a restart redelivers it with redelivered=true."""
        if msg.stored:
            self.broker.durability.mark_delivered(msg)

    def check_reject(self, kind: int) -> None:
        """basic.nack (kind 1) or basic.reject (kind 2) of one of this queue's deliveries."""

    def reject(self, msg: Message) -> None:
        """Rejected or nacked without requeue: dead-lettered when the queue has a DLX."""
        if self.options.dead_letter_exchange is not None and not self.deleted:
            self.broker.dead_letter(self, msg, "rejected")
        else:
            self.settle(msg)

    def requeue(self, msgs: Iterable[Message]) -> None:
        raise NotImplementedError

    def purge(self) -> list[Message]:
        raise NotImplementedError

    # -- queue.purge and queue.delete: commands every queue type answers ---------------------------
    # None: nothing to wait for, the caller purges / deletes here and now (``VHost.purge_queue``,
    # ``VHost.delete_queue``). A queue type whose answer comes later (a cluster's placeholder: the
    # queue's leader purges or deletes it) returns a Waiter; the reply's ``message_count`` is set
    # before it fires True, and ``command_error()`` is the AMQP error when it fires False.
    def purge_later(self, purge_ok) -> "Waiter | None":
        return None

    def delete_later(self, delete_ok, if_unused: bool, if_empty: bool) -> "Waiter | None":
        return None

    def command_error(self) -> AMQPError:
        return AMQPError(INTERNAL_ERROR, f"{describe('queue', self.name, self.vhost)}: the command failed",
                         50, 0, hard=True)

    # -- lifecycle ------------------------------------------------------------------------------------
    def touch(self) -> None:
        """Declared, consumed from or polled (restarts an x-expires countdown)."""

    def cancel_timers(self) -> None:
        pass

    def on_deleted(self) -> None:
        """Deleted (consumers already cancelled): drop what is held in memory."""

    def answer_waiting_gets(self) -> None:
        waiting, self.waiting_gets = self.waiting_gets, []
        for retry in waiting:
            retry()

    def apply_policy(self, effective: dict, policy: str | None = None,
                     operator_policy: str | None = None) -> None:
        """Policies changed: ``effective`` are the queue arguments now in force (the declared
        ``x-`` arguments merged with the policies' keys by the policy layer, as ``x-`` names)."""
        self.policy, self.operator_policy = policy, operator_policy
        self.effective_arguments = dict(effective)

    policy: str | None = None
    operator_policy: str | None = None
    effective_arguments: dict | None = None   # None: the declared arguments, no policy applies

    def restore(self, durability, row: dict, window: int) -> bool:
        """Rebuild state from the store's row at start-up; True when messages must be paged in."""
        return False
