"""IPv6: the default listener is ``::`` on one dual-stack socket, as RabbitMQ's default listener
(``listeners.tcp.default``), so clients that resolve ``localhost`` to ``::1`` (Node 18+) connect;
IPv4 clients still do and are shown with their IPv4 address (rabbit_misc:ntoa unmaps them).
``--host 127.0.0.1`` is IPv4 only, as before. The admin listener follows ``--host`` likewise."""

from __future__ import annotations

import json
import socket
import urllib.request

import pika
import pytest

from eb_support import wait_until
from exchange_broker.config import Config
from exchange_broker.testing import ThreadedBroker

pytestmark = pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 on this machine")


def _pika(host: str, port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host, port, "/", pika.PlainCredentials("guest", "guest"),
                                                             heartbeat=0))


def _roundtrip(conn: pika.BlockingConnection, body: bytes) -> bytes:
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, body)
    got = wait_until(lambda: ch.basic_get(queue, auto_ack=True)[2])
    return got


def _admin_get(url: str):
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


def test_default_host_is_the_dual_stack_wildcard():
    assert Config().host == "::"


def test_dual_stack_listener_takes_ipv6_and_ipv4_clients():
    with ThreadedBroker(host="::", admin=True) as tb:
        v6 = _pika("::1", tb.port)
        v4 = _pika("127.0.0.1", tb.port)
        try:
            assert _roundtrip(v6, b"over ipv6") == b"over ipv6"
            assert _roundtrip(v4, b"over ipv4") == b"over ipv4"
            # the admin API on the same wildcard answers on both families; peers are shown as
            # RabbitMQ shows them: ::1, and 127.0.0.1 (not ::ffff:127.0.0.1)
            peers = sorted(c["peer_host"] for c in _admin_get(f"http://[::1]:{tb.admin_port}/api/connections"))
            assert peers == ["127.0.0.1", "::1"]
            assert _admin_get(f"http://127.0.0.1:{tb.admin_port}/api/overview")["listeners"]
        finally:
            v6.close()
            v4.close()


def test_ipv4_host_is_ipv4_only():
    with ThreadedBroker(host="127.0.0.1") as tb:
        with pytest.raises(OSError):
            socket.create_connection(("::1", tb.port), timeout=5).close()
        conn = _pika("127.0.0.1", tb.port)
        conn.close()

