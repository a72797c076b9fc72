"""The delayed-message exchange's store operations (``core/delayed.py`` calls them).

A mixin of :class:`exchange_broker.durability.sql.SqlDurability`: writes go through its ordered
group-commit writer (so they are ordered with message appends and definition writes), reads run
on an executor thread and answer on the event loop.

* ``delayed_insert`` batches rows: publishes join the batch last submitted until the writer
  thread takes it, and all share its :class:`Waiter` (the publisher confirms).
* Every other delayed write, and the fence, closes that batch first: inserts made after them
  are written after them.
"""

from __future__ import annotations

import threading
from typing import Callable

from exchange_broker.core.delayed import entries_from_rows
from exchange_broker.core.ports import Waiter


class _InsertBatch:
    """Rows for one writer call. Later publishes join it until the writer thread takes it."""

    __slots__ = ("rows", "waiter", "lock", "closed")

    def __init__(self, row: tuple) -> None:
        self.rows = [row]
        self.waiter = Waiter()
        self.lock = threading.Lock()
        self.closed = False

    def join(self, row: tuple) -> bool:
        with self.lock:
            if self.closed:
                return False
            self.rows.append(row)
            return True

    def run(self, store) -> None:  # on the writer thread
        with self.lock:
            self.closed = True
            rows, self.rows = self.rows, []
        store.insert_delayed(rows)


def _noop(store) -> None:
    return None


def _load_entries(store, start: tuple[int, int], until: int, limit: int) -> list[tuple]:
    """On an executor thread: the next rows, already as pending entries."""
    return entries_from_rows(store.load_delayed(start[0], start[1], until, limit))


class DelayedWrites:
    """Store operations of the delayed-message exchange (mixed into SqlDurability, which
    provides ``writer``, ``store``, ``flush`` and ``read``)."""

    _delayed_open: _InsertBatch | None = None  # the insert batch later publishes may join

    def _delayed_call(self, token: Waiter | None, fn: Callable) -> None:
        try:
            self.writer.submit_call(token, fn)
        except RuntimeError:  # writer stopped (shutdown)
            if token is not None:
                token.fire(False)

    def delayed_insert(self, row: tuple) -> Waiter:
        """Store one pending message, ``row`` = (id, vhost, exchange, routing_key, properties,
        body, due_ms, created_ms); the waiter fires once its batch is committed (or failed)."""
        batch = self._delayed_open
        if batch is not None and batch.join(row):
            return batch.waiter
        batch = self._delayed_open = _InsertBatch(row)
        self._delayed_call(batch.waiter, batch.run)
        return batch.waiter

    def delayed_delete(self, ids: list[int]) -> None:
        """Delete the rows of routed messages, after everything submitted before (the routed
        copies' appends batched in this event-loop turn included)."""
        self._delayed_open = None
        try:
            self.flush()
        except RuntimeError:  # writer stopped (shutdown): the rows stay, routed again after restart
            return
        self._delayed_call(None, lambda s: s.delete_delayed(ids))

    def delayed_delete_exchange(self, vhost: str, name: str) -> None:
        """Delete every stored pending message of a deleted exchange."""
        self._delayed_open = None  # later inserts (a redeclared exchange) go after the delete
        self._delayed_call(None, lambda s: s.delete_delayed_exchange(vhost, name))

    def delayed_fence(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the event loop once every delayed insert submitted so far is written
        (or the writer refused the fence): what a window load reads is then complete."""
        fence = Waiter()
        fence.add(lambda _arg, _ok: callback(), None)
        self._delayed_open = None  # inserts after this point are not guaranteed visible
        self._delayed_call(fence, _noop)

    def delayed_load(self, start: tuple[int, int], until: int, limit: int,
                     done: Callable[[list[tuple] | None, BaseException | None], None]) -> None:
        """Read up to ``limit`` pending entries with (due_ms, id) >= ``start`` and due_ms <
        ``until``, in that order, off the loop; then ``done(entries, error)`` on the loop."""
        self.read(_load_entries, start, until, limit, done=done)

    def delayed_stats(self) -> tuple[int, int, int | None]:
        """(stored pending messages, highest id or 0, earliest due_ms or None): read at
        recovery, before the broker serves (like the rest of the restore)."""
        return self.store.delayed_stats()
