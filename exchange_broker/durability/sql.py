"""Durability through the SQL store: ordered, batched writes off the event loop.

* Message appends, removes (acks) and delivered marks gathered during one
  event-loop turn go to the group-commit writer as one submit; the writer
  folds whatever is queued into one transaction.
* Definition changes (exchanges, queues, bindings, vhosts) are ordered
  "barrier" operations on the same writer thread (``write``), so a queue row
  always exists before its first message row, and is gone only after its last.
* ``append`` returns a :class:`Waiter` fired on the event loop once the batch
  holding the message has committed (ok) or failed (not ok): publisher
  confirms and tx.commit-ok wait on it.
* Generic access for queue types: ``write(fn)`` (an ordered ``fn(store)`` on the
  writer thread) and ``read(fn, *args, done=...)`` (``fn(store, *args)`` on an
  executor thread, ``done(result, error)`` back on the event loop).
* Definition writes (vhosts, users, permissions, limits, policies, exchanges, queues, bindings):
  ``definition_writes.py``; the delayed-message exchange's operations: ``delayed_writes.py``
  (both mixins of :class:`SqlDurability`, by concern as the ports in ``core/ports.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable

from persistence.store import StoredMessage
from persistence.writer import GroupCommitWriter

from exchange_broker.core.ports import Waiter
from exchange_broker.durability.definition_writes import DefinitionWrites, _definition_write, encode_args
from exchange_broker.durability.delayed_writes import DelayedWrites

__all__ = ["SqlDurability", "encode_args", "message_from_row"]

log = logging.getLogger("exchange_broker.persistence")


class SqlDurability(DefinitionWrites, DelayedWrites):
    enabled = True

    def __init__(self, store, loop: asyncio.AbstractEventLoop, window: int = 20000,
                 fsync_streams: bool = False) -> None:
        self.store = store
        self.fsync_streams = fsync_streams  # --stream-fsync: stream appends are fsynced like the rest
        self.window = window
        self.loop = loop
        self.writer = GroupCommitWriter(store, self._on_done_thread)
        self.next_queue_id = 1  # SQLite: this process allocates queue ids
        # definition writes issued and finished (a cluster node's definitions mirror applies a read
        # of the store only if none of this node's own writes was under way meanwhile)
        self.definitions_issued = self.definitions_done = 0
        # a cluster with per-queue leaders, on the writer thread: claim_queue(vhost, name, id) before
        # a declared queue's row is written (False: do not write it), on_queue_dropped(vhost, name)
        # once a deleted queue's row is gone
        self.claim_queue: Callable[[str, str, int], bool] | None = None
        self.on_queue_dropped: Callable[[str, str], None] | None = None
        self.after_queue_declared: Callable[[object], None] | None = None  # on the loop, after the write
        self._queue_ids: deque[int] = deque()  # PostgreSQL: ids reserved from the store's sequence
        self._shared_ids = False
        self._reserving = False
        self._appends: list[StoredMessage] = []
        self._logs: dict[int, list] = {}  # stream appends: {queue id: its messages, in order}
        self._removes: list[tuple[int, int]] = []
        self._marks: dict[int, int] = {}
        self._waiter: Waiter | None = None
        self._sync = False  # the batch so far has a write whose commit must be fsynced
        self._scheduled = False
        self.failing = False
        self.paging_queues: set = set()
        self.on_commit: list[Callable[[], None]] = [self._evict_all]  # on the loop after a good batch
        self.on_health: Callable[[bool, str], None] = lambda ok, why: None
        self.pending_definition: Waiter | None = None  # the last definition write submitted

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.flush()
        self.writer.stop()

    # -- batching ------------------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Submit the appends, removes and delivered marks batched so far (normally done at the
        end of the event-loop turn) so that writes submitted next are ordered after them.
        Raises RuntimeError once the writer has stopped."""
        self._scheduled = False
        if not (self._appends or self._removes or self._marks or self._logs):
            return
        token = self._waiter
        self.writer.submit(token, self._appends, self._removes, self._marks, sync=self._sync,
                           logs=self._logs)
        self._appends, self._removes, self._marks, self._waiter = [], [], {}, None
        self._logs = {}
        self._sync = False

    def write(self, fn: Callable) -> None:
        """An ordered write ``fn(store)`` on the writer thread: everything submitted before it is
        written first. ``pending_definition`` fires once it is committed: declare-ok & co. wait
        for it."""
        self.flush()
        waiter = self.pending_definition = Waiter()
        self.definitions_issued += 1
        waiter.add(self._definition_written, None)
        self.writer.submit_call(waiter, lambda store: _definition_write(store, fn))

    def _definition_written(self, _arg, _ok: bool) -> None:
        self.definitions_done += 1

    def read(self, fn: Callable, *args, done: Callable[[object, BaseException | None], None]) -> None:
        """``fn(store, *args)`` on an executor thread, then ``done(result, None)`` (or
        ``done(None, error)``) on the event loop."""
        fut = self.loop.run_in_executor(None, fn, self.store, *args)
        fut.add_done_callback(lambda f: _answer(f, done))

    def _on_done_thread(self, tokens: list, error: BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self._on_done, tokens, error)
        except RuntimeError:
            pass  # loop closed during shutdown

    def _on_done(self, tokens: list, error: BaseException | None) -> None:
        ok = error is None
        if not ok and not self.failing:
            self.failing = True
            log.error("database write failed; publishers are nacked until it recovers: %s", error)
            self.on_health(False, str(error))
        elif ok and self.failing:
            self.failing = False
            log.warning("database writes succeed again")
            self.on_health(True, "")
        for token in tokens:
            if token is not None:
                token.fire(ok)
        if ok:
            for fn in list(self.on_commit):
                fn()

    # -- message hooks (hot path) ----------------------------------------------------------------
    def append(self, q, msg) -> Waiter:
        """A message row of a classic or quorum queue (its commit is fsynced)."""
        self._sync = True
        self._appends.append(StoredMessage(q.store_id, msg.seq, msg.exchange, msg.routing_key,
                                           msg.properties, msg.body, msg.created_ms or int(time.time() * 1000),
                                           msg.expires_ms, msg.priority))
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = Waiter()
            self._schedule()
        msg.stored = waiter  # truthy; .done/.ok tell whether the row is committed
        return waiter

    def append_log(self, q, msg) -> Waiter:
        """A stream's append (``msg.seq`` one above its last): stored with the others of this
        turn as a chunk of its log; the commit is fsynced only with ``--stream-fsync`` (or when
        something else in the batch needs it)."""
        if self.fsync_streams:
            self._sync = True
        entries = self._logs.get(q.store_id)
        if entries is None:
            self._logs[q.store_id] = [msg]
        else:
            entries.append(msg)
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = Waiter()
            self._schedule()
        msg.stored = waiter
        return waiter

    def remove(self, msg) -> None:
        q = msg.queue
        if q is None or q.store_id is None or q.deleted:
            return
        self._removes.append((q.store_id, msg.seq))
        self._sync = True
        self._schedule()

    def mark_delivered(self, msg) -> None:
        q = msg.queue
        if q is None or q.store_id is None or q.deleted:  # (a queue handed to another node writes nothing)
            return
        marks = self._marks
        if marks.get(q.store_id, 0) < msg.seq:
            marks[q.store_id] = msg.seq
            self._sync = True
            self._schedule()

    def messages_purged(self, q, msgs) -> None:
        if not q.durable or q.store_id is None or q.deleted:
            return
        self.flush()
        waiter = self.pending_definition = Waiter()  # purge-ok waits for it too
        self.writer.submit(waiter, purges=(q.store_id,))

    # -- paging: reads off the loop ----------------------------------------------------------------
    refill_batch = 5000

    def attach(self, q, window: int) -> None:
        """Let a durable queue page: held messages are evicted after commits, refills read rows back."""
        if not q.pages_to_store:  # e.g. a stream: it reads its log back itself
            return
        q.page_window = window
        q.window = window if q.pageable else 0
        q.refill = self.refill
        self.paging_queues.add(q)

    def _evict_all(self) -> None:
        for q in list(self.paging_queues):
            if q.deleted:
                self.paging_queues.discard(q)
            elif q.held:
                q.evict()

    def refill(self, q) -> None:
        epoch, cursor = q.page_epoch, q.page_cursor
        limit = min(self.refill_batch, q.paged)
        if q.window:  # read back no more than fills the in-memory window (large messages!)
            limit = min(limit, max(1, q.window - len(q.ready)))
        self.read(_load_messages, q.store_id, cursor, limit,
                  done=lambda rows, exc: self._refilled(q, epoch, rows, exc))

    def _refilled(self, q, epoch: int, rows, exc: BaseException | None) -> None:
        if exc is not None:
            log.error("reading queue '%s' back from the store failed: %s", q.name, exc)
            q.refilling = False
            self.loop.call_later(1.0, q.maybe_refill)
            return
        q.refilled([message_from_row(q, r) for r in rows], epoch)


def _answer(fut: asyncio.Future, done: Callable) -> None:
    if fut.cancelled():  # the loop is shutting down
        return
    exc = fut.exception()
    if exc is not None:
        done(None, exc)
    else:
        done(fut.result(), None)


def _load_messages(store, queue_id: int, after_seq: int, limit: int) -> list[StoredMessage]:
    return store.load_messages(queue_id, after_seq, limit)


def message_from_row(q, r: StoredMessage):
    from exchange_broker.core.message import Message
    m = Message(r.exchange, r.routing_key, r.properties, r.body, True, r.priority)
    m.seq = r.seq
    m.stored = True
    m.redelivered = r.redelivered
    m.queue = q
    m.created_ms = r.created_ms
    m.expires_ms = r.expires_ms
    return m
