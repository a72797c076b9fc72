"""amqplib, the Node.js client, against the broker: tests/interop/node/amqplib_roundtrip.js.

Needs node and npm; node_modules is installed with `npm ci` (from package-lock.json) on first run.
Skipped, with the reason, when node/npm are missing or the npm registry cannot be reached.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from eb_support import NODE_DIR, node_with_amqplib
from exchange_broker.testing import ThreadedBroker

SCRIPT = NODE_DIR / "amqplib_roundtrip.js"


def test_amqplib_roundtrip(broker):
    node = node_with_amqplib()
    proc = subprocess.run([node, str(SCRIPT), f"amqp://guest:guest@127.0.0.1:{broker.port}/"],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc={proc.returncode}): {proc.stderr}"
    out = json.loads(lines[-1])
    assert "error" not in out, out["error"]
    assert proc.returncode == 0, proc.stderr

    assert out["server_product"] == "exchange-broker"
    assert "connection_error" not in out
    # assertQueue, then five persistent messages through a confirm channel
    assert out["assert_queue"] == {"queue": "node_tasks", "messageCount": 0, "consumerCount": 0}
    assert out["confirms"] == [f"ack {i}" for i in range(5)]
    assert out["check_queue"] == 5
    # consumed in order, acked, with every property and the nested headers table intact
    assert out["consumed"] == [
        {"body": f"task {i}", "redelivered": False, "deliveryTag": i + 1, "deliveryMode": 2,
         "contentType": "text/plain", "correlationId": f"c{i}",
         "headers": {"index": i, "tag": "node", "nested": {"ok": True}}}
        for i in range(5)
    ]
    assert out["consumer_tag_prefix"] == "amq.ctag-"
    assert out["after_consume"] == 0
    # topic exchange, server-named queue, exchange-to-exchange binding, mandatory returns
    assert out["server_named"] is True
    assert out["routed"] == [["node_topic", "orders.created", "order 1"],
                             ["node_topic", "audit.login.ok", "via e2e"],
                             ["node_topic", "orders.paid", "order 1 paid"]]
    assert out["returned"] == [
        {"body": "too deep", "replyCode": 312, "replyText": "NO_ROUTE",
         "routingKey": "orders.created.eu"},
        {"body": "after unbind", "replyCode": 312, "replyText": "NO_ROUTE",
         "routingKey": "orders.created"},
    ]
    assert out["returned_after_unbind"] == 2
    # basic.get, nack(requeue) and redelivery, get-empty
    assert out["get_first"] == {"body": "shipped", "redelivered": False, "messageCount": 0}
    assert out["get_again"] == {"body": "shipped", "redelivered": True}
    assert out["get_empty"] is False
    assert out["delete_queue"] == 0


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 on this machine")
def test_amqplib_over_ipv6():
    # Node 18+ resolves localhost to ::1 where the resolver says so: the default listener (::)
    # takes it, as RabbitMQ's does (tests/compat/test_ipv6.py)
    node = node_with_amqplib()
    with ThreadedBroker(host="::") as tb:
        proc = subprocess.run([node, str(SCRIPT), f"amqp://guest:guest@[::1]:{tb.port}/"],
                              cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc={proc.returncode}): {proc.stderr}"
    out = json.loads(lines[-1])
    assert "error" not in out, out
    assert out["confirms"] == [f"ack {i}" for i in range(5)]
    assert [m["body"] for m in out["consumed"]] == [f"task {i}" for i in range(5)]
