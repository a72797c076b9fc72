"""Definitions: export in RabbitMQ's format, import (merge) into a fresh broker, RabbitMQ exports load."""

from __future__ import annotations

import json
import pathlib

import pika
from admin_helpers import Api

from exchange_broker.testing import ThreadedBroker

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "rabbitmq-3.10-export.json"


def _canon(defs: dict) -> dict:
    """Definitions as comparable sets (order does not matter)."""
    out = {}
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings"):
        out[key] = sorted(json.dumps(item, sort_keys=True) for item in defs.get(key, []))
    return out


def _populate(api: Api) -> None:
    api.ok("PUT", "/api/vhosts/prod")
    api.ok("PUT", "/api/users/ops", {"password": "s3cret", "tags": "monitoring,management"})
    api.ok("PUT", "/api/permissions/prod/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    api.ok("PUT", "/api/permissions/prod/ops", {"configure": "", "write": "^ops\\.", "read": ".*"})
    api.ok("PUT", "/api/exchanges/prod/events", {"type": "topic", "durable": True,
                                                  "arguments": {"alternate-exchange": "unrouted"}})
    api.ok("PUT", "/api/exchanges/prod/unrouted", {"type": "fanout", "durable": True})
    api.ok("PUT", "/api/exchanges/prod/match", {"type": "headers", "durable": True})
    api.ok("PUT", "/api/exchanges/prod/temp", {"type": "direct", "auto_delete": False, "internal": True})
    api.ok("PUT", "/api/queues/prod/orders", {"durable": True, "arguments": {
        "x-message-ttl": 60000, "x-dead-letter-exchange": "unrouted", "x-max-length": 1000}})
    api.ok("PUT", "/api/queues/prod/lost", {"durable": True})
    api.ok("PUT", "/api/queues/%2F/plain", {"durable": False, "auto_delete": True})
    api.ok("POST", "/api/bindings/prod/e/events/q/orders", {"routing_key": "order.*"})
    api.ok("POST", "/api/bindings/prod/e/events/q/orders", {"routing_key": "refund.#", "arguments": {"v": 2}})
    api.ok("POST", "/api/bindings/prod/e/unrouted/q/lost", {})
    api.ok("POST", "/api/bindings/prod/e/events/e/match", {"routing_key": "audit.#"})
    api.ok("POST", "/api/bindings/prod/e/match/q/orders", {"arguments": {"x-match": "all", "kind": "vip"}})
    api.ok("POST", "/api/bindings/%2F/e/amq.fanout/q/plain", {})


def test_export_format(api):
    _populate(api)
    defs = api.ok("GET", "/api/definitions")
    for key in ("rabbit_version", "rabbitmq_version", "product_name", "product_version", "users", "vhosts",
                "permissions", "topic_permissions", "parameters", "global_parameters", "policies",
                "queues", "exchanges", "bindings"):
        assert key in defs, key
    assert {"name": "orders", "vhost": "prod", "durable": True, "auto_delete": False, "arguments": {
        "x-message-ttl": 60000, "x-dead-letter-exchange": "unrouted", "x-max-length": 1000}} in defs["queues"]
    assert {"name": "events", "vhost": "prod", "type": "topic", "durable": True, "auto_delete": False,
            "internal": False, "arguments": {"alternate-exchange": "unrouted"}} in defs["exchanges"]
    assert not any(x["name"].startswith("amq.") or x["name"] == "" for x in defs["exchanges"])
    assert {"source": "match", "vhost": "prod", "destination": "orders", "destination_type": "queue",
            "routing_key": "", "arguments": {"x-match": "all", "kind": "vip"}} in defs["bindings"]
    assert not any(b["source"] == "" for b in defs["bindings"])
    ops = next(u for u in defs["users"] if u["name"] == "ops")
    assert ops["hashing_algorithm"] == "rabbit_password_hashing_sha256" and ops["password_hash"]
    assert sorted(ops["tags"]) == ["management", "monitoring"]
    assert {"user": "ops", "vhost": "prod", "configure": "", "write": "^ops\\.", "read": ".*"} in \
        defs["permissions"]
    per_vhost = api.ok("GET", "/api/definitions/prod")
    assert {q["name"] for q in per_vhost["queues"]} == {"orders", "lost"}
    assert "vhost" not in per_vhost["queues"][0]


def test_export_import_roundtrip_into_fresh_broker(api):
    _populate(api)
    exported = api.ok("GET", "/api/definitions")
    with ThreadedBroker(admin=True) as fresh:
        other = Api(fresh.admin_url)
        assert other.post("/api/definitions", exported)[0] == 204
        again = other.ok("GET", "/api/definitions")
        assert _canon(again) == _canon(exported)
        for path in ("/api/queues/prod", "/api/exchanges/prod", "/api/bindings/prod", "/api/bindings/%2F"):
            def strip(items):
                return sorted(json.dumps({k: v for k, v in i.items() if k in (
                    "name", "vhost", "type", "durable", "auto_delete", "internal", "arguments", "source",
                    "destination", "destination_type", "routing_key", "properties_key", "exclusive")},
                    sort_keys=True) for i in items)
            assert strip(other.ok("GET", path)) == strip(api.ok("GET", path)), path
        # the imported user logs in with its original password (the hash travelled)
        assert other.as_user("ops", "s3cret").get("/api/overview")[0] == 200
        # importing the same document again changes nothing (merge)
        assert other.post("/api/definitions", exported)[0] == 204
        assert _canon(other.ok("GET", "/api/definitions")) == _canon(exported)
        # and the imported topology routes over AMQP
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fresh.port, "prod", heartbeat=0))
        try:
            ch = conn.channel()
            ch.basic_publish("events", "order.new", b"o1")
            ch.basic_publish("events", "nothing.here", b"lost1")
            ch.basic_publish("events", "audit.x", b"vip", pika.BasicProperties(headers={"kind": "vip"}))
            conn.process_data_events(0.1)
        finally:
            conn.close()
        assert other.ok("GET", "/api/queues/prod/orders")["messages"] == 2
        assert other.ok("GET", "/api/queues/prod/lost")["messages"] == 1


