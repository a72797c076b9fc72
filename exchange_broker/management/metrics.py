"""Prometheus metrics (text exposition format) with rabbitmq_prometheus's metric names."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exchange_broker.management.service import BrokerService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class BrokerCollector:
    """Reads a snapshot from the service on every scrape (the scrape runs on the broker's loop)."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service

    def describe(self):
        return []

    def collect(self):
        snap = self.service.metrics_snapshot()
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
                                  value=c["deliver"] + c["get"] + c["deliver_no_ack"] + c["get_no_ack"])
        yield CounterMetricFamily("rabbitmq_global_messages_acknowledged",
                                  "Messages acknowledged by consumers", value=c["ack"])
        yield CounterMetricFamily("rabbitmq_global_messages_unroutable",
                                  "Messages published that no queue received", value=c["return_unroutable"])


def make_registry(service: BrokerService) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
