"""Counters and rates read from the broker: global message counters, unacknowledged messages
per queue (held by the channels), per-queue and per-exchange counters, and their rates from a
few periodic samples (the admin server samples every few seconds; memory is bounded by the
number of samples kept times the number of queues and exchanges that have counted anything: an
object missing from a sample had all its counters at zero then).

``message_stats`` come in RabbitMQ's shape: each counter next to ``<counter>_details: {"rate"}``
(messages per second over the samples kept).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

COUNTERS = ("publish", "deliver", "ack", "confirm", "return_unroutable", "get", "get_no_ack",
            "deliver_no_ack", "redeliver")

# A queue's counters as RabbitMQ names them, and the queue attribute each is read from. The
# per-delivery ones are counted by the channel; a queue type without one reads 0.
QUEUE_COUNTERS = (("publish", "stats_published"), ("deliver_get", "stats_delivered"),
                  ("deliver", "stats_deliver"), ("deliver_no_ack", "stats_deliver_no_ack"),
                  ("get", "stats_get"), ("get_no_ack", "stats_get_no_ack"),
                  ("get_empty", "stats_get_empty"), ("ack", "stats_ack"),
                  ("redeliver", "stats_redeliver"))
EXCHANGE_COUNTERS = (("publish_in", "stats_in"), ("publish_out", "stats_out"))
SAMPLES_KEPT = 3
_ZEROS = (0,) * len(QUEUE_COUNTERS)


def global_counters(broker) -> dict:
    s = broker.stats
    return {k: int(s.get(k, 0)) for k in COUNTERS}


def delivered_total(counters: dict) -> int:
    """RabbitMQ's deliver_get: consumer deliveries and basic.gets, acked or not."""
    return counters["deliver"] + counters["get"] + counters["deliver_no_ack"] + counters["get_no_ack"]


def queue_counters(q) -> tuple[int, ...]:
    return tuple(getattr(q, attr, 0) for _key, attr in QUEUE_COUNTERS)


def exchange_counters(ex) -> tuple[int, ...]:
    return (ex.stats_in, ex.stats_out)


def unacked_by_queue(broker) -> dict:
    """Per queue (by id): (unacknowledged messages, their bytes), from the channels holding them."""
    out: dict = {}
    for sess in list(broker.sessions):
        for ch in list(sess.channels.values()):
            for entry in list(ch.unacked.values()):
                msg = entry[0]
                q = getattr(msg, "queue", None)
                if q is None:
                    continue
                n, b = out.get(id(q), (0, 0))
                out[id(q)] = (n + 1, b + len(msg.body))
    return out


class Sample:
    __slots__ = ("at", "counters", "queues", "exchanges")

    def __init__(self, at: float, counters: dict, queues: dict, exchanges: dict) -> None:
        self.at = at                # time.monotonic()
        self.counters = counters    # global counters
        self.queues = queues        # (vhost, name) -> queue_counters()
        self.exchanges = exchanges  # (vhost, name) -> exchange_counters()


class Rates:
    """The last few samples of the counters; a rate is a counter's growth since the oldest sample
    kept, per second (0.0 until that sample is half a second old)."""

    def __init__(self, kept: int = SAMPLES_KEPT) -> None:
        self._samples: deque[Sample] = deque(maxlen=kept)

    def sample(self, broker) -> None:
        queues, exchanges = {}, {}
        for vh in broker.vhosts.values():
            name = vh.name
            for q in vh.queues.values():
                values = queue_counters(q)
                if values != _ZEROS:  # an unused queue costs nothing: missing reads as zeros
                    queues[(name, q.name)] = values
            for ex in vh.exchanges.values():
                if ex.stats_in or ex.stats_out:
                    exchanges[(name, ex.name)] = exchange_counters(ex)
        self._samples.append(Sample(time.monotonic(), global_counters(broker), queues, exchanges))

    def _rate(self, current: float, pick: Callable[[Sample], float | None]) -> float:
        """``pick(sample)`` reads the old value from a sample (None: not in that sample)."""
        now = time.monotonic()
        for s in self._samples:  # oldest first
            old = pick(s)
            if old is None:
                continue
            dt = now - s.at
            if dt < 0.5:
                return 0.0
            return round(max(0.0, (current - old) / dt), 1)
        return 0.0

    def queue_stats(self, q) -> dict:
        """A queue's message_stats: each counter with its rate."""
        key = (q.vhost, q.name)
        values = queue_counters(q)
        return self._detailed([k for k, _ in QUEUE_COUNTERS], values, lambda s: s.queues.get(key, _ZEROS))

    def exchange_stats(self, ex) -> dict:
        """An exchange's message_stats: publish_in and publish_out with their rates."""
        key = (ex.vhost, ex.name)
        return self._detailed([k for k, _ in EXCHANGE_COUNTERS], exchange_counters(ex),
                              lambda s: s.exchanges.get(key, (0, 0)))

    def _detailed(self, keys: list[str], values: tuple, row: Callable[[Sample], tuple]) -> dict:
        out: dict = {}
        for i, (key, value) in enumerate(zip(keys, values)):
            out[key] = value
            out[f"{key}_details"] = {"rate": self._rate(value, lambda s, i=i: row(s)[i])}
        return out

    def message_stats(self, broker) -> dict:
        """The overview's message_stats: every global counter with its rate."""
        cur = global_counters(broker)
        cur["deliver_get"] = delivered_total(cur)
        out: dict = {}
        for key, value in cur.items():
            out[key] = value
            if key == "deliver_get":
                def pick(s):
                    return delivered_total(s.counters)
            else:
                def pick(s, key=key):
                    return s.counters.get(key)
            out[f"{key}_details"] = {"rate": self._rate(value, pick)}
        return out
