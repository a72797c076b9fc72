"""The delayed-message exchange: exchange type ``x-delayed-message``.

Behaves like RabbitMQ's rabbitmq_delayed_message_exchange plugin:

* declaring requires the argument ``x-delayed-type`` (direct, fanout, topic,
  headers): missing or not a string is 406 PRECONDITION_FAILED ("Invalid
  argument, 'x-delayed-type' must be an existing exchange type"), an unknown
  type name is 503 COMMAND_INVALID like any unknown exchange type. Bindings
  and routing are those of the x-delayed-type;
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
the ``delayed_messages`` table through the ordered group-commit writer, and
the publisher confirm waits for that commit. Only a time window of pending
messages lives in memory (a heap keyed by (due_ms, id)): messages whose key
is at or beyond the *horizon* stay in the store only and are read back, a
window at a time, by the ``(due_ms, id)`` index as time advances. A single
``loop.call_at`` timer is armed for the earliest due message. When a stored
message is routed, its row is deleted by the same ordered writer *after* the
routed copies' appends, so a crash in between duplicates, never loses.

Sizes: ``EXCHANGE_BROKER_DELAYED_WINDOW_MS`` (default 60 000) is how far ahead
the next window is read (from half of it before the horizon is reached) and
``EXCHANGE_BROKER_DELAYED_MEMORY`` (default 100 000) caps the stored messages
held in memory; reads go 5 000 rows at a time. Row deletes of routed messages
are batched (every 50 ms), so a crash re-routes up to that much: duplicates.

Window loads race with publishes; the rules that keep them exact:
  * before reading, a no-op "fence" call goes through the writer, so every
    insert submitted before the load is committed when the read starts;
  * publishes made while a load is in flight, falling inside the window being
    loaded, are *parked* in memory and sorted in (heap or store) once the
    load tells where the new horizon is; rows of theirs that the read also
    returns are de-duplicated by id.

Messages that are not persistent, or sent to a non-durable delayed exchange,
are held in memory only and lost on a restart (the plugin keeps them all).
Without a store (``--in-memory`` or the in-process test broker) every
pending message is in the heap.

Not like the plugin: an exchange-to-exchange binding *into* a delayed
exchange routes through its bindings at once (the plugin would delay there).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import os
import re
import struct
import threading
import time
from decimal import Decimal
from typing import TYPE_CHECKING

import routing

from exchange_broker.core.ports import Waiter
from exchange_broker.core.message import Message
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import COMMAND_INVALID, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from exchange_broker.core.broker import Broker
    from exchange_broker.core.exchange import Exchange
    from exchange_broker.core.vhost import VHost

log = logging.getLogger("exchange_broker.delayed")

X_DELAYED = "x-delayed-message"
MAX_DELAY = 2 ** 32 - 1  # the plugin's bound (Erlang's max timer); beyond it: no delay
BASE_TYPES = ("direct", "fanout", "topic", "headers")
INVALID_TYPE = "Invalid argument, 'x-delayed-type' must be an existing exchange type"
NO_HORIZON = (1 << 62, 0)  # without a store everything is below the horizon: in memory

RELEASE_BATCH = 1000  # messages routed per callback (~20 ms) before yielding to the loop
LOAD_CHUNK = 5_000  # rows per store read: ~7 ms of loop time to sort in, short GIL holds
DELETE_FLUSH_S = 0.05  # rows of routed messages are deleted in batches at most this often
DELETE_FLUSH_ROWS = 5000
EARLY_MS = 1.0  # a message due within this many ms is released now (timer/clock rounding)

_INT_STR = re.compile(r"[+-]?[0-9]+\Z")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# -- the x-delay header ---------------------------------------------------------------------------
def delay_of(headers: dict | None) -> int | None:
    """The delay in ms when the message must be held, else None (route now)."""
    if not headers:
        return None
    return delay_value(headers.get("x-delay"))


def delay_value(value) -> int | None:
    """The plugin's reading of an x-delay value: integer types as they are, floats and decimals
    truncated, strings parsed as a decimal integer; held only when 0 < delay <= 2^32-1."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        delay = value
    elif isinstance(value, (float, Decimal)):
        if not math.isfinite(value):
            return None
        delay = int(value)  # truncated, like the plugin
    elif isinstance(value, (str, bytes)):
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return None
        if not _INT_STR.match(value):
            return None
        delay = int(value)
    else:  # byte arrays, timestamps, tables, arrays, void
        return None
    return delay if 0 < delay <= MAX_DELAY else None


_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("U"): 2,
          ord("I"): 4, ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8,
          ord("D"): 5, ord("T"): 8, ord("V"): 0, 0: 0}
