"""Messages held by ``x-delayed-message`` exchanges until due (the timer, heap and window logic).

Behaves like RabbitMQ's rabbitmq_delayed_message_exchange plugin (the exchange type itself,
with its ``x-delayed-type`` rules, is ``routing/delayed.py``):

* a message published with an ``x-delay`` header (milliseconds; integer
  types, floats truncated, decimal strings parsed, as the plugin does) with
  0 < delay <= 2^32-1 is held until due, then routed through the exchange's
  bindings *at that time*, with its ``x-delay`` header set to ``-delay``
  (the plugin's marker that a message went through the delay); anything
  else routes at once, unchanged;
* ``mandatory`` cannot be honoured (the route is only known later): a held
  message counts as routed, so no basic.return, as in the plugin.

Unlike the plugin it is durable and scales: a persistent message
(delivery_mode 2) published to a *durable* delayed exchange is written to
the store through the durability's ordered writer (``durability/delayed_writes.py``),
and the publisher confirm waits for that commit. Only a time window of pending
messages lives in memory (a heap keyed by (due_ms, id)): messages whose key
is at or beyond the *horizon* stay in the store only and are read back, a
window at a time, by the ``(due_ms, id)`` index as time advances. A single
timer (``broker.clock``) is armed for the earliest due message. When a stored
message is routed, its row is deleted by the same ordered writer *after* the
routed copies' appends, so a crash in between duplicates, never loses.

Sizes: ``EXCHANGE_BROKER_DELAYED_WINDOW_MS`` (default 60 000) is how far ahead
the next window is read (from half of it before the horizon is reached) and
``EXCHANGE_BROKER_DELAYED_MEMORY`` (default 100 000) caps the stored messages
held in memory; reads go 5 000 rows at a time. Row deletes of routed messages
are batched (every 50 ms), so a crash re-routes up to that much: duplicates.

Window loads race with publishes; the rules that keep them exact:
  * before reading, a "fence" goes through the writer, so every insert
    submitted before the load is committed when the read starts;
  * publishes made while a load is in flight, falling inside the window being
    loaded, are *parked* in memory and sorted in (heap or store) once the
    load tells where the new horizon is; rows of theirs that the read also
    returns are de-duplicated by id.

Messages that are not persistent, or sent to a non-durable delayed exchange,
are held in memory only and lost on a restart (the plugin keeps them all).
Until :meth:`DelayedExchanges.recover` switches the store on (a broker whose
durability stores nothing never does), every pending message is in the heap.
Without timers (``NoClock``) nothing is released.

Not like the plugin: an exchange-to-exchange binding *into* a delayed
exchange routes through its bindings at once (the plugin would delay there).
"""

from __future__ import annotations

import heapq
import logging
import math
import os
from typing import TYPE_CHECKING, Protocol

from routing.delayed import X_DELAYED

from exchange_broker.core.delay_header import X_DELAY, message_delay
from exchange_broker.core.message import Message, from_wire
from exchange_broker.protocol import codec

if TYPE_CHECKING:
    from exchange_broker.core.clock import Clock
    from exchange_broker.core.ports import DelayedDurability
    from exchange_broker.core.exchange import Exchange
    from exchange_broker.core.vhost import VHost

log = logging.getLogger("exchange_broker.delayed")

NO_HORIZON = (1 << 62, 0)  # without a store everything is below the horizon: in memory

RELEASE_BATCH = 1000  # messages routed per callback (~20 ms) before yielding to the loop
LOAD_CHUNK = 5_000  # rows per store read: ~7 ms of loop time to sort in, short GIL holds
DELETE_FLUSH_S = 0.05  # rows of routed messages are deleted in batches at most this often
DELETE_FLUSH_ROWS = 5000
EARLY_MS = 1.0  # a message due within this many ms is released now (timer/clock rounding)
RETRY_RELEASE_S = 0.5  # a node that may not route due messages now (cluster) looks again after this
RETRY_ROUTE_MS = 1000  # a released message whose copies were not all stored is routed again after this
TICK_S = 0.25  # how often the store is checked for the next window

