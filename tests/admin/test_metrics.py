"""GET /metrics: Prometheus text format, parsed with prometheus_client's own parser."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(admin_broker) -> dict:
    with urllib.request.urlopen(admin_broker.admin_url + "/metrics", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics(api, admin_broker, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("m1")
    for i in range(4):
        ch.basic_publish("", "m1", b"x")
    ch.basic_qos(prefetch_count=1)
    held = []
    ch.basic_consume("m1", lambda c, m, p, b: held.append(m.delivery_tag))
    deadline = time.time() + 5
    while not held and time.time() < deadline:
        pika_conn.process_data_events(0.05)
    ch.basic_ack(held[0])
    while len(held) < 2 and time.time() < deadline:
        pika_conn.process_data_events(0.05)
    api.put("/api/queues/%2F/idle")
    m = scrape(admin_broker)
    lbl = (("queue", "m1"), ("vhost", "/"))
    assert m[("rabbitmq_queue_messages_ready", lbl)] == 2
    assert m[("rabbitmq_queue_messages_unacked", lbl)] == 1
    assert m[("rabbitmq_queue_messages", lbl)] == 3
    assert m[("rabbitmq_queue_consumers", lbl)] == 1
    assert m[("rabbitmq_queue_messages_published_total", lbl)] == 4
    assert m[("rabbitmq_queue_messages_delivered_total", lbl)] == 2
    assert m[("rabbitmq_queue_messages_ready", (("queue", "idle"), ("vhost", "/")))] == 0
    assert m[("rabbitmq_connections", ())] == 1
    assert m[("rabbitmq_channels", ())] == 1
    assert m[("rabbitmq_consumers", ())] == 1
    assert m[("rabbitmq_queues", ())] == 2
    assert m[("rabbitmq_global_messages_received_total", ())] == 4
    assert m[("rabbitmq_global_messages_delivered_total", ())] == 2
    assert m[("rabbitmq_global_messages_acknowledged_total", ())] == 1
    pika_conn.close()
    deadline = time.time() + 5
    while scrape(admin_broker)[("rabbitmq_connections", ())] and time.time() < deadline:
        time.sleep(0.05)
    m = scrape(admin_broker)
    assert m[("rabbitmq_connections", ())] == 0 and m[("rabbitmq_channels", ())] == 0
    assert m[("rabbitmq_queue_messages_ready", lbl)] == 3  # the unacked one went back
