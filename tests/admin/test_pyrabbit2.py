"""pyrabbit2, a third-party client of RabbitMQ's management API, driving this broker unchanged."""

from __future__ import annotations

import time

import pika
import pyrabbit2
import pyrabbit2.api
import pytest
from pyrabbit2.http import HTTPError


@pytest.fixture
def client(admin_broker):
    return pyrabbit2.Client(f"127.0.0.1:{admin_broker.admin_port}", "guest", "guest", timeout=10)


def test_pyrabbit2_end_to_end(client, admin_broker):
    assert client.is_alive()
    assert client.get_whoami()["name"] == "guest"
    assert client.get_overview()["object_totals"]["queues"] >= 0
    assert "/" in client.get_vhost_names()

    client.create_vhost("app")
    client.set_vhost_permissions("app", "guest", ".*", ".*", ".*")
    assert client.get_vhost("app")["name"] == "app"
    assert client.create_exchange("app", "events", "topic", durable=True)
    assert client.get_exchange("app", "events")["type"] == "topic"
    assert {e["name"] for e in client.get_exchanges("app")} >= {"events", "amq.topic"}
    client.create_queue("app", "audit", durable=True, arguments={"x-max-length": 100})
    client.create_queue("app", "audit-2")
    assert client.get_queue("app", "audit")["arguments"] == {"x-max-length": 100}
    # pyrabbit2 sends "arguments": [] when it has none
    client.create_binding("app", "events", "audit", "user.*")
    client.create_binding("app", "events", "audit-2", "user.created", {"extra": 1})
    assert {b["routing_key"] for b in client.get_queue_bindings("app", "audit")} == {"audit", "user.*"}

    assert client.publish("app", "events", "user.created", "hello") is True
    assert client.publish("app", "events", "order.created", "nobody") is False
    assert client.get_queue_depth("app", "audit") == 1
    assert client.get_queue_depth("app", "audit-2") == 1
    msgs = client.get_messages("app", "audit", count=5, requeue=True)
    assert [m["payload"] for m in msgs] == ["hello"]
    assert client.get_queue_depth("app", "audit") == 1
    msgs = client.get_messages("app", "audit", count=5, requeue=False)
    assert msgs[0]["redelivered"] is True
    assert client.get_queue_depth("app", "audit") == 0

    client.publish("app", "amq.default", "audit", "direct")
    client.purge_queue("app", "audit")
    assert client.get_queue_depth("app", "audit") == 0

    # pattern search goes through pagination (page, page_count)
    names = {x["name"] for x in client.get_queues("app", pattern="audit")}
    assert names == {"audit", "audit-2"}
    assert {x["name"] for x in client.get_queues("app", pattern="^audit$", regex=True)} == {"audit"}

    client.delete_binding("app", "events", "audit", "user.*")
    assert {b["source"] for b in client.get_queue_bindings("app", "audit")} == {""}

    defs = client.get_definitions()
    assert {(x["vhost"], x["name"]) for x in defs["queues"]} >= {("app", "audit"), ("app", "audit-2")}

    client.delete_queue("app", "audit")
    client.delete_exchange("app", "events")
    with pytest.raises(HTTPError) as info:
        client.get_queue("app", "audit")
    assert info.value.status == 404
    client.delete_vhost("app")
    assert "app" not in client.get_vhost_names()


def test_pyrabbit2_connections(client, admin_broker):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", admin_broker.port, heartbeat=0))
    try:
        conn.channel()
        conns = client.get_connections()
        assert len(conns) == 1 and conns[0]["user"] == "guest"
        assert client.get_connection(conns[0]["name"])["vhost"] == "/"
        assert len(client.get_channels()) == 1
        client.delete_connection(conns[0]["name"])
        deadline = time.time() + 5
        while conn.is_open and time.time() < deadline:
            try:
                conn.process_data_events(0.05)
            except pika.exceptions.AMQPConnectionError:
                break
        assert not conn.is_open
    finally:
        if conn.is_open:
            conn.close()


def test_pyrabbit2_wrong_password(admin_broker):
    bad = pyrabbit2.Client(f"127.0.0.1:{admin_broker.admin_port}", "guest", "nope", timeout=10)
    with pytest.raises(pyrabbit2.api.PermissionError):
        bad.get_overview()