def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# -- pending messages -----------------------------------------------------------------------------
# A pending message is one flat tuple of ints, strings and bytes, ordered by (due_ms, id):
#   (due_ms, id, vhost, exchange, routing_key, properties, body, stored, created_ms)
# Tuples of atomic values are untracked by the cyclic GC, so millions of them cost no GC pauses.
DUE, ID, VHOST, EXCHANGE, ROUTING_KEY, PROPERTIES, BODY, STORED, CREATED = range(9)


def entries_from_rows(rows) -> list[tuple]:
    """Stored rows (attributes due_ms, id, vhost, ...) as pending entries; the durability runs it
    off the event loop, next to the read."""
    return [(r.due_ms, r.id, r.vhost, r.exchange, r.routing_key, r.properties, r.body, True,
             r.created_ms) for r in rows]


def row_of(e: tuple) -> tuple:
    """The store row of a pending entry: (id, vhost, exchange, routing_key, properties, body,
    due_ms, created_ms)."""
    return (e[ID], e[VHOST], e[EXCHANGE], e[ROUTING_KEY], e[PROPERTIES], e[BODY], e[DUE],
            e[CREATED])


class Broker(Protocol):
    """What the manager uses of ``core/broker.Broker`` (which creates it)."""

    clock: "Clock"
    durability: "DelayedDurability"  # core/ports.NullDurability or durability/sql.SqlDurability
    vhosts: dict[str, "VHost"]
    stats: dict[str, int]

    def publish(self, vhost: "VHost", ex: "Exchange", msg: Message, has_headers: bool,
                publisher=None): ...


