"""MQTT connections in the admin API (/api/connections with protocol "MQTT 3.1.1" / "MQTT 5.0",
/api/consumers, closing one by name, /api/overview counts) and the resource alarms pausing MQTT
publishers as they pause AMQP ones (their socket is not read until the alarm clears)."""

from __future__ import annotations

import base64
import json
import urllib.request
from urllib.parse import quote

import pytest
from eb_support import wait_until
from paho_support import V5, Paho

from exchange_broker.mqtt.hub import MQTTSettings
from exchange_broker.testing import ThreadedBroker


@pytest.fixture(scope="module")
def admin_mqtt():
    with ThreadedBroker(admin=True, mqtt=MQTTSettings(), mqtt_ws=True) as tb:
        yield tb


def test_mqtt_listeners_in_the_overview_and_the_health_checks(admin_mqtt):
    _, overview = api(admin_mqtt, "GET", "/api/overview")
    listed = {(x["protocol"], x["port"]) for x in overview["listeners"]}
    assert {("mqtt", admin_mqtt.mqtt_port), ("http/web-mqtt", admin_mqtt.mqtt_ws_port)} <= listed
    for name in ("mqtt", "web-mqtt"):
        status, body = api(admin_mqtt, "GET", f"/api/health/checks/protocol-listener/{name}")
        assert (status, body["status"]) == (200, "ok")


def api(tb, method: str, path: str):
    req = urllib.request.Request(tb.admin_url + path, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=15) as resp:
        body = resp.read()
        return resp.status, json.loads(body) if body else None


def test_mqtt_connections_are_listed_and_can_be_closed(admin_mqtt):
    old = Paho(admin_mqtt.mqtt_port, "adm-311")
    new = Paho(admin_mqtt.mqtt_port, "adm-5", version=V5, keepalive=30)
    try:
        new.subscribe("adm/#", 1)
        _, conns = api(admin_mqtt, "GET", "/api/connections")
        by_client = {c["client_properties"].get("client_id"): c for c in conns}
        assert by_client["adm-311"]["protocol"] == "MQTT 3.1.1"
        five = by_client["adm-5"]
        assert (five["protocol"], five["user"], five["vhost"], five["timeout"], five["state"]) == \
            ("MQTT 5.0", "guest", "/", 30, "running")
        assert five["port"] == admin_mqtt.mqtt_port
        _, consumers = api(admin_mqtt, "GET", "/api/consumers")
        assert [c["queue"]["name"] for c in consumers] == ["mqtt-subscription-adm-5qos1"]
        _, overview = api(admin_mqtt, "GET", "/api/overview")
        assert overview["object_totals"]["connections"] == 2
        with urllib.request.urlopen(admin_mqtt.admin_url + "/metrics", timeout=15) as resp:
            assert "rabbitmq_connections 2.0" in resp.read().decode()
        status, _ = api(admin_mqtt, "DELETE", "/api/connections/" + quote(by_client["adm-311"]["name"], safe=""))
        assert status == 204
        assert old.disconnected.wait(10)
        assert not new.disconnected.is_set()
    finally:
        old.close()
        new.close()


def test_a_resource_alarm_pauses_mqtt_publishers_until_it_clears(admin_mqtt):
    sub = Paho(admin_mqtt.mqtt_port, "al-sub")
    pub = Paho(admin_mqtt.mqtt_port, "al-pub")
    try:
        sub.subscribe("al/#", 1)
        pub.publish("al/1", b"before")  # a publisher now: alarms block it
        admin_mqtt.call(lambda: admin_mqtt.broker.set_alarm("memory", True, "test"))
        _, conns = api(admin_mqtt, "GET", "/api/connections")
        assert {c["client_properties"]["client_id"]: c["state"] for c in conns}["al-pub"] == "blocked"
        held = pub.client.publish("al/2", b"during", 1)
        assert not wait_until(held.is_published, 1.0)  # not read: no PUBACK, not delivered
        assert [m.payload for m in sub.wait_messages(1)] == [b"before"]
        admin_mqtt.call(lambda: admin_mqtt.broker.set_alarm("memory", False))
        assert wait_until(held.is_published, 10)
        assert [m.payload for m in sub.wait_messages(2)] == [b"before", b"during"]
    finally:
        sub.close()
        pub.close()