def test_import_rabbitmq_export_unchanged(api):
    doc = json.loads(FIXTURE.read_text())
    assert doc["product_name"] == "RabbitMQ"
    assert api.post("/api/definitions", doc)[0] == 204
    mine = api.ok("GET", "/api/definitions")
    for key in ("queues", "exchanges", "bindings"):
        for item in doc[key]:
            assert item in mine[key], (key, item)
    assert {"name": "probe"} in [{"name": v["name"]} for v in mine["vhosts"]]
    for perm in doc["permissions"]:
        assert perm in mine["permissions"]
    # RabbitMQ's password hash works here: probeuser's password is "secret"
    assert api.as_user("probeuser", "secret").get("/api/whoami")[1] == {"name": "probeuser",
                                                                         "tags": ["monitoring"]}
    assert api.as_user("probeuser", "wrong").get("/api/whoami")[0] == 401
    # the imported topology works: ex1 (topic, alternate-exchange ae) -> q1 on a.*, else -> ae -> unrouted
    assert api.ok("POST", "/api/exchanges/probe/ex1/publish", {"routing_key": "a.b", "payload": "1",
                                                               "payload_encoding": "string",
                                                               "properties": {}}) == {"routed": True}
    api.ok("POST", "/api/exchanges/probe/ex1/publish", {"routing_key": "zzz", "payload": "2",
                                                        "payload_encoding": "string", "properties": {}})
    assert api.ok("GET", "/api/queues/probe/q1")["messages"] == 1
    assert api.ok("GET", "/api/queues/probe/unrouted")["messages"] == 1
    api.ok("POST", "/api/exchanges/probe/fan/publish", {"routing_key": "", "payload": "3",
                                                        "payload_encoding": "string",
                                                        "properties": {"headers": {"kind": "order"}}})
    assert api.ok("GET", "/api/queues/probe/orders")["messages"] == 1


def test_vhost_scoped_import(api):
    api.ok("PUT", "/api/vhosts/scoped")
    doc = {"queues": [{"name": "sq", "durable": True, "auto_delete": False, "arguments": {}}],
           "exchanges": [{"name": "sx", "type": "direct", "durable": True, "auto_delete": False,
                          "internal": False, "arguments": {}}],
           "bindings": [{"source": "sx", "destination": "sq", "destination_type": "queue",
                         "routing_key": "k", "arguments": {}}]}
    assert api.post("/api/definitions/scoped", doc)[0] == 204
    exported = api.ok("GET", "/api/definitions/scoped")
    assert exported["queues"] == doc["queues"] and exported["exchanges"] == doc["exchanges"]
    assert exported["bindings"] == doc["bindings"]


def test_invalid_import_applies_nothing(api):
    before = api.ok("GET", "/api/definitions")
    bad = {"vhosts": [{"name": "new-vhost"}],
           "queues": [{"name": "fine", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
                      {"name": "broken", "vhost": "/", "durable": "maybe", "arguments": {}}]}
    status, err = api.post("/api/definitions", bad)
    assert status == 400 and "not_boolean" in json.dumps(err["reason"])
    assert _canon(api.ok("GET", "/api/definitions")) == _canon(before)


def test_import_conflict_reports_400(api):
    api.ok("PUT", "/api/queues/%2F/clash", {"durable": True})
    status, err = api.post("/api/definitions", {"queues": [{"name": "clash", "vhost": "/", "durable": False,
                                                            "auto_delete": False, "arguments": {}}]})
    assert status == 400 and "inequivalent arg 'durable'" in err["reason"]
    assert api.ok("GET", "/api/queues/%2F/clash")["durable"] is True