class DelayedExchanges:
    """Holds every pending delayed message of the broker and routes each when due.

    The broker calls :meth:`publish` for exchanges whose type holds messages and
    :meth:`exchange_deleted`; the application calls :meth:`recover` once the store is restored
    and :meth:`close` before the durability stops."""

    def _now_ms(self) -> float:
        """The clock's wall time in ms: due times are stored, so they must survive a restart."""
        return self.clock.wall() * 1000

    def __init__(self, broker: "Broker", *, window_ms: int | None = None,
                 max_in_memory: int | None = None) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.window_ms = window_ms or _env_int("EXCHANGE_BROKER_DELAYED_WINDOW_MS", 60_000)
        self.max_in_memory = max_in_memory or _env_int("EXCHANGE_BROKER_DELAYED_MEMORY", 100_000)
        self.prefetch_ms = self.window_ms // 2  # load the next window this long before the horizon
        self.low_water = max(1, self.max_in_memory // 4)
        self.load_chunk = max(1, min(LOAD_CHUNK, self.max_in_memory))
        self.heap: list[tuple] = []  # pending entries, a heap by (due_ms, id)
        self.next_id = 1
        self._timer = None
        self._timer_due = 0
        self._releasing = False
        # the store: the broker's durability once recover() switched it on (None: memory only)
        self.store = None
        self.horizon = NO_HORIZON  # stored entries with (due, id) >= horizon are in the store only
        self.spilled = 0  # stored rows beyond the horizon (an estimate, for stats)
        self.mem_stored = 0  # stored entries in the heap (what the memory window bounds)
        self.loading = False
        self.load_until = 0
        self.parked: dict[int, tuple] = {}
        self.gone_while_loading: set[tuple[str, str]] = set()
        self.last_load_full = False
        self._retry_at = 0.0
        self._deletes: list[int] = []
        self._delete_handle = None
        self._tick_handle = None
        self.closed = False
        # a cluster with per-queue leaders (cluster/delayed_leader.py): elsewhere(vhost, exchange,
        # message, publisher) -> the waiter of the node that holds delayed messages, or None (here);
        # may_release() -> False while this node must not route due messages (its lease may be gone)
        self.elsewhere = None
        self.may_release = lambda: True
        self.stats = {"forwarded": 0, "retried": 0,
                      "delayed": 0, "released": 0, "dropped": 0, "loaded": 0, "loads": 0,
                      "parked": 0, "spilled": 0, "loaded_overdue": 0,
                      # routed later than due (broker side, from the timer's point of view)
                      "late_over_10ms": 0, "late_over_50ms": 0, "late_max_ms": 0.0}

    # -- exchange deleted ----------------------------------------------------------------------
    def exchange_deleted(self, ex: "Exchange") -> None:
        """Drop the exchange's pending messages, in memory and in the store."""
        if ex.type != X_DELAYED:
            return
        vhost, name = ex.vhost, ex.name
        before = len(self.heap)
        self.heap = [e for e in self.heap if e[EXCHANGE] != name or e[VHOST] != vhost]
        if len(self.heap) != before:
            heapq.heapify(self.heap)
            self.mem_stored = sum(1 for e in self.heap if e[STORED])
            self.stats["dropped"] += before - len(self.heap)
            self._rearm()
        if self.parked:
            self.parked = {i: e for i, e in self.parked.items()
                           if e[EXCHANGE] != name or e[VHOST] != vhost}
        if self.loading:
            self.gone_while_loading.add((ex.vhost, ex.name))
        if self.store is not None and ex.durable:
            self.store.delayed_delete_exchange(vhost, name)  # later inserts go after the delete

    # -- publish -------------------------------------------------------------------------------
    def publish(self, vhost: "VHost", ex: "Exchange", msg: Message, publisher=None):
        """Hold the message if it carries a valid x-delay: (True, waiter or None, False) like the
        broker's publish; None routes it now (the normal path)."""
        if self._releasing:
            return None
        delay = message_delay(msg)
        if delay is None:
            return None
        if self.elsewhere is not None:  # a cluster: another node may hold the delayed messages
            waiter = self.elsewhere(vhost, ex, msg, publisher)
            if waiter is not None:
                self.stats["forwarded"] += 1
                return True, waiter, False
        now = math.ceil(self._now_ms())
        stored = self.store is not None and msg.persistent and ex.durable
        e = (now + delay, self.next_id, vhost.name, ex.name, msg.routing_key,
             codec.replace_int_header(msg.properties, X_DELAY, -delay), msg.body, stored, now)
        self.next_id += 1
        self.stats["delayed"] += 1
        waiter = self.store.delayed_insert(row_of(e)) if stored else None
        self._place(e)
        return True, waiter, False

    def _place(self, e: tuple) -> None:
        if not e[STORED] or e < self.horizon:  # tuple order: (due, id) first, ids are unique
            self.mem_stored += e[STORED]
            heapq.heappush(self.heap, e)
            if self.heap[0] is e:
                self._arm()
        elif self.loading and e[DUE] < self.load_until:
            self.parked[e[ID]] = e  # sorted in when the load in flight tells the new horizon
            self.stats["parked"] += 1
        else:
            self.spilled += 1  # only its row (being inserted) holds it
            self.stats["spilled"] += 1

    @property
    def pending(self) -> int:
        """Pending delayed messages: in memory plus (estimated) in the store only."""
        return len(self.heap) + len(self.parked) + max(0, self.spilled)

    # -- timer and release -----------------------------------------------------------------------
    def _arm(self) -> None:
        """Make sure a timer is set for the earliest message."""
        if not self.heap or self.closed:
            return
        due = self.heap[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        wait = (due - self._now_ms()) / 1000.0
        self._timer_due = due
        if wait <= 0:
            self._timer = self.clock.call_soon(self._fire)
        else:
            self._timer = self.clock.call_later(wait, self._fire)

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm()

    def _fire(self) -> None:
        self._timer = None
        if not self.may_release():
            self._timer_due = 0
            self._timer = self.clock.call_later(RETRY_RELEASE_S, self._fire)
            return
        heap = self.heap
        now = self._now_ms()
        limit = now + EARLY_MS
        n = 0
        if heap and heap[0][0] <= limit:
            late = now - heap[0][0]  # the earliest is the latest: one look per callback
            stats = self.stats
            if late > 10:
                stats["late_over_10ms"] += 1
                if late > 50:
                    stats["late_over_50ms"] += 1
                if late > stats["late_max_ms"]:
                    stats["late_max_ms"] = round(late, 1)
        while heap and heap[0][0] <= limit and n < RELEASE_BATCH:
            self._release(heapq.heappop(heap))
            n += 1
        if self._deletes:
            self._schedule_deletes()
        self._arm()
        if self.store is not None:
            self._maybe_load()

    def _release(self, e: tuple) -> None:
        _due, id, vhost, exchange, routing_key, properties, body, stored, _created = e
        broker = self.broker
        vh = broker.vhosts.get(vhost)
        ex = vh.exchanges.get(exchange) if vh is not None else None
        waiter = None
        if ex is None or ex.type != X_DELAYED:  # (deleting the exchange drops its entries anyway)
            self.stats["dropped"] += 1
        else:
            broker.stats["publish"] -= 1  # counted when the client published it
            ex.stats_in -= 1  # so is the exchange's publish_in
            self._releasing = True
            try:
                # per-message TTL runs from the enqueue, i.e. from now (the user-id was checked
                # when the client published it)
                waiter = broker.publish(vh, ex, from_wire(ex.name, routing_key, properties, body), True, None)[1]
            except Exception:
                log.exception("routing delayed message %d from %s failed", id,
                              vh.describe("exchange", ex.name))
            finally:
                self._releasing = False
            self.stats["released"] += 1
        if stored:
            self.mem_stored -= 1
            if waiter is None or (waiter.done and waiter.ok):
                self._deletes.append(id)
            else:  # its row goes once the routed copies are stored (another node's queue: confirmed)
                waiter.add(self._routed, e)

    def _routed(self, e: tuple, ok: bool) -> None:
        if self.closed:
            return
        if ok:
            self._deletes.append(e[ID])
            self._schedule_deletes()
            return
        # a copy was not stored (its queue's leader refused it or could not be reached): route it
        # again a moment later; its row stays until then (a copy that did arrive gets a duplicate)
        self.stats["retried"] += 1
        again = (math.ceil(self._now_ms()) + RETRY_ROUTE_MS,) + e[1:]
        heapq.heappush(self.heap, again)
        self.mem_stored += 1
        self._arm()

    # -- store -------------------------------------------------------------------------------------
    def recover(self) -> dict:
        """After the store is restored and its writer started: keep stored delayed messages in the
        broker's durability from now on, continue ids and start loading the first window (overdue
        messages route at once). Returns at once with {"delayed_messages": rows in the store};
        a durability that stores nothing leaves every message in memory."""
        durability = self.broker.durability
        if not durability.enabled:
            return {"delayed_messages": 0}
        self.store = durability
        self.horizon = (0, 0)  # nothing in memory yet: the first load brings the first window
        count, max_id, min_due = durability.delayed_stats()
        self.next_id = max(self.next_id, max_id + 1)
        self.spilled = count
        if count:
            log.info("recovering %d delayed messages (earliest due %s ms from now)", count,
                     min_due - int(self._now_ms()))
        self._maybe_load()
        self._tick()
        return {"delayed_messages": count}

    def close(self) -> None:
        """Stop timers and loads; queue the pending row deletes (call before the writer stops)."""
        if self.stats["delayed"] or self.stats["loaded"]:
            log.info("delayed messages: %d pending; %s", self.pending, self.stats)
        if self._deletes:
            self._flush_deletes()
        self.closed = True
        for h in (self._timer, self._tick_handle, self._delete_handle):
            if h is not None:
                h.cancel()
        self._timer = self._tick_handle = self._delete_handle = None

    def _schedule_deletes(self) -> None:
        """Delete rows of routed messages in batches: soon, and always after their copies' appends
        (a crash before the delete routes them again after the restart: duplicates, no loss)."""
        if len(self._deletes) >= DELETE_FLUSH_ROWS:
            self._flush_deletes()
        elif self._delete_handle is None:
            self._delete_handle = self.clock.call_later(DELETE_FLUSH_S, self._flush_deletes)

    def _flush_deletes(self) -> None:
        if self._delete_handle is not None:
            self._delete_handle.cancel()
            self._delete_handle = None
        ids, self._deletes = self._deletes, []
        if not ids or self.store is None:
            return
        self.store.delayed_delete(ids)  # written after every message append submitted before

    def _tick(self) -> None:
        self._tick_handle = None
        if self.closed:
            return
        self._maybe_load()
        self._tick_handle = self.clock.call_later(TICK_S, self._tick)

    def _maybe_load(self) -> None:
        if self.loading or self.closed:
            return
        now = self._now_ms()
        if now < self._retry_at:
            return
        room = self.max_in_memory - self.mem_stored
        if self.mem_stored < self.low_water or (
                room >= self.load_chunk // 2 and now + self.prefetch_ms >= self.horizon[0]):
            if self.last_load_full or now + self.prefetch_ms >= self.horizon[0]:
                self._start_load(int(now), max(1, min(self.load_chunk, room)))

    def _start_load(self, now: int, limit: int) -> None:
        self.loading = True
        self.load_until = until = max(now + self.window_ms, self.horizon[0] + 1)
        self.parked = {}
        self.gone_while_loading = set()
        start = self.horizon
        # inserts after the fence are not guaranteed visible to the read: they get parked
        self.store.delayed_fence(lambda: self._read(start, until, limit))

    def _read(self, start: tuple[int, int], until: int, limit: int) -> None:
        if self.closed:
            return
        self.store.delayed_load(start, until, limit,
                                lambda rows, exc: self._loaded(rows, exc, until, limit))

    def _loaded(self, rows: list[tuple] | None, exc: BaseException | None, until: int,
                limit: int) -> None:
        self.loading = False
        parked, self.parked = self.parked, {}
        gone, self.gone_while_loading = self.gone_while_loading, set()
        if exc is not None:
            log.error("reading delayed messages from the store failed (retrying in 1 s): %s", exc)
            self._retry_at = self._now_ms() + 1000
            self.spilled += len(parked)  # their rows are (being) written: the next load finds them
            return
        now = self._now_ms()
        self.stats["loads"] += 1
        full = len(rows) >= limit
        horizon = (rows[-1][DUE], rows[-1][ID] + 1) if full else (until, 0)
        vhosts = self.broker.vhosts
        heap = self.heap
        head = heap[0] if heap else None
        push = heapq.heappush
        for e in rows:
            if e[ID] in parked or (e[VHOST], e[EXCHANGE]) in gone:
                continue
            self.spilled -= 1
            vh = vhosts.get(e[VHOST])
            ex = vh.exchanges.get(e[EXCHANGE]) if vh is not None else None
            if ex is None or ex.type != X_DELAYED:
                self._deletes.append(e[ID])  # its exchange is gone
                self.stats["dropped"] += 1
                continue
            push(heap, e)
            self.mem_stored += 1
            self.stats["loaded"] += 1
            if e[DUE] < now:
                self.stats["loaded_overdue"] += 1
        for e in parked.values():
            if e < horizon:
                push(heap, e)
                self.mem_stored += 1
            else:
                self.spilled += 1
        log.debug("loaded %d delayed messages (%d parked) up to %s; %d in memory", len(rows),
                  len(parked), horizon, len(heap))
        self.horizon = horizon
        self.last_load_full = full
        self.spilled = max(0, self.spilled)
        if self._deletes:
            self._schedule_deletes()
        if heap and heap[0] is not head:
            self._rearm()
        if full:
            self._maybe_load()  # the next chunk of this window, or of a backlog after downtime
