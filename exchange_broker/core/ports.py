"""The ports of the core: what it tells the store, and what it calls on the layers above it
(open connections, consumers), as small protocols so that nothing here imports them.

The durability default keeps nothing (a purely in-memory broker). The SQL implementation
(``durability/sql.py``) turns these calls into ordered, batched writes and answers ``append``
with a :class:`Waiter` that fires once the batch holding the message has committed.
"""

from __future__ import annotations

from typing import Callable, Protocol


class Connection(Protocol):
    """An open AMQP connection as the core sees it (``connection/session.py``)."""

    user: str | None
    vhost: object
    closed: bool
    has_published: bool
    exclusive_queues: set

    def throttle(self, queue) -> None:
        """Credit flow: stop reading this publisher until ``queue`` drains."""

    def unthrottle(self, queue) -> None: ...

    def block(self, reason: str) -> None:
        """A resource alarm: connection.blocked, and stop reading."""

    def unblock(self) -> None: ...

    def server_close(self, code: int, text: str) -> None:
        """Close from the broker's side (connection.close with ``code``)."""

    def check_consumer_timeouts(self, now: float, default_ms: int) -> None:
        """Close channels holding a delivery unacknowledged for longer than the timeout."""


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


class NullDurability:
    """Stores nothing; every hook is a no-op."""

    enabled = False

    def exchange_declared(self, ex) -> None: ...
    def exchange_deleted(self, ex) -> None: ...
    def queue_declared(self, q) -> None: ...
    def queue_deleted(self, q) -> None: ...
    def binding_added(self, vhost, source, dest_type, dest, routing_key, arguments) -> None: ...
    def binding_removed(self, vhost, source, dest_type, dest, routing_key, arguments) -> None: ...
    def messages_purged(self, q, msgs) -> None: ...

    def append(self, q, msg) -> Waiter | None:
        return None

    def append_log(self, q, msg) -> Waiter | None:  # a stream's append
        return None

    def remove(self, msg) -> None: ...
    def mark_delivered(self, msg) -> None: ...

    # vhosts, users and permissions
    def vhost_added(self, name, default_queue_type=None) -> None: ...
    def vhost_deleted(self, name) -> None: ...
    def user_added(self, user) -> None: ...
    def user_deleted(self, name) -> None: ...
    def permission_set(self, user, vhost, configure, write, read) -> None: ...
    def permission_cleared(self, user, vhost) -> None: ...

    # topic permissions (core/permissions.py) and vhost / user limits (core/limits.py)
    def topic_permission_set(self, user, vhost, exchange, write, read) -> None: ...
    def topic_permission_cleared(self, user, vhost, exchange) -> None: ...
    def vhost_limit_set(self, vhost, name, value) -> None: ...
    def vhost_limit_cleared(self, vhost, name) -> None: ...
    def user_limit_set(self, user, name, value) -> None: ...
    def user_limit_cleared(self, user, name) -> None: ...

    # generic store access for queue types and the delayed exchange (SqlDurability: ordered
    # writes on the writer thread; reads off the event loop, answered on it)
    pending_definition: Waiter | None = None  # the last definition write (declare-ok waits for it)

    def write(self, fn: Callable) -> None: ...

    def read(self, fn: Callable, *args, done: Callable) -> None:
        done(None, RuntimeError("no store"))

    def attach(self, q, window: int) -> None:
        """Let a durable queue page to the store (nothing to page to here)."""

    # -- the delayed-message exchange (helper block: core/delayed.py calls these; SqlDurability's
    # are in durability/delayed_writes.py). DelayedExchanges.recover() switches the store on only
    # when ``enabled``, so with this class they are never called; they document the interface.
    def delayed_insert(self, row: tuple) -> Waiter | None:
        return None

    def delayed_delete(self, ids: list[int]) -> None: ...
    def delayed_delete_exchange(self, vhost: str, name: str) -> None: ...

    def delayed_fence(self, callback: Callable[[], None]) -> None:
        callback()

    def delayed_load(self, start: tuple[int, int], until: int, limit: int, done: Callable) -> None:
        done([], None)

    def delayed_stats(self) -> tuple[int, int, int | None]:
        return 0, 0, None

    # policies and operator policies (core/policies.py; SqlDurability stores them)
    def policy_set(self, policy) -> None: ...
    def policy_cleared(self, kind, vhost, name) -> None: ...
