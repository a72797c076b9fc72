"""What the core tells the store. The default keeps nothing (a purely in-memory broker).

The SQL implementation (``sql_durability``) turns these calls into ordered,
batched writes and answers ``append`` with a :class:`Waiter` that fires once
the batch holding the message has committed.
"""

from __future__ import annotations

from typing import Callable


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

    def remove(self, msg) -> None: ...
    def mark_delivered(self, msg) -> None: ...

    # vhosts, users and permissions
    def vhost_added(self, name) -> None: ...
    def vhost_deleted(self, name) -> None: ...
    def user_added(self, user) -> None: ...
    def user_deleted(self, name) -> None: ...
    def permission_set(self, user, vhost, configure, write, read) -> None: ...
    def permission_cleared(self, user, vhost) -> None: ...
