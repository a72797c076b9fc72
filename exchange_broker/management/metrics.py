"""Prometheus metrics at /metrics (text exposition format, no authentication) with
rabbitmq_prometheus's metric names."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exchange_broker.management.common import AdminContext
from exchange_broker.management.connections import sessions
from exchange_broker.management.stats import delivered_total, global_counters, unacked_by_queue
from exchange_broker.management.super_streams import all_group_rows

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["metrics"])


def snapshot(ctx: AdminContext) -> dict:
    """Every number a scrape reports, read from the broker at once."""
    broker = ctx.broker
    unacked = unacked_by_queue(broker)
    queues = []
    for vh in broker.vhosts.values():
        for q in vh.queues.values():
            queues.append({"vhost": vh.name, "queue": q.name, "ready": q.message_count,
                           "unacked": unacked.get(id(q), (0, 0))[0], "consumers": len(q.consumers),
                           "published": q.stats_published, "delivered": q.stats_delivered})
    open_sessions = sessions(ctx, None)
    return {
        "queues": queues,
        "connections": len(open_sessions),
        "channels": sum(len(s.channels) for s in open_sessions),
        "consumers": sum(q["consumers"] for q in queues),
        "exchanges": sum(len(vh.exchanges) for vh in broker.vhosts.values()),
        "vhosts": len(broker.vhosts),
        "counters": global_counters(broker),
    }


class BrokerCollector:
    """Reads a snapshot on every scrape (the scrape runs on the broker's loop)."""

    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx

    def describe(self):
        return []

    def collect(self):
        snap = snapshot(self.ctx)
        labels = ["vhost", "queue"]
        per_queue = {
            "ready": GaugeMetricFamily("rabbitmq_queue_messages_ready",
                                       "Messages ready to be delivered to consumers", labels=labels),
            "unacked": GaugeMetricFamily("rabbitmq_queue_messages_unacked",
                                         "Messages delivered to consumers but not yet acknowledged",
                                         labels=labels),
            "messages": GaugeMetricFamily("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages",
                                          labels=labels),
            "consumers": GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers on a queue", labels=labels),
            "published": CounterMetricFamily("rabbitmq_queue_messages_published",
                                             "Messages published into a queue", labels=labels),
            "delivered": CounterMetricFamily("rabbitmq_queue_messages_delivered",
                                             "Messages delivered from a queue (consumers and gets)",
                                             labels=labels),
        }
        for q in snap["queues"]:
            lv = [q["vhost"], q["queue"]]
            per_queue["ready"].add_metric(lv, q["ready"])
            per_queue["unacked"].add_metric(lv, q["unacked"])
            per_queue["messages"].add_metric(lv, q["ready"] + q["unacked"])
            per_queue["consumers"].add_metric(lv, q["consumers"])
            per_queue["published"].add_metric(lv, q["published"])
            per_queue["delivered"].add_metric(lv, q["delivered"])
        yield from per_queue.values()
        yield GaugeMetricFamily("rabbitmq_queues", "Queues", value=len(snap["queues"]))
        yield GaugeMetricFamily("rabbitmq_connections", "Open client connections", value=snap["connections"])
        yield GaugeMetricFamily("rabbitmq_channels", "Open channels", value=snap["channels"])
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers", value=snap["consumers"])
        yield GaugeMetricFamily("rabbitmq_exchanges", "Exchanges", value=snap["exchanges"])
        yield GaugeMetricFamily("rabbitmq_vhosts", "Virtual hosts", value=snap["vhosts"])
        c = snap["counters"]
        yield CounterMetricFamily("rabbitmq_global_messages_received",
                                  "Messages published to the broker", value=c["publish"])
        yield CounterMetricFamily("rabbitmq_global_messages_delivered",
                                  "Messages delivered to consumers or fetched with basic.get",
                                  value=delivered_total(c))
        yield CounterMetricFamily("rabbitmq_global_messages_acknowledged",
                                  "Messages acknowledged by consumers", value=c["ack"])
        yield CounterMetricFamily("rabbitmq_global_messages_unroutable",
                                  "Messages published that no queue received", value=c["return_unroutable"])
        yield from group_metrics(all_group_rows(self.ctx))


def group_metrics(groups: list[dict]):
    """Consumer groups of super streams: lag and committed offset per group and partition,
    members per group."""
    labels = ["vhost", "super_stream", "group", "partition"]
    lag = GaugeMetricFamily("exchange_broker_consumer_group_lag", "Messages of a super stream "
                            "partition after the consumer group's committed offset", labels=labels)
    committed = GaugeMetricFamily("exchange_broker_consumer_group_committed_offset", "The last offset "
                                  "a consumer group acked on a partition (-1: none)", labels=labels)
    members = GaugeMetricFamily("exchange_broker_consumer_group_members", "Members of a consumer group",
                                labels=labels[:3])
    for g in groups:
        key = [g["vhost"], g["super_stream"], g["group"]]
        members.add_metric(key, len(g["members"]))
        for p in g["partitions"]:
            if "lag" in p:
                lv = key + [str(p["partition"])]
                lag.add_metric(lv, p["lag"])
                off = p["committed_offset"]
                committed.add_metric(lv, -1 if off is None else off)
    yield from (lag, committed, members)


def make_registry(ctx: AdminContext) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(ctx))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


@router.get("/metrics", response_class=Response,
            summary="Prometheus metrics (text exposition format, no authentication)")
async def metrics(request: Request):
    return Response(render(request.app.state.registry), media_type=CONTENT_TYPE)
