"""Per-queue and per-exchange message_stats in RabbitMQ's shape (each counter next to its
``<counter>_details: {"rate": ...}``), counted on real pika traffic and given rates by the admin
server's periodic samples. The counters are those RabbitMQ 3.10 showed for the same traffic, but
for ``get_empty``, which RabbitMQ 3.10 leaves at 0 and this counts as documented (basic.gets that
found the queue empty)."""

from __future__ import annotations

import time

import pytest

from exchange_broker.management.samples import Rates
from exchange_broker.testing import ThreadedBroker

QUEUE_KEYS = ("publish", "deliver_get", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack",
              "redeliver")


@pytest.fixture
def admin_broker():
    """The admin server samples only when a test says (``sample``): neither its sample at start-up
    (a rate is measured from it once it is half a second old, which a slow test's traffic
    outlasted on a loaded machine: a rate of 1.5 where none was expected) nor every 5 s."""
    with ThreadedBroker(admin=True, admin_sample_interval=3600) as tb:
        tb.call(lambda: setattr(tb.admin.context, "rates", Rates(3600)))  # without the start-up sample
        yield tb


def sample(admin_broker) -> None:
    admin_broker.call(admin_broker.admin.context.sample)


def test_queue_and_exchange_counters(api, admin_broker, pika_conn):
    """The traffic of a by-hand run against RabbitMQ 3.10, with its counters."""
    ch = pika_conn.channel()
    ch.exchange_declare("stats-x", "topic")
    ch.queue_declare("stats-q")
    ch.queue_declare("stats-q2")
    ch.queue_bind("stats-q", "stats-x", "a.#")
    ch.queue_bind("stats-q2", "stats-x", "a.b")
    ch.confirm_delivery()
    for _ in range(5):
        ch.basic_publish("stats-x", "a.b", b"x")
    ch.basic_publish("stats-x", "zz", b"x")  # unroutable
    x = api.ok("GET", "/api/exchanges/%2F/stats-x")["message_stats"]
    assert (x["publish_in"], x["publish_out"]) == (6, 10)  # publish_out: once per queue reached
    assert x["publish_in_details"] == {"rate": 0.0} and x["publish_out_details"] == {"rate": 0.0}
    assert "message_stats" not in api.ok("GET", "/api/exchanges/%2F/amq.fanout")  # nothing published yet

    m, _p, _b = ch.basic_get("stats-q")
    ch.basic_nack(m.delivery_tag, requeue=True)
    ch.basic_get("stats-q", auto_ack=True)        # the requeued one: a redelivery
    m, _p, _b = ch.basic_get("stats-q")
    ch.basic_ack(m.delivery_tag)
    ch.basic_get("stats-q2")
    got = []

    def on_message(c, method, _props, _body):
        got.append(method)
        c.basic_ack(method.delivery_tag)
    tag = ch.basic_consume("stats-q", on_message)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        pika_conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    assert ch.basic_get("stats-q") == (None, None, None)  # empty now

    q = api.ok("GET", "/api/queues/%2F/stats-q")["message_stats"]
    expected = {"publish": 5, "deliver_get": 6, "deliver": 3, "deliver_no_ack": 0, "get": 2, "get_no_ack": 1,
                "get_empty": 1, "ack": 4, "redeliver": 1}
    assert {k: q[k] for k in QUEUE_KEYS} == expected
    assert all(q[f"{k}_details"] == {"rate": 0.0} for k in QUEUE_KEYS)
    q2 = api.ok("GET", "/api/queues/%2F/stats-q2")["message_stats"]
    assert (q2["publish"], q2["get"], q2["deliver_get"], q2["ack"]) == (5, 1, 1, 0)
    listed = {i["name"]: i for i in api.ok("GET", "/api/queues/%2F")}
    assert listed["stats-q"]["message_stats"]["ack"] == 4
    listed = {i["name"]: i for i in api.ok("GET", "/api/exchanges/%2F")}
    assert listed["stats-x"]["message_stats"]["publish_in"] == 6


def test_rates_from_samples(api, admin_broker, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("rated-q")
    ch.exchange_declare("rated-x", "fanout")
    ch.queue_bind("rated-q", "rated-x")
    sample(admin_broker)  # the starting point: nothing counted yet for these
    ch.confirm_delivery()
    for _ in range(20):
        ch.basic_publish("rated-x", "", b"x")
    for _ in range(10):
        method, _p, _b = ch.basic_get("rated-q")
        ch.basic_ack(method.delivery_tag)
    time.sleep(0.6)  # a rate needs half a second between the samples and now
    q = api.ok("GET", "/api/queues/%2F/rated-q")["message_stats"]
    assert q["publish"] == 20 and q["publish_details"]["rate"] > 0
    assert q["ack"] == 10 and q["ack_details"]["rate"] > 0
    assert q["get_details"]["rate"] > 0 and q["deliver_get_details"]["rate"] > 0
    assert q["deliver_details"]["rate"] == 0.0 and q["redeliver_details"]["rate"] == 0.0
    assert q["publish_details"]["rate"] > q["ack_details"]["rate"]  # twice the messages, same interval
    x = api.ok("GET", "/api/exchanges/%2F/rated-x")["message_stats"]
    assert x["publish_in_details"]["rate"] > 0 and x["publish_out_details"]["rate"] > 0
    sample(admin_broker)
    time.sleep(0.6)
    sample(admin_broker)
    sample(admin_broker)  # the oldest sample kept is now after the traffic: no rate any more
    time.sleep(0.6)
    q = api.ok("GET", "/api/queues/%2F/rated-q")["message_stats"]
    assert q["publish"] == 20 and q["publish_details"]["rate"] == 0.0
    x = api.ok("GET", "/api/exchanges/%2F/rated-x")["message_stats"]
    assert x["publish_in"] == 20 and x["publish_in_details"]["rate"] == 0.0


def test_samples_keep_bounded_memory():
    """Samples hold only the queues and exchanges that counted something, and a fixed number of
    samples: idle queues cost nothing, deleted ones are gone from the next samples."""
    with ThreadedBroker(admin=True) as admin_broker:  # the default interval (5 s)
        _bounded(admin_broker)


def _bounded(admin_broker) -> None:
    broker = admin_broker.broker

    def declare_many():
        vh = broker.vhosts["/"]
        for i in range(200):
            vh.declare_queue(f"idle-{i}")
    admin_broker.call(declare_many)
    rates = admin_broker.admin.context.rates
    assert rates.kept == 121  # 10 minutes of 5 s samples, and the newest
    for _ in range(rates.kept + 3):
        sample(admin_broker)
    samples = list(rates._samples)
    assert len(samples) == rates.kept
    assert not any(name.startswith("idle-") for s in samples for (_v, name) in s.queues)
