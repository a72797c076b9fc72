"""The statistics history behind rates and charts: a sample of the broker's counters and queue
lengths every few seconds (5 by default), kept for 10 minutes, served in RabbitMQ's shape.

The sampler runs on the broker's event loop (the admin server's task): it reads counters the
broker already keeps (``broker.stats``, each queue's, exchange's and channel's ``stats_*``) and
never adds work to the delivery path.

Memory is bounded by the number of samples kept times the objects whose values *changed* in a
sample: each sample stores, per table (queues: counters and lengths; exchanges; channels), only the
objects whose values moved, with their values before the sample (one tuple, keyed by the object's
one key tuple); the values as of the newest sample are kept once. An idle queue costs one entry
(or none, while all its values are zero); a deleted one leaves the current values at the next
sample.

The API side (:func:`parse_ranges`, :meth:`Rates.details`) follows RabbitMQ's management plugin:
``lengths_age``/``lengths_incr`` (queue lengths) and ``msg_rates_age``/``msg_rates_incr`` (message
counters), both in seconds, age/incr at most 500 points; then each ``<field>_details`` carries
``rate``, ``samples`` (newest first, ``{"sample", "timestamp"}`` with the timestamp in ms on a grid
of ``incr``), ``avg_rate`` and ``avg``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from typing import Callable, Iterable, Mapping

from exchange_broker.management.stats import (EXCHANGE_COUNTERS, QUEUE_COUNTERS, channel_counters, delivered_total,
                                             exchange_counters, global_counters, queue_counters,
                                             unacked_by_queue)

DEFAULT_INTERVAL = 5.0     # seconds between samples (``--stats-sample-interval``)
HISTORY_SECONDS = 600      # samples kept for at least this long (10 minutes)
RATE_SAMPLES = 3           # a rate: growth since the third newest sample, per second
MAX_RANGE = 500            # RabbitMQ's limit on age / incr
TABLES = ("queues", "exchanges", "channels")
CHANNEL_COUNTERS = (("publish", 0), ("deliver", 1), ("ack", 2))
LENGTH_FIELDS = (("messages_ready", 0), ("messages_unacknowledged", 1))
LENGTHS_AT = len(QUEUE_COUNTERS)  # a queue's values: its counters, then (ready, unacknowledged)
_ZEROS = {"queues": (0,) * (LENGTHS_AT + 2),
          "exchanges": (0,) * len(EXCHANGE_COUNTERS), "channels": (0, 0, 0)}


class Range:
    """One ``<prefix>_age`` / ``<prefix>_incr`` pair, in milliseconds."""
    __slots__ = ("age", "incr")

    def __init__(self, age_s: int, incr_s: int) -> None:
        self.age = age_s * 1000
        self.incr = incr_s * 1000

    def grid(self, now_ms: float) -> list[int]:
        """The sample timestamps asked for, newest first (RabbitMQ floors the newest to incr)."""
        last = int(now_ms // self.incr) * self.incr
        return list(range(last, last - self.age - 1, -self.incr))


class Ranges:
    __slots__ = ("lengths", "msg_rates")

    def __init__(self, lengths: Range | None = None, msg_rates: Range | None = None) -> None:
        self.lengths = lengths
        self.msg_rates = msg_rates


NO_RANGES = Ranges()


def _int(params: Mapping[str, str], key: str) -> int | None:
    raw = params.get(key)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None  # RabbitMQ ignores a non-integer value (no range)


class RangeError(ValueError):
    """An out-of-bounds age/incr pair (the API answers 400 invalid_range_parameters)."""


def parse_ranges(params: Mapping[str, str]) -> Ranges:
    """``lengths_*`` and ``msg_rates_*`` from a query string; RangeError for an out-of-bounds pair."""
    found = {}
    for prefix in ("lengths", "msg_rates"):
        age, incr = _int(params, f"{prefix}_age"), _int(params, f"{prefix}_incr")
        if age is None or incr is None:
            found[prefix] = None
        elif age > 0 and incr > 0 and age // incr <= MAX_RANGE:
            found[prefix] = Range(age, incr)
        else:
            raise RangeError(f"Invalid range parameters: age {age}, incr {incr}")
    return Ranges(found["lengths"], found["msg_rates"])


class Sample:
    __slots__ = ("at", "ts", "counters", "totals", "changed")

    def __init__(self, at: float, ts: int, counters: dict, totals: tuple, changed: dict) -> None:
        self.at = at              # time.monotonic()
        self.ts = ts              # wall clock, ms since the epoch (the API's timestamps)
        self.counters = counters  # the broker's global counters
        self.totals = totals      # (messages ready, unacknowledged) over all queues
        self.changed = changed    # table -> {key: values before this sample}, only what moved

    @property
    def queues(self) -> dict:
        return self.changed["queues"]


def _snapshot(broker, keys: dict) -> tuple[dict, tuple]:
    """table -> {key: values} for every object with a non-zero value, and the queue totals.
    ``keys`` gives the key tuple already held for an object, so samples share one per object."""
    unacked = unacked_by_queue(broker)
    tables: dict = {t: {} for t in TABLES}
    queues, exchanges = tables["queues"], tables["exchanges"]
    zq = _ZEROS["queues"]
    ready_total = unacked_total = 0
    for vh in broker.vhosts.values():
        name = vh.name
        for q in vh.queues.values():
            ready, n_unacked = q.message_count, unacked.get(id(q), (0, 0))[0]
            values = (*queue_counters(q), ready, n_unacked)
            if values != zq:  # an unused, empty queue costs nothing: missing reads as zeros
                key = (name, q.name)
                queues[keys.get(key, key)] = values
            ready_total += ready
            unacked_total += n_unacked
        for ex in vh.exchanges.values():
            if ex.stats_in or ex.stats_out:
                key = (name, ex.name)
                exchanges[keys.get(key, key)] = exchange_counters(ex)
    channels = tables["channels"]
    for sess in list(broker.sessions):
        for ch in list(sess.channels.values()):
            values = channel_counters(ch)
            if any(values):
                channels[id(ch)] = values
    return tables, (ready_total, unacked_total)


class Rates:
    """The samples kept, and the rates and sample series computed from them."""

    def __init__(self, interval: float = DEFAULT_INTERVAL, seconds: float = HISTORY_SECONDS) -> None:
        self.interval = interval
        self.history_seconds = int(seconds)
        self.kept = max(RATE_SAMPLES, math.ceil(seconds / interval) + 1)
        self._samples: deque[Sample] = deque(maxlen=self.kept)
        self._current: dict = {t: {} for t in TABLES}
        self._keys: dict = {}  # the key tuple in use for each object counted now

    # -- recording -------------------------------------------------------------------------------
    def sample(self, broker) -> None:
        tables, totals = _snapshot(broker, self._keys)
        self._keys = {k: k for table in ("queues", "exchanges") for k in tables[table]}
        changed = {}
        for table in TABLES:
            old, new, zeros = self._current[table], tables[table], _ZEROS[table]
            moved = {k: old.get(k, zeros) for k, v in new.items() if old.get(k) != v}
            moved.update((k, v) for k, v in old.items() if k not in new)  # gone: now zeros
            changed[table] = moved
        self._current = tables
        self._samples.append(Sample(time.monotonic(), int(time.time() * 1000), global_counters(broker),
                                    totals, changed))

    # -- reading ---------------------------------------------------------------------------------
    def _reference(self) -> int | None:
        """Index of the sample rates are measured from (None: no sample yet)."""
        n = len(self._samples)
        return None if n == 0 else max(0, n - RATE_SAMPLES)

    def _value_at(self, table: str, key, index: int) -> tuple:
        """An object's values as of sample ``index``: the value before its next change, if any."""
        for s in itertools.islice(self._samples, index + 1, None):
            old = s.changed[table].get(key)
            if old is not None:
                return old
        return self._current[table].get(key, _ZEROS[table])

    def _series(self, table: str, key) -> list[tuple[int, tuple]]:
        """(timestamp, values) per sample kept, oldest first."""
        running = self._current[table].get(key, _ZEROS[table])
        out = []
        for s in reversed(self._samples):
            out.append((s.ts, running))
            old = s.changed[table].get(key)
            if old is not None:
                running = old
        out.reverse()
        return out

    def _base(self) -> tuple[int, float] | None:
        """(index of the sample rates are measured from, seconds since it); None while there is
        no sample or the newest reference is under half a second old (no rate yet: 0.0)."""
        index = self._reference()
        if index is None:
            return None
        dt = time.monotonic() - self._samples[index].at
        return None if dt < 0.5 else (index, dt)

    @staticmethod
    def _rate(current: float, old: float | None, dt: float, signed: bool = False) -> float:
        if old is None:
            return 0.0
        rate = (current - old) / dt
        return round(rate if signed else max(0.0, rate), 1)

    def details(self, rate: float, series: list[tuple[int, float]], rng: Range | None) -> dict:
        """A ``<field>_details`` object: the rate, and with a range the samples RabbitMQ adds."""
        out: dict = {"rate": rate}
        if rng is None:
            return out
        samples = []
        points = iter(reversed(series))  # newest first
        point = next(points, None)
        for t in rng.grid(time.time() * 1000):
            while point is not None and point[0] > t:
                point = next(points, None)
            if point is None:
                break  # before the oldest sample kept
            samples.append({"sample": point[1], "timestamp": t})
        out["samples"] = samples
        if len(samples) > 1:
            newest, oldest = samples[0], samples[-1]
            out["avg_rate"] = round((newest["sample"] - oldest["sample"]) * 1000
                                    / (newest["timestamp"] - oldest["timestamp"]), 2)
            out["avg"] = round(sum(s["sample"] for s in samples) / len(samples), 2)
        return out

    def _table_stats(self, table: str, key, names: Iterable[str], values: tuple, rng: Range | None,
                     *, first: int = 0, signed: bool = False) -> dict:
        """``names[i]`` is ``values[i]`` now and ``stored[first + i]`` in the samples."""
        base = self._base()
        old, dt = (self._value_at(table, key, base[0]), base[1]) if base is not None else (None, 1.0)
        series = self._series(table, key) if rng is not None else []
        out: dict = {}
        for i, name in enumerate(names):
            j = first + i
            out[name] = values[i]
            rate = self._rate(values[i], None if old is None else old[j], dt, signed)
            out[f"{name}_details"] = self.details(rate, [(t, v[j]) for t, v in series], rng)
        return out

    def queue_stats(self, q, rng: Range | None = None) -> dict:
        """A queue's message_stats: each counter with its rate (and samples with a range)."""
        return self._table_stats("queues", (q.vhost, q.name), [k for k, _ in QUEUE_COUNTERS],
                                 queue_counters(q), rng)

    def queue_lengths(self, q, ready: int, unacked: int, rng: Range | None = None) -> dict:
        """messages_ready / messages_unacknowledged / messages with their details (rates of change)."""
        out = self._table_stats("queues", (q.vhost, q.name), [k for k, _ in LENGTH_FIELDS],
                                (ready, unacked), rng, first=LENGTHS_AT, signed=True)
        return _with_total(out)

    def exchange_stats(self, ex, rng: Range | None = None) -> dict:
        """An exchange's message_stats: publish_in and publish_out with their rates."""
        return self._table_stats("exchanges", (ex.vhost, ex.name), [k for k, _ in EXCHANGE_COUNTERS],
                                 exchange_counters(ex), rng)

    def channel_stats(self, ch) -> dict:
        """A channel's message_stats: publish, deliver and ack with their rates."""
        return self._table_stats("channels", id(ch), [k for k, _ in CHANNEL_COUNTERS], channel_counters(ch),
                                 None)

    def message_stats(self, broker, rng: Range | None = None) -> dict:
        """The overview's message_stats: every global counter with its rate."""
        cur = global_counters(broker)
        cur["deliver_get"] = delivered_total(cur)
        base = self._base()
        out: dict = {}
        for key, value in cur.items():
            pick = _global_pick(key)
            old = pick(self._samples[base[0]]) if base is not None else None
            series = [(s.ts, pick(s)) for s in self._samples] if rng is not None else []
            out[key] = value
            out[f"{key}_details"] = self.details(self._rate(value, old, base[1] if base else 1.0), series, rng)
        return out

    def queue_totals(self, ready: int, unacked: int, rng: Range | None = None) -> dict:
        """The overview's queue_totals, with the rate of change (and samples) of each."""
        base = self._base()
        old, dt = (self._samples[base[0]].totals, base[1]) if base is not None else (None, 1.0)
        series = [(s.ts, s.totals) for s in self._samples] if rng is not None else []
        out: dict = {}
        for name, i in LENGTH_FIELDS:
            value = (ready, unacked)[i]
            rate = self._rate(value, None if old is None else old[i], dt, signed=True)
            out[name] = value
            out[f"{name}_details"] = self.details(rate, [(t, v[i]) for t, v in series], rng)
        return _with_total(out)


def _global_pick(key: str) -> Callable[[Sample], float]:
    if key == "deliver_get":
        return lambda s: delivered_total(s.counters)
    return lambda s: s.counters.get(key, 0)


def _with_total(out: dict) -> dict:
    """Add ``messages`` (ready + unacknowledged) and its details, summed from the two."""
    ready, unacked = out["messages_ready_details"], out["messages_unacknowledged_details"]
    out["messages"] = out["messages_ready"] + out["messages_unacknowledged"]
    total = {"rate": round(ready["rate"] + unacked["rate"], 1)}
    if "samples" in ready:
        total["samples"] = [{"sample": a["sample"] + b["sample"], "timestamp": a["timestamp"]}
                            for a, b in zip(ready["samples"], unacked["samples"])]
        if len(total["samples"]) > 1:
            total["avg_rate"] = round(ready["avg_rate"] + unacked["avg_rate"], 2)
            total["avg"] = round(ready["avg"] + unacked["avg"], 2)
    out["messages_details"] = total
    return out
