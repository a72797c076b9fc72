"""/api/health/checks/*: RabbitMQ's 200 / 503 bodies (compared by hand with RabbitMQ 3.10's
management API), over real HTTP against a broker on ephemeral ports. Certificate expiration with
real TLS listeners is in tests/security/test_health_certificates.py."""

from __future__ import annotations

import pytest

NODE = "exchange-broker@localhost"
CHECKS = "/api/health/checks"


def test_alarms_ok_then_failed_with_rabbitmq_body_then_ok_again(api, admin_broker):
    assert api.get(f"{CHECKS}/alarms") == (200, {"status": "ok"})
    assert api.get(f"{CHECKS}/local-alarms") == (200, {"status": "ok"})
    broker = admin_broker.broker
    admin_broker.call(broker.set_alarm, "memory", True, "test")
    admin_broker.call(broker.set_alarm, "disk", True, "test")
    try:
        status, body = api.get(f"{CHECKS}/alarms")
        assert status == 503
        assert body == {"status": "failed", "reason": "There are alarms in effect in the cluster",
                        "alarms": [{"resource": "disk space", "node": NODE},
                                   {"resource": "memory", "node": NODE}]}
        status, body = api.get(f"{CHECKS}/local-alarms")
        assert status == 503 and body["reason"] == "There are alarms in effect on the node"
        assert len(body["alarms"]) == 2
    finally:
        admin_broker.call(broker.set_alarm, "memory", False)
        admin_broker.call(broker.set_alarm, "disk", False)
    assert api.get(f"{CHECKS}/alarms") == (200, {"status": "ok"})


def test_port_listener(api, admin_broker):
    port = admin_broker.port
    assert api.get(f"{CHECKS}/port-listener/{port}") == (200, {"status": "ok", "port": port})
    assert api.get(f"{CHECKS}/port-listener/+{port}") == (200, {"status": "ok", "port": port})
    assert api.get(f"{CHECKS}/port-listener/{admin_broker.admin_port}")[0] == 200  # the HTTP listener
    status, body = api.get(f"{CHECKS}/port-listener/1")
    assert status == 503
    assert body == {"status": "failed", "reason": "No active listener", "missing": 1,
                    "ports": [port, admin_broker.admin_port]}
    assert api.get(f"{CHECKS}/port-listener/abc") == (400, {"error": "bad_request", "reason": "Invalid port"})


@pytest.mark.parametrize("name,normal", [("amqp", "amqp"), ("AMQP", "amqp"), ("amqp0-9-1", "amqp"),
                                         ("amqp091", "amqp"), ("amqp0.9.1", "amqp"), ("amqp10", "amqp"),
                                         ("http", "http"), ("management", "http"), ("ui", "http"),
                                         ("http1.1", "http")])
def test_protocol_listener_aliases(shared_api, name, normal):
    assert shared_api.get(f"{CHECKS}/protocol-listener/{name}") == (200, {"status": "ok", "protocol": normal})


@pytest.mark.parametrize("name,missing", [("amqps", "amqp/ssl"), ("amqp%2Fssl", "amqp/ssl"),
                                          ("amqp/ssl", "amqp/ssl"), ("https", "https"), ("mqtt", "mqtt"),
                                          ("stomp+tls", "stomp/ssl"), ("cli", "clustering")])
def test_protocol_listener_missing(shared_api, name, missing):
    status, body = shared_api.get(f"{CHECKS}/protocol-listener/{name}")
    assert status == 503
    assert body == {"status": "failed", "reason": "No active listener", "missing": missing,
                    "protocols": ["amqp", "http"]}


def test_single_node_checks(shared_api):
    assert shared_api.get(f"{CHECKS}/virtual-hosts") == (200, {"status": "ok"})
    single = {"status": "ok", "reason": "single node cluster"}
    assert shared_api.get(f"{CHECKS}/node-is-quorum-critical") == (200, single)
    assert shared_api.get(f"{CHECKS}/node-is-mirror-sync-critical") == (200, single)
    assert shared_api.get("/api/healthchecks/node") == (200, {"status": "ok"})


def test_certificate_expiration_without_tls_and_bad_arguments(shared_api):
    for unit in ("days", "weeks", "months", "years", "DAYS"):
        assert shared_api.get(f"{CHECKS}/certificate-expiration/1/{unit}") == (200, {"status": "ok"})
    assert shared_api.get(f"{CHECKS}/certificate-expiration/1/fortnights") == (
        400, {"error": "bad_request",
              "reason": "Time unit not recognised. Supported units: days, weeks, months, years."})
    assert shared_api.get(f"{CHECKS}/certificate-expiration/x/days") == (
        400, {"error": "bad_request", "reason": "Invalid expiration value."})


def test_health_checks_need_a_management_user(shared_api):
    status, body = shared_api.as_user("guest", "wrong").get(f"{CHECKS}/alarms")
    assert status == 401 and body["error"] == "not_authorized"
    shared_api.ok("PUT", "/api/users/health-monitor", {"password": "pw", "tags": "monitoring"})
    shared_api.ok("PUT", "/api/users/health-nobody", {"password": "pw", "tags": ""})
    try:
        assert shared_api.as_user("health-monitor", "pw").get(f"{CHECKS}/alarms") == (200, {"status": "ok"})
        assert shared_api.as_user("health-nobody", "pw").get(f"{CHECKS}/alarms")[0] == 401
    finally:
        shared_api.ok("DELETE", "/api/users/health-monitor")
        shared_api.ok("DELETE", "/api/users/health-nobody")
    assert shared_api.post(f"{CHECKS}/alarms")[0] == 405
