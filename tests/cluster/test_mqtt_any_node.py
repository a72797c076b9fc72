"""MQTT on a cluster with per-queue leaders (real node processes on one PostgreSQL database): a
persistent MQTT session made on one node is found when the client reconnects to another, with
the QoS 1 messages published meanwhile through a third connection on either node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests

from eb_support import steady_port, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mqtt"))
from paho_support import Paho  # noqa: E402  (tests/mqtt's paho-mqtt client)

pytestmark = pytest.mark.slow


def test_persistent_session_is_found_on_another_node(nodes):
    p1, p2 = steady_port(), steady_port()
    # no failover is tested here: a generous timeout, so a loaded machine does not evict a node
    slow = ("--cluster-mode", "leaders", "--cluster-heartbeat", "1", "--cluster-failover-timeout", "20")
    n1, n2 = nodes.together(("m1", *slow, "--mqtt-port", str(p1)), ("m2", *slow, "--mqtt-port", str(p2)))  # peers
    assert n1.alive() and n2.alive()
    device = Paho(p1, "roaming", clean=False)
    assert device.subscribe("fleet/roaming/#", 1)[0].value == 1
    device.close()
    # n2 follows the shared definitions: the queue and its binding reach it within a beat or two
    binding = (f"http://127.0.0.1:{n2.admin_port}/api/bindings/%2F/e/amq.topic/q/"
               f"mqtt-subscription-roamingqos1")
    def bound() -> bool:
        r = requests.get(binding, auth=("guest", "guest"), timeout=5)
        return r.status_code == 200 and bool(r.json())
    assert wait_until(bound, 20)
    sender = Paho(p2, "sender")  # n2 routes to the queue's leader, n1
    try:
        for i in range(3):
            sender.publish(f"fleet/roaming/{i}", f"m{i}".encode(), 1)
    finally:
        sender.close()
    back = Paho(p2, "roaming", clean=False)
    try:
        assert back.connack[0] is True  # the session is found on the other node
        got = back.wait_messages(3, timeout=20)
        assert sorted(m.payload for m in got) == [b"m0", b"m1", b"m2"]
    finally:
        back.close()