_SIZED = {ord("S"), ord("x"), ord("A"), ord("F")}
_NUMBER = {ord(k): struct.Struct(f) for k, f in (("b", ">b"), ("B", ">B"), ("s", ">h"), ("u", ">H"),
                                                  ("U", ">h"), ("I", ">i"), ("i", ">I"), ("l", ">q"),
                                                  ("L", ">q"), ("f", ">f"), ("d", ">d"))}
_X_DELAY = b"\x07x-delay"
_UNREADABLE = object()
_NOT_A_DELAY = object()


def _headers_span(raw: bytes) -> tuple[int, int] | None:
    """(start, end) of the headers field table's entries in raw content-header properties."""
    flags, pos = codec.headers_offset(raw)
    if not flags & codec.FLAG_HEADERS:
        return None
    end = pos + 4 + int.from_bytes(raw[pos:pos + 4], "big")
    return (pos + 4, end) if end <= len(raw) else None


def _entries(raw: bytes, start: int, end: int):
    """(key start, type position, value end) of each field-table entry; stops (with None) at a
    type it cannot size."""
    pos = start
    while pos < end:
        tpos = pos + 1 + raw[pos]
        kind = raw[tpos]
        size = _FIXED.get(kind)
        if size is not None:
            vend = tpos + 1 + size
        elif kind in _SIZED:
            vend = tpos + 5 + int.from_bytes(raw[tpos + 1:tpos + 5], "big")
        else:
            yield None
            return
        if vend > end:
            yield None
            return
        yield pos, tpos, vend
        pos = vend


def raw_x_delay(raw: bytes):
    """The x-delay header's value read straight from raw properties (no full decode): None when
    absent, ``_UNREADABLE`` when the table holds a type this scanner cannot size."""
    try:
        span = _headers_span(raw)
        if span is None or _X_DELAY not in raw:
            return None
        value = None
        for entry in _entries(raw, *span):
            if entry is None:
                return _UNREADABLE
            pos, tpos, vend = entry
            if raw[pos:tpos] != _X_DELAY:
                continue
            kind = raw[tpos]
            if kind in _NUMBER:
                value = _NUMBER[kind].unpack_from(raw, tpos + 1)[0]
            elif kind == 68:  # 'D': scale octet, signed 32-bit unscaled value
                value = Decimal(int.from_bytes(raw[tpos + 2:tpos + 6], "big", signed=True)) \
                    .scaleb(-raw[tpos + 1])
            elif kind == 83:  # 'S'
                value = bytes(raw[tpos + 5:vend])
            elif kind == 116:  # 't'
                value = bool(raw[tpos + 1])
            else:
                value = _NOT_A_DELAY  # byte arrays, timestamps, tables, arrays, void
        return value
    except (IndexError, struct.error):
        return _UNREADABLE


def negate_delay_header(raw: bytes, delay: int) -> bytes:
    """Raw content-header properties with ``x-delay`` set to ``-delay`` (the plugin's marker that
    the message went through the delay, so it is not delayed again on an exchange-to-exchange hop);
    every other byte, and so every other header's wire type, is kept."""
    if -delay >= -(2 ** 31):
        new_value = b"I" + struct.pack(">i", -delay)
    else:
        new_value = b"l" + struct.pack(">q", -delay)
    try:
        span = _headers_span(raw)
        if span is None:
            return raw
        start, end = span
        out = bytearray()
        for entry in _entries(raw, start, end):
            if entry is None:
                return raw  # a type we cannot skip: leave the properties alone
            pos, tpos, vend = entry
            if raw[pos:tpos] == _X_DELAY:
                out += raw[pos:tpos] + new_value
            else:
                out += raw[pos:vend]
    except IndexError:
        return raw
    return raw[:start - 4] + len(out).to_bytes(4, "big") + bytes(out) + raw[end:]


# -- pending messages -----------------------------------------------------------------------------
# A pending message is one flat tuple of ints, strings and bytes, ordered by (due_ms, id):
#   (due_ms, id, vhost, exchange, routing_key, properties, body, stored, created_ms)
# Tuples of atomic values are untracked by the cyclic GC, so millions of them cost no GC pauses.
DUE, ID, VHOST, EXCHANGE, ROUTING_KEY, PROPERTIES, BODY, STORED, CREATED = range(9)


def _entries_from_rows(rows) -> list[tuple]:
    return [(r.due_ms, r.id, r.vhost, r.exchange, r.routing_key, r.properties, r.body, True,
             r.created_ms) for r in rows]


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
        from persistence.delayed_store import insert_delayed
        with self.lock:
            self.closed = True
            rows, self.rows = self.rows, []
        insert_delayed(store, rows)


def _noop(store) -> None:
    return None


