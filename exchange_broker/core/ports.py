"""The ports of the core: what it tells the store, and what it calls on the layers above it
(open connections, consumers), as small protocols so that nothing here imports them.

The durability port is split by concern, one small protocol each: :class:`MessageDurability`
(a queue's message rows, paging, generic ordered writes and reads), :class:`StreamDurability`
(a stream's log), :class:`DefinitionDurability` (vhosts, users, permissions, limits, policies,
exchanges, queues, bindings), :class:`DelayedDurability` (the delayed-message exchange) and
:class:`ClusterDurability` (what a cluster node hooks into the store's writes);
:class:`Durability` is all of them, what the broker holds. The default, :class:`NullDurability`,
keeps nothing (a purely in-memory broker). The SQL implementation (``durability/sql.py`` with
``definition_writes.py`` and ``delayed_writes.py``) turns these calls into ordered, batched writes
and answers ``append`` with a :class:`Waiter` that fires once the batch holding the message has
committed.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence


class Connection(Protocol):
    """An open AMQP connection as the core sees it (``connection/session.py``)."""

    user: str | None
    vhost: object
    closed: bool
    has_published: bool
    exclusive_queues: set

    def unthrottle(self, queue) -> None:
        """Credit flow: ``queue`` releases this publisher (its channel paused reading it when the
        queue answered a publish with ``Block``, see ``core/actions.py``)."""

    def block(self, reason: str) -> None:
        """A resource alarm: connection.blocked, and stop reading."""

    def unblock(self) -> None: ...

    def server_close(self, code: int, text: str) -> None:
        """Close from the broker's side (connection.close with ``code``)."""

    def check_consumer_timeouts(self, now: float, default_ms: int) -> None:
        """Close channels holding a delivery unacknowledged for longer than the timeout."""

    def nack_overdue_confirms(self, now: float, bound: float) -> None:
        """Nack the publishes that waited ``bound`` s or more for the store (publisher confirms)."""


class Consumer(Protocol):
    """A subscription to a queue, as queue types see it (``connection/consumer.py``): the one
    narrow sink deliveries go up through."""

    tag: str
    priority: int
    exclusive: bool
    no_ack: bool
    arguments: dict
    active: bool

    def can_take(self) -> bool:
        """May one more message be delivered now (credit, prefetch, writable socket)?"""

    outstanding: object
    """The delivery tags not yet acknowledged (a container: ``tag in consumer.outstanding``)."""

    def deliver(self, msg) -> int:
        """Send ``msg``; returns its delivery tag."""

    deliver_run: "Callable[[list], Sequence[int]] | None"
    """Send several messages of one queue at once (no more than ``room()`` after ``can_take``
    said yes; its output budget is checked again after the run); returns their delivery tags.
    None: one at a time."""

    def room(self) -> int:
        """How many messages it may take now (``deliver_run`` consumers only)."""

    def queue_deleted(self) -> None:
        """The queue is gone: forget the consumer and tell the client (basic.cancel)."""


class Waiter:
    """Callbacks to run when one group-commit batch is durable (or failed)."""

    __slots__ = ("callbacks", "done", "ok")

    def __init__(self) -> None:
        self.callbacks: list[tuple[Callable, object]] = []
        self.done = False
        self.ok = False

    def add(self, fn: Callable[[object, bool], None], arg: object) -> None:
        if self.done:
            fn(arg, self.ok)
        else:
            self.callbacks.append((fn, arg))

    def fire(self, ok: bool) -> None:
        self.done, self.ok = True, ok
        callbacks, self.callbacks = self.callbacks, []
        for fn, arg in callbacks:
            fn(arg, ok)

    @classmethod
    def all(cls, *waiters: "Waiter") -> "Waiter":
        """One waiter that fires once every one of ``waiters`` has: ok only if they all were
        (a message stored locally and forwarded to another node's queue)."""
        combined = cls()
        state = [len(waiters), True]

        def one(_arg: object, ok: bool) -> None:
            state[0] -= 1
            state[1] = state[1] and ok
            if state[0] == 0:
                combined.fire(state[1])
        for w in waiters:
            w.add(one, None)
        return combined


