"""The statistics history behind the UI's charts, through the HTTP API as RabbitMQ serves it:
``lengths_age``/``lengths_incr`` and ``msg_rates_age``/``msg_rates_incr`` give ``*_details`` with
``rate``, ``samples`` (newest first, timestamps in ms on the incr grid), ``avg_rate`` and ``avg``.
No browser: a broker in this process, real pika traffic, samples taken when the test says."""

from __future__ import annotations

import re
import time

import pytest
from ui_support import http

from eb_support import close_quietly, pika_connect, uniq
from exchange_broker.management import ui_routes
from exchange_broker.testing import ThreadedBroker


@pytest.fixture(scope="module")
def tb():
    with ThreadedBroker(admin=True) as b:
        yield b


def sample(tb) -> None:
    tb.call(tb.admin.context.sample)


def sampled_across_a_second(tb, between) -> None:
    """A sample, ``between()``, a sample at least 1.1 s later, then 1.1 s more: a 1 s grid then
    has a point before and a point after ``between`` (RabbitMQ floors the newest point)."""
    sample(tb)
    between()
    time.sleep(1.1)
    sample(tb)
    time.sleep(1.1)


def test_no_range_parameters_no_samples(tb):
    status, ov = http(tb.admin_url, "GET", "/api/overview")
    assert status == 200
    assert set(ov["message_stats"]["publish_details"]) == {"rate"}
    assert set(ov["queue_totals"]["messages_details"]) == {"rate"}
    assert ov["collect_statistics_interval"] == 5000


def test_queue_lengths_and_message_rates_samples(tb):
    name = uniq("samples-q")
    conn = pika_connect(tb.port)
    try:
        ch = conn.channel()
        ch.queue_declare(name)
        ch.confirm_delivery()

        def publish():
            for _ in range(6):
                ch.basic_publish("", name, b"x")
        sampled_across_a_second(tb, publish)
        status, q = http(tb.admin_url, "GET", f"/api/queues/%2F/{name}?lengths_age=60&lengths_incr=1"
                                              "&msg_rates_age=60&msg_rates_incr=1")
        assert status == 200
        ready = q["messages_ready_details"]
        stamps = [s["timestamp"] for s in ready["samples"]]
        assert stamps == sorted(stamps, reverse=True)           # newest first
        assert all(t % 1000 == 0 for t in stamps)                # on the incr grid
        assert all(a - b == 1000 for a, b in zip(stamps, stamps[1:]))
        values = [s["sample"] for s in ready["samples"]]
        assert values[0] == 6 and values[-1] == 0                # after and before the publishes
        assert ready["avg_rate"] > 0 and 0 < ready["avg"] < 6
        assert q["messages_details"]["samples"][0]["sample"] == 6
        assert q["messages_unacknowledged_details"]["samples"][0]["sample"] == 0
        publish_details = q["message_stats"]["publish_details"]
        assert publish_details["samples"][0]["sample"] == 6      # counters: the running total
        assert publish_details["samples"][-1]["sample"] == 0
        assert publish_details["avg_rate"] > 0
        # a list asks for the same and gets it per queue
        listed = {i["name"]: i for i in http(tb.admin_url, "GET", "/api/queues/%2F?lengths_age=60&lengths_incr=1")[1]}
        assert listed[name]["messages_ready_details"]["samples"][0]["sample"] == 6
    finally:
        close_quietly(conn)


def test_overview_and_exchange_samples(tb):
    name = uniq("samples-x")
    conn = pika_connect(tb.port)
    try:
        ch = conn.channel()
        ch.exchange_declare(name, "fanout")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, name)
        before = http(tb.admin_url, "GET", "/api/overview")[1]["message_stats"].get("publish", 0)

        def publish():
            for _ in range(4):
                ch.basic_publish(name, "", b"y")
            conn.process_data_events(0.1)
        sampled_across_a_second(tb, publish)
        ov = http(tb.admin_url, "GET", "/api/overview?msg_rates_age=30&msg_rates_incr=1"
                                       "&lengths_age=30&lengths_incr=1")[1]
        pub = ov["message_stats"]["publish_details"]["samples"]
        assert pub[0]["sample"] >= before + 4 and pub[-1]["sample"] <= before
        assert ov["queue_totals"]["messages_ready_details"]["samples"][0]["sample"] >= 4
        assert len(pub) <= 31
        x = http(tb.admin_url, "GET", f"/api/exchanges/%2F/{name}?msg_rates_age=30&msg_rates_incr=1")[1]
        assert x["message_stats"]["publish_in_details"]["samples"][0]["sample"] == 4
        assert x["message_stats"]["publish_out_details"]["samples"][-1]["sample"] == 0
    finally:
        close_quietly(conn)