class DelayedExchanges:
    """Registers the exchange type and holds every pending delayed message of the broker."""

    def __init__(self, broker: "Broker", *, window_ms: int | None = None,
                 max_in_memory: int | None = None) -> None:
        self.broker = broker
        broker.extra_exchange_types[X_DELAYED] = self.make_index
        self.window_ms = window_ms or _env_int("EXCHANGE_BROKER_DELAYED_WINDOW_MS", 60_000)
        self.max_in_memory = max_in_memory or _env_int("EXCHANGE_BROKER_DELAYED_MEMORY", 100_000)
        self.prefetch_ms = self.window_ms // 2  # load the next window this long before the horizon
        self.low_water = max(1, self.max_in_memory // 4)
        self.load_chunk = max(1, min(LOAD_CHUNK, self.max_in_memory))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.heap: list[tuple] = []  # pending entries, a heap by (due_ms, id)
        self.next_id = 1
        self._timer: asyncio.Handle | None = None
        self._timer_due = 0
        self._releasing = False
        # store (None: memory only)
        self.durability = None
        self.store = None
        self.writer = None
        self.horizon = NO_HORIZON  # stored entries with (due, id) >= horizon are in the store only
        self.spilled = 0  # stored rows beyond the horizon (an estimate, for stats)
        self.mem_stored = 0  # stored entries in the heap (what the memory window bounds)
        self.loading = False
        self.load_until = 0
        self.parked: dict[int, tuple] = {}
        self.gone_while_loading: set[tuple[str, str]] = set()
        self.last_load_full = False
        self._retry_at = 0.0
        self._open: _InsertBatch | None = None
        self._deletes: list[int] = []
        self._delete_handle: asyncio.Handle | None = None
        self._tick_handle: asyncio.Handle | None = None
        self.closed = False
        self.stats = {"delayed": 0, "released": 0, "dropped": 0, "loaded": 0, "loads": 0,
                      "parked": 0, "spilled": 0, "loaded_overdue": 0,
                      # routed later than due (broker side, from the timer's point of view)
                      "late_over_10ms": 0, "late_over_50ms": 0, "late_max_ms": 0.0}

    # -- exchange type -------------------------------------------------------------------------
    def make_index(self, arguments: dict):
        """Binding index of the x-delayed-type (the extra_exchange_types factory)."""
        kind = (arguments or {}).get("x-delayed-type")
        if isinstance(kind, (bytes, bytearray)):
            kind = bytes(kind).decode("utf-8", "replace")
        if not isinstance(kind, str) or kind == X_DELAYED:
            raise AMQPError(PRECONDITION_FAILED, INVALID_TYPE, 40, 10, hard=False)
        if kind in BASE_TYPES:
            return routing.make_index(kind)
        factory = self.broker.extra_exchange_types.get(kind)
        if factory is not None:
            return factory(arguments)
        raise AMQPError(COMMAND_INVALID, f"unknown exchange type '{kind}'", 40, 10, hard=True)

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
            from persistence.delayed_store import delete_delayed_exchange
            self._open = None  # later inserts (a redeclared exchange) go after the delete
            self._call(None, lambda s: delete_delayed_exchange(s, vhost, name))

    # -- publish -------------------------------------------------------------------------------
    def publish(self, vhost: "VHost", ex: "Exchange", msg: Message):
        """Hold the message if it carries a valid x-delay; None routes it now (the normal path)."""
        if self._releasing:
            return None
        value = raw_x_delay(msg.properties)
        if value is _UNREADABLE:  # an odd table: take the decoder's word for it
            try:
                value = (msg.headers or {}).get("x-delay")
            except AMQPError:
                return None
        delay = delay_value(value)
        if delay is None:
            return None
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        now = math.ceil(time.time() * 1000)
        stored = self.store is not None and msg.persistent and ex.durable
        e = (now + delay, self.next_id, vhost.name, ex.name, msg.routing_key,
             negate_delay_header(msg.properties, delay), msg.body, stored, now)
        self.next_id += 1
        self.stats["delayed"] += 1
        waiter = self._insert(e) if stored else None
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
        if not self.heap or self.loop is None or self.closed:
            return
        due = self.heap[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        wait = (due - time.time() * 1000) / 1000.0
        self._timer_due = due
        if wait <= 0:
            self._timer = self.loop.call_soon(self._fire)
        else:
            self._timer = self.loop.call_at(self.loop.time() + wait, self._fire)

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm()

    def _fire(self) -> None:
        self._timer = None
        heap = self.heap
        now = time.time() * 1000
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
        if ex is None or ex.type != X_DELAYED:  # (deleting the exchange drops its entries anyway)
            self.stats["dropped"] += 1
        else:
            dm, prio, flags = codec.quick_properties(properties)
            m = Message(ex.name, routing_key, properties, body, dm == 2, prio)
            broker.stats["publish"] -= 1  # counted when the client published it
            self._releasing = True
            try:
                ttl = None  # per-message TTL runs from the enqueue, i.e. from now
                if flags & codec.FLAG_EXPIRATION:
                    from exchange_broker.core.queue_args import parse_expiration
                    ttl = parse_expiration(m.props.get("expiration"))
                broker.publish(vh, ex, m, True, None, ttl)
            except Exception:
                log.exception("routing delayed message %d from %s failed", id,
                              vh.describe("exchange", ex.name))
            finally:
                self._releasing = False
            self.stats["released"] += 1
        if stored:
            self.mem_stored -= 1
            self._deletes.append(id)

    # -- store -------------------------------------------------------------------------------------
    def attach(self, durability) -> None:
        """Keep stored delayed messages in ``durability``'s store (call before serving)."""
        self.durability = durability
        self.store = durability.store
        self.writer = durability.writer
        self.loop = durability.loop
        self.horizon = (0, 0)  # nothing in memory yet: the first load brings the first window

    async def recover(self) -> dict:
        """After restore: continue ids, load the first window (overdue messages route at once)."""
        from persistence.delayed_store import delayed_stats
        count, max_id, min_due = await self.loop.run_in_executor(None, delayed_stats, self.store)
        self.next_id = max(self.next_id, max_id + 1)
        self.spilled = count
        if count:
            log.info("recovering %d delayed messages (earliest due %s ms from now)", count,
                     min_due - int(time.time() * 1000))
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

    def _call(self, token, fn) -> None:
        try:
            self.writer.submit_call(token, fn)
        except RuntimeError:  # writer stopped (shutdown)
            if token is not None:
                token.fire(False)

    def _insert(self, e: tuple) -> Waiter:
        row = (e[ID], e[VHOST], e[EXCHANGE], e[ROUTING_KEY], e[PROPERTIES], e[BODY], e[DUE],
               e[CREATED])
        batch = self._open
        if batch is not None and batch.join(row):
            return batch.waiter
        batch = self._open = _InsertBatch(row)
        self._call(batch.waiter, batch.run)
        return batch.waiter

    def _schedule_deletes(self) -> None:
        """Delete rows of routed messages in batches: soon, and always after their copies' appends
        (a crash before the delete routes them again after the restart: duplicates, no loss)."""
        if len(self._deletes) >= DELETE_FLUSH_ROWS:
            self._flush_deletes()
        elif self._delete_handle is None and self.loop is not None:
            self._delete_handle = self.loop.call_later(DELETE_FLUSH_S, self._flush_deletes)

    def _flush_deletes(self) -> None:
        from persistence.delayed_store import delete_delayed
        if self._delete_handle is not None:
            self._delete_handle.cancel()
            self._delete_handle = None
        ids, self._deletes = self._deletes, []
        if not ids:
            return
        if self.store is None:
            return
        self._open = None
        try:
            self.durability._submit()  # the routed copies' appends are written before the delete
        except RuntimeError:  # writer stopped (shutdown): the rows stay, routed again after restart
            return
        self._call(None, lambda s: delete_delayed(s, ids))

    def _tick(self) -> None:
        self._tick_handle = None
        if self.closed:
            return
        self._maybe_load()
        self._tick_handle = self.loop.call_later(0.25, self._tick)

    def _maybe_load(self) -> None:
        if self.loading or self.closed:
            return
        now = time.time() * 1000
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
        fence = Waiter()
        fence.add(lambda _arg, _ok: self._read(start, until, limit), None)
        self._open = None  # inserts after this point are not guaranteed visible: they get parked
        self._call(fence, _noop)

    def _read(self, start: tuple[int, int], until: int, limit: int) -> None:
        if self.closed:
            return
        fut = self.loop.run_in_executor(None, self._read_rows, start, until, limit)
        fut.add_done_callback(lambda f: self._loaded(f, until, limit))

    def _read_rows(self, start: tuple[int, int], until: int, limit: int) -> list[tuple]:
        """On an executor thread: the next rows, already as entry tuples."""
        from persistence.delayed_store import load_delayed
        return _entries_from_rows(load_delayed(self.store, start[0], start[1], until, limit))

    def _loaded(self, fut: asyncio.Future, until: int, limit: int) -> None:
        self.loading = False
        parked, self.parked = self.parked, {}
        gone, self.gone_while_loading = self.gone_while_loading, set()
        exc = fut.exception()
        if exc is not None:
            log.error("reading delayed messages from the store failed (retrying in 1 s): %s", exc)
            self._retry_at = time.time() * 1000 + 1000
            self.spilled += len(parked)  # their rows are (being) written: the next load finds them
            return
        rows = fut.result()
        now = time.time() * 1000
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
