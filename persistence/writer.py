"""Group-commit writer: one thread merges queued message operations into single transactions."""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .store import Store, StoredMessage

log = logging.getLogger("exchange_broker.persistence")

OnDone = Callable[[list[object], BaseException | None], None]


@dataclass
class _Op:
    token: object
    appends: tuple[StoredMessage, ...]
    removes: tuple[tuple[int, int], ...]
    marks: dict[int, int]
    purges: tuple[int, ...]
    sync: bool = True  # False: its commit need not be fsynced (stream appends only)
    logs: dict[int, list] | None = None  # stream appends: {queue id: consecutive messages}


@dataclass
class _Call:
    """An ordered barrier: ``fn(store)`` runs alone, after everything submitted before it."""

    token: object
    fn: Callable[[Store], object]


@dataclass
class MergedBatch:
    """Several submits folded into one write_batch call with the same net effect."""

    appends: dict[tuple[int, int], StoredMessage] = field(default_factory=dict)
    removes: dict[tuple[int, int], None] = field(default_factory=dict)  # ordered set
    marks: dict[int, int] = field(default_factory=dict)
    purges: dict[int, None] = field(default_factory=dict)  # ordered set
    sync: bool = False  # some submit folded in needs its commit fsynced
    logs: dict[int, list] = field(default_factory=dict)  # stream appends, in order per log

    def add(
        self,
        appends: Iterable[StoredMessage],
        removes: Iterable[tuple[int, int]],
        marks: dict[int, int],
        purges: Iterable[int],
        logs: dict[int, list] | None = None,
    ) -> None:
        # within one submit write_batch's order applies: purges, appends, removes, marks
        for qid in purges:
            self.purges[qid] = None
            self.logs.pop(qid, None)
            self.appends = {k: m for k, m in self.appends.items() if k[0] != qid}
            self.removes = {k: None for k in self.removes if k[0] != qid}
        for m in appends:
            self.appends[(m.queue_id, m.seq)] = m
        for key in removes:
            key = (key[0], key[1])
            if self.appends.pop(key, None) is None:
                self.removes[key] = None  # not appended in this batch: delete the stored row
        for qid, mark in marks.items():
            if mark > self.marks.get(qid, mark - 1):
                self.marks[qid] = mark
        if logs:
            for qid, entries in logs.items():
                have = self.logs.get(qid)
                if have is None:
                    self.logs[qid] = list(entries)
                else:
                    have.extend(entries)

    def write(self, store: Store) -> None:
        args = (list(self.appends.values()), list(self.removes), dict(self.marks), list(self.purges))
        kw: dict = {"logs": self.logs} if self.logs else {}
        if not self.sync:  # every submit in it said so (stream appends): a commit without fsync
            kw["sync"] = False
        store.write_batch(*args, **kw)


class GroupCommitWriter:
    def __init__(self, store: Store, on_done: OnDone, max_batch: int = 2000) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._store = store
        self._on_done = on_done
        self._max_batch = max_batch
        self._queue: deque[_Op | _Call] = deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._carry: MergedBatch | None = None  # removes/marks/purges of a failed batch, retried
        self._failures = 0  # consecutive failed batches (an outage): only the first logs a traceback

    @property
    def pending(self) -> int:
        """Submits queued or being written, not yet reported through on_done."""
        with self._cond:
            return len(self._queue) + self._in_flight

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                raise RuntimeError("writer already started")
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run, name="persistence-writer", daemon=True
            )
            self._thread.start()

    def submit(
        self,
        token: object,
        appends: Iterable[StoredMessage] = (),
        removes: Iterable[tuple[int, int]] = (),
        delivered_marks: dict[int, int] | None = None,
        purges: Iterable[int] = (),
        sync: bool = True,
        logs: dict[int, list] | None = None,
    ) -> None:
        """Queue one operation. ``sync=False``: its commit need not be fsynced (it must still
        reach the OS before ``on_done``: a process crash loses nothing); a batch is committed
        without fsync only when every submit folded into it says so. ``logs``: stream appends
        ({queue id: consecutive messages}, handed over: the caller must not change it)."""
        self._enqueue(
            _Op(token, tuple(appends), tuple(removes), dict(delivered_marks or {}), tuple(purges),
                sync, logs or None)
        )

    def submit_call(self, token: object, fn: Callable[[Store], object]) -> None:
        """Run ``fn(store)`` on the writer thread as an ordered barrier (e.g. a definition write):
        submits queued before it are committed first, those after it are written after it.
        Reported like a batch: ``on_done([token], error)``."""
        self._enqueue(_Call(token, fn))

    def _enqueue(self, item: _Op | _Call) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("writer is stopped")
            self._queue.append(item)  # before start() it waits for the thread
            if len(self._queue) == 1:
                self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Flush everything queued, then stop the thread; later submits raise RuntimeError."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            log.error("persistence writer did not stop within %.1fs (%d pending)", timeout, self.pending)
            return
        with self._cond:
            self._thread = None

    def _take(self) -> list[_Op | _Call] | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None  # stopping and fully drained
            if isinstance(self._queue[0], _Call):
                items: list[_Op | _Call] = [self._queue.popleft()]
            else:  # a run of message ops, up to the next barrier call
                items = []
                while self._queue and len(items) < self._max_batch:
                    if isinstance(self._queue[0], _Call):
                        break
                    items.append(self._queue.popleft())
            self._in_flight = len(items)
            return items

    def _execute(self, items: list[_Op | _Call]) -> None:
        first = items[0]
        if isinstance(first, _Call):
            first.fn(self._store)
            return
        batch = MergedBatch()
        carry, self._carry = self._carry, None
        if carry is not None:
            # acks, delivered marks and purges of a failed batch are retried first: an outage
            # must not bring acked messages back after a restart
            batch.add((), carry.removes, carry.marks, carry.purges)
            batch.sync = True
        for op in items:
            assert isinstance(op, _Op)
            batch.add(op.appends, op.removes, op.marks, op.purges, op.logs)
            if op.sync:
                batch.sync = True
        try:
            batch.write(self._store)
        except Exception:
            if batch.removes or batch.marks or batch.purges:
                leftover = MergedBatch()
                leftover.add((), list(batch.removes), dict(batch.marks), list(batch.purges))
                self._carry = leftover
            raise

    def _run(self) -> None:
        while True:
            ops = self._take()
            if ops is None:
                return
            error: BaseException | None = None
            try:
                self._execute(ops)
                self._failures = 0
            except Exception as exc:  # reported to the caller, writer keeps running
                error = exc
                what = "call" if isinstance(ops[0], _Call) else f"write of {len(ops)} operations"
                # a database outage fails every batch: one traceback, then one short line per 100
                self._failures += 1
                if self._failures == 1:
                    log.error("persistence %s failed: %s", what, exc, exc_info=exc)
                else:
                    (log.error if self._failures % 100 == 0 else log.debug)("persistence %s failed (%d in a row): %s", what, self._failures,
                              str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            tokens = [op.token for op in ops]
            with self._cond:
                self._in_flight = 0
            try:
                self._on_done(tokens, error)
            except Exception:
                log.exception("persistence on_done callback raised")
