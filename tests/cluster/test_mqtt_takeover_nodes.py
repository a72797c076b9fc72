"""MQTT client-id takeover across the nodes of a cluster with per-queue leaders (real node
processes on one PostgreSQL database): a persistent session's client id connecting on another
node closes its older connection (MQTT 5: DISCONNECT 0x8E, the will published), whichever of the
two nodes leads the session's queue, or when neither does (three nodes), and the new connection
gets the messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests

from eb_support import steady_port, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mqtt"))
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho_support import V5, Paho  # noqa: E402  (tests/mqtt's paho-mqtt client)

pytestmark = pytest.mark.slow


def _kept() -> Properties:
    pr = Properties(PacketTypes.CONNECT)
    pr.SessionExpiryInterval = 600
    return pr


def test_takeover_closes_the_older_connection_on_the_other_node(nodes):
    p1, p2 = steady_port(), steady_port()
    slow = ("--cluster-mode", "leaders", "--cluster-heartbeat", "1", "--cluster-failover-timeout", "20")
    n1, n2 = nodes.together(("t1", *slow, "--mqtt-port", str(p1)), ("t2", *slow, "--mqtt-port", str(p2)))  # peers
    assert n1.alive() and n2.alive()
    made: list[Paho] = []

    def client(port: int, client_id: str, **kw) -> Paho:
        c = Paho(port, client_id, version=V5, **kw)
        made.append(c)
        return c
    try:
        watcher = client(p1, "watcher")
        watcher.subscribe("status/#", 1)
        first = client(p1, "roam", properties=_kept(), will=("status/roam", b"gone", 1, False))
        assert first.subscribe("fleet/roam/#", 1)[0].value == 1  # its queue is led by n1
        binding = (f"http://127.0.0.1:{n2.admin_port}/api/bindings/%2F/e/amq.topic/q/"
                   f"mqtt-subscription-roamqos1")

        def bound() -> bool:
            r = requests.get(binding, auth=("guest", "guest"), timeout=5)
            return r.status_code == 200 and bool(r.json())
        assert wait_until(bound, 20)

        # the newer connection on n2 (not the leader): n1's connection notices within a second or two
        second = client(p2, "roam", properties=_kept(), clean_start=False)
        assert second.connack[0] is True
        assert first.disconnected.wait(10), "the older connection on n1 stayed open"
        assert first.disconnect_reason.value == 0x8E  # session taken over
        assert [m.payload for m in watcher.wait_messages(1)] == [b"gone"]
        sender = client(p1, "sender")
        sender.publish("fleet/roam/1", b"to the new one", 1)
        assert [m.payload for m in second.wait_messages(1, timeout=20)] == [b"to the new one"]
        # its PUBACK settles the message at the leader (n2 passes it on over its link); a takeover
        # before that hands the message to the next connection again, as QoS 1 must
        queue = f"http://127.0.0.1:{n1.admin_port}/api/queues/%2F/mqtt-subscription-roamqos1"

        def settled() -> bool:
            r = requests.get(queue, auth=("guest", "guest"), timeout=5)
            row = r.json() if r.status_code == 200 else {}
            return (row.get("messages"), row.get("messages_unacknowledged")) == (0, 0)
        assert wait_until(settled, 10), requests.get(queue, auth=("guest", "guest"), timeout=5).text

        # the newer connection on n1 (the leader): n2's connection is cancelled at once
        third = client(p1, "roam", properties=_kept(), clean_start=False)
        assert third.connack[0] is True
        assert second.disconnected.wait(10), "the older connection on n2 stayed open"
        assert second.disconnect_reason.value == 0x8E
        sender.publish("fleet/roam/2", b"to the third", 1)
        assert [m.payload for m in third.wait_messages(1, timeout=20)] == [b"to the third"]
        assert not third.disconnected.is_set()
    finally:
        for c in made:
            c.close()


def test_takeover_between_two_nodes_that_do_not_lead_the_queue(nodes):
    p1, p2, p3 = steady_port(), steady_port(), steady_port()
    slow = ("--cluster-mode", "leaders", "--cluster-heartbeat", "1", "--cluster-failover-timeout", "20")
    n1, n2, n3 = nodes.together(("u1", *slow, "--mqtt-port", str(p1)), ("u2", *slow, "--mqtt-port", str(p2)),
                                ("u3", *slow, "--mqtt-port", str(p3)))  # at once: peers
    assert n1.alive() and n2.alive() and n3.alive()
    made: list[Paho] = []

    def client(port: int, client_id: str, **kw) -> Paho:
        c = Paho(port, client_id, version=V5, **kw)
        made.append(c)
        return c
    try:
        setup = client(p1, "trio", properties=_kept())
        assert setup.subscribe("trio/#", 1)[0].value == 1  # the queue is led by n1
        setup.close()
        for n in (n2, n3):
            url = (f"http://127.0.0.1:{n.admin_port}/api/bindings/%2F/e/amq.topic/q/"
                   f"mqtt-subscription-trioqos1")

            def bound() -> bool:
                r = requests.get(url, auth=("guest", "guest"), timeout=5)
                return r.status_code == 200 and bool(r.json())
            assert wait_until(bound, 20)
        older = client(p2, "trio", properties=_kept(), clean_start=False)
        assert older.connack[0] is True
        wait_until(lambda: False, 1.5)  # n1's scan sees n2's relay first
        newer = client(p3, "trio", properties=_kept(), clean_start=False)
        assert newer.connack[0] is True
        assert older.disconnected.wait(10), "the older connection on n2 stayed open"
        assert older.disconnect_reason.value == 0x8E
        client(p1, "trio-sender").publish("trio/x", b"to the newest", 1)
        assert [m.payload for m in newer.wait_messages(1, timeout=20)] == [b"to the newest"]
        assert not newer.disconnected.is_set()
    finally:
        for c in made:
            c.close()
