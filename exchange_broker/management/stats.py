"""Counters read from the broker: global message counters, unacknowledged messages per queue
(held by the channels), per-queue, per-exchange and per-channel counters. Reading only: the
counting is done where the messages go (broker, queues, channels); the samples and rates built
from these readings are in samples.py.
"""

from __future__ import annotations

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


def channel_counters(ch) -> tuple[int, int, int]:
    """(published, delivered, acknowledged) on a channel."""
    return (ch.stats_published, ch.stats_delivered, ch.stats_acked)


def unacked_by_queue(broker) -> dict:
    """Per queue (by id): (unacknowledged messages, their bytes), from the channels holding them."""
    out: dict = {}
    for sess in list(broker.sessions):
        # an MQTT connection holds its unacknowledged deliveries itself (it has no channels)
        holders = list(sess.channels.values()) or ([sess] if hasattr(sess, "admin_info") else [])
        for ch in holders:
            for entry in list(ch.unacked.values()):
                msg = entry[0]
                q = getattr(msg, "queue", None)
                if q is None:
                    continue
                n, b = out.get(id(q), (0, 0))
                out[id(q)] = (n + 1, b + len(msg.body))
    return out