class MessageDurability(Protocol):
    """A classic or quorum queue's messages (the hot path), paging, and ordered store access."""

    enabled: bool

    def append(self, q, msg) -> "Waiter | None":
        """Store ``msg`` (the waiter fires once its batch has committed)."""

    def remove(self, msg) -> None:
        """Settled (acked, expired, dead-lettered): its row goes."""

    def mark_delivered(self, msg) -> None:
        """Delivered at least once (redelivered after a restart)."""

    def messages_purged(self, q, msgs) -> None: ...

    def attach(self, q, window: int) -> None:
        """Let a durable queue page to the store beyond ``window`` messages in memory."""

    def write(self, fn: Callable) -> None:
        """An ordered ``fn(store)`` after everything submitted before it."""

    def read(self, fn: Callable, *args, done: Callable) -> None:
        """``fn(store, *args)`` off the event loop, then ``done(result, error)`` on it."""


class StreamDurability(Protocol):
    """A stream's log (its reads go through ``MessageDurability.read``)."""

    def append_log(self, q, msg) -> "Waiter | None": ...


class DefinitionDurability(Protocol):
    """What is declared, granted or set: each an ordered write; declare-ok & co. wait for
    ``pending_definition``."""

    pending_definition: "Waiter | None"

    def exchange_declared(self, ex) -> None: ...
    def exchange_deleted(self, ex) -> None: ...
    def queue_declared(self, q) -> None: ...
    def queue_deleted(self, q) -> None: ...
    def binding_added(self, vhost, source, dest_type, dest, routing_key, arguments) -> None: ...
    def binding_removed(self, vhost, source, dest_type, dest, routing_key, arguments) -> None: ...
    def vhost_added(self, name, default_queue_type=None) -> None: ...
    def vhost_deleted(self, name) -> None: ...
    def user_added(self, user) -> None: ...
    def user_deleted(self, name) -> None: ...
    def permission_set(self, user, vhost, configure, write, read) -> None: ...
    def permission_cleared(self, user, vhost) -> None: ...
    def topic_permission_set(self, user, vhost, exchange, write, read) -> None: ...
    def topic_permission_cleared(self, user, vhost, exchange) -> None: ...
    def vhost_limit_set(self, vhost, name, value) -> None: ...
    def vhost_limit_cleared(self, vhost, name) -> None: ...
    def user_limit_set(self, user, name, value) -> None: ...
    def user_limit_cleared(self, user, name) -> None: ...
    def policy_set(self, policy) -> None: ...
    def policy_cleared(self, kind, vhost, name) -> None: ...


class DelayedDurability(Protocol):
    """The delayed-message exchange's rows (``core/delayed.py``)."""

    def delayed_insert(self, row: tuple) -> "Waiter | None": ...
    def delayed_delete(self, ids: list[int]) -> None: ...
    def delayed_delete_exchange(self, vhost: str, name: str) -> None: ...
    def delayed_fence(self, callback: Callable[[], None]) -> None: ...
    def delayed_load(self, start: tuple[int, int], until: int, limit: int, done: Callable) -> None: ...
    def delayed_stats(self) -> tuple[int, int, int | None]: ...


class ClusterDurability(Protocol):
    """What a cluster node hooks into the SQL durability (``cluster/``; the core never calls
    these): queue rows claimed and dropped on the writer thread, and a count of definition
    writes issued and finished (a definitions mirror applies a read only when none was under
    way)."""

    claim_queue: Callable[[str, str, int], bool] | None
    on_queue_dropped: Callable[[str, str], None] | None
    after_queue_declared: Callable[[object], None] | None
    definitions_issued: int
    definitions_done: int


class Durability(MessageDurability, StreamDurability, DefinitionDurability, DelayedDurability,
                 Protocol):
    """The whole port: what ``Broker.durability`` is."""


class NullDurability(MessageDurability, StreamDurability, DefinitionDurability, DelayedDurability):
    """Stores nothing (a :class:`Durability`): every hook is the protocols' no-op, but for the
    answers below. DelayedExchanges.recover() switches the store on only when ``enabled``, so the
    delayed-message calls are never made here."""

    enabled = False
    pending_definition: Waiter | None = None  # the last definition write (declare-ok waits for it)

    def read(self, fn: Callable, *args, done: Callable) -> None:
        done(None, RuntimeError("no store"))

    def delayed_fence(self, callback: Callable[[], None]) -> None:
        callback()

    def delayed_load(self, start: tuple[int, int], until: int, limit: int, done: Callable) -> None:
        done([], None)

    def delayed_stats(self) -> tuple[int, int, int | None]:
        return 0, 0, None