@pytest.mark.parametrize("query", ["lengths_age=1000&lengths_incr=1", "msg_rates_age=0&msg_rates_incr=5",
                                   "lengths_age=60&lengths_incr=-5"])
def test_out_of_bounds_ranges_refused(tb, query):
    status, body = http(tb.admin_url, "GET", "/api/overview?" + query)
    assert status == 400
    assert body["error"] == "invalid_range_parameters"
    assert body["reason"].startswith("Invalid range parameters: age ")


def test_incomplete_or_non_integer_ranges_ignored(tb):
    for query in ("lengths_age=60", "msg_rates_age=sixty&msg_rates_incr=5"):
        status, ov = http(tb.admin_url, "GET", "/api/overview?" + query)
        assert status == 200 and "samples" not in ov["message_stats"]["publish_details"]


def test_memory_bounded_and_idle_objects_free(tb):
    """A fixed number of samples; a sample stores only what moved (an idle queue: nothing)."""
    rates = tb.admin.context.rates
    idle = uniq("idle")

    def declare():
        vh = tb.broker.vhosts["/"]
        for i in range(50):
            vh.declare_queue(f"{idle}-{i}")
    tb.call(declare)
    for _ in range(rates.kept + 2):
        sample(tb)
    samples = list(rates._samples)
    assert len(samples) == rates.kept == 121
    assert all(not s.changed[t] for s in samples[-3:] for t in s.changed)  # nothing moved
    assert not any(k[1].startswith(idle) for k in rates._current["queues"])


def test_move_messages_api(tb):
    src, dst = uniq("mv-src"), uniq("mv-dst")
    for q in (src, dst):
        assert http(tb.admin_url, "PUT", f"/api/queues/%2F/{q}", {})[0] == 201
    for i in range(3):
        http(tb.admin_url, "POST", "/api/exchanges/%2F/amq.default/publish",
             {"routing_key": src, "payload": f"m{i}", "payload_encoding": "string",
              "properties": {"headers": {"n": i}, "delivery_mode": 2}})
    status, body = http(tb.admin_url, "POST", f"/api/queues/%2F/{src}/move", {"destination": dst, "count": 2})
    assert (status, body) == (200, {"moved": 2})
    got = http(tb.admin_url, "POST", f"/api/queues/%2F/{dst}/get", {"count": 5, "ackmode": "ack_requeue_true"})[1]
    assert [m["payload"] for m in got] == ["m0", "m1"]
    assert [m["properties"]["headers"]["n"] for m in got] == [0, 1]
    assert http(tb.admin_url, "GET", f"/api/queues/%2F/{src}")[1]["messages"] == 1
    assert http(tb.admin_url, "POST", f"/api/queues/%2F/{src}/move", {"destination": "nope"})[0] == 404
    status, body = http(tb.admin_url, "POST", f"/api/queues/%2F/{src}/move", {})
    assert status == 400 and "destination" in body["reason"]


def test_node_figures(tb):
    node = http(tb.admin_url, "GET", "/api/nodes")[1][0]
    assert node["mem_used"] > 0 and node["fd_used"] > 0 and node["fd_total"] >= node["fd_used"]
    assert node["alarms"] == [] and node["mem_alarm"] is False
    assert node["listeners"][0]["port"] == tb.port


def test_ui_served_from_the_package_without_external_urls(tb):
    import urllib.request
    with urllib.request.urlopen(tb.admin_url + "/", timeout=10) as resp:
        html = resp.read().decode()
        assert resp.headers["content-type"].startswith("text/html")
    assert "<title>exchange-broker management</title>" in html
    assets = re.findall(r'(?:src|href)="(ui/[^"]+)"', html)
    assert "ui/js/core.js" in assets and "ui/style.css" in assets
    for asset in assets:
        with urllib.request.urlopen(f"{tb.admin_url}/{asset}", timeout=10) as resp:
            assert resp.status == 200
    for path in ui_routes.UI_DIR.rglob("*"):
        if path.is_file():
            text = path.read_text()
            # nothing fetched from elsewhere (the SVG namespace URI is a name, never fetched)
            assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//|url\(\s*[\"']?(https?:)?//|@import",
                                 text), path


def test_login_failure_challenges_clients_but_not_the_ui(tb):
    """curl and friends get the Basic challenge; the UI's calls (X-Requested-With) do not, so the
    browser shows the UI's own message instead of its login dialog."""
    plain, ui = {}, {}
    assert http(tb.admin_url, "GET", "/api/whoami", password="wrong", answer_headers=plain)[0] == 401
    status, body = http(tb.admin_url, "GET", "/api/whoami", password="wrong", answer_headers=ui,
                        headers={"X-Requested-With": "XMLHttpRequest"})
    assert (status, body) == (401, {"error": "not_authorized", "reason": "Login failed"})
    assert plain["www-authenticate"].startswith("Basic realm=")
    assert "www-authenticate" not in ui
