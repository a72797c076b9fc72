"""Counters and rates read from the broker: global message counters, unacknowledged messages
per queue (held by the channels), and rates from a few periodic samples."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

COUNTERS = ("publish", "deliver", "ack", "confirm", "return_unroutable", "get", "get_no_ack",
            "deliver_no_ack", "redeliver")


def global_counters(broker) -> dict:
    s = broker.stats
    return {k: int(s.get(k, 0)) for k in COUNTERS}


def delivered_total(counters: dict) -> int:
    """RabbitMQ's deliver_get: consumer deliveries and basic.gets, acked or not."""
    return counters["deliver"] + counters["get"] + counters["deliver_no_ack"] + counters["get_no_ack"]


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


class Rates:
    """The last few samples of the counters; a rate is (now - oldest sample) / elapsed seconds."""

    def __init__(self) -> None:
        self._samples: deque = deque(maxlen=4)   # (monotonic time, global counters, per-queue counters)

    def sample(self, broker) -> None:
        per_queue = {}
        for vh in broker.vhosts.values():
            for q in vh.queues.values():
                per_queue[(vh.name, q.name)] = (q.stats_published, q.stats_delivered)
        self._samples.append((time.monotonic(), global_counters(broker), per_queue))

    def rate(self, current: float, pick: Callable[[dict, dict], float | None]) -> float:
        """``pick(global counters, per-queue counters)`` reads the old value from the oldest sample."""
        if not self._samples:
            return 0.0
        t0, g0, q0 = self._samples[0]
        dt = time.monotonic() - t0
        if dt < 0.5:
            return 0.0
        old = pick(g0, q0)
        if old is None:
            return 0.0
        return round(max(0.0, (current - old) / dt), 1)

    def queue_rate(self, vhost: str, queue: str, current: int, which: int) -> float:
        """Rate of a queue's published (``which`` 0) or delivered (1) counter."""
        return self.rate(current, lambda _g, qs: (qs.get((vhost, queue)) or (None, None))[which])

    def message_stats(self, broker) -> dict:
        """The overview's message_stats: every global counter with its rate."""
        cur = global_counters(broker)
        cur["deliver_get"] = delivered_total(cur)
        out: dict = {}
        for key, value in cur.items():
            out[key] = value
            if key == "deliver_get":
                def pick(g, _q):
                    return delivered_total(g)
            else:
                def pick(g, _q, key=key):
                    return g.get(key)
            out[f"{key}_details"] = {"rate": self.rate(value, pick)}
        return out
