"""Durable definitions and persistent messages survive a restart; nothing transient is ever written.

Runs on SQLite and PostgreSQL, with a graceful stop (SIGTERM) and with SIGKILL.

AMQP cannot create virtual hosts: the second-vhost test goes through the admin HTTP API (on a
free ephemeral port, never 15672) and is skipped when the broker has no ``--admin-port``.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request

import pika
import pika.exceptions
import pytest
from sqlalchemy import select

from durability_helpers import (PERSISTENT, TRANSIENT, connect, exists, message_count, pumper,
                                serve_has_option)
from eb_support import close_quietly, free_port
from persistence.models import exchanges, queues

QUEUE_ARGS = {"x-max-length": 1000}
HEADERS_ARGS = {"x-match": "all", "k": "v"}
LATE = 20  # queues declared and bound just before the stop
DURABLE_QUEUES = {"dq", "dq2", "dq3", "du", "sync", "pq"}


def _declare_topology(ch) -> None:
    ch.exchange_declare("dx", "topic", durable=True)
    ch.exchange_declare("dx2", "fanout", durable=True)
    ch.exchange_declare("hx", "headers", durable=True)
    ch.exchange_declare("tx", "direct", durable=False)  # not durable
    ch.queue_declare("dq", durable=True, arguments=QUEUE_ARGS)
    ch.queue_declare("dq2", durable=True)
    ch.queue_declare("dq3", durable=True)
    ch.queue_declare("du", durable=True)
    ch.queue_declare("sync", durable=True)
    ch.queue_declare("tq", durable=False)  # not durable
    ch.queue_declare("xq", durable=True, exclusive=True)  # exclusive: dies with its connection
    ch.queue_bind("dq", "dx", "a.*")
    ch.exchange_bind(destination="dx2", source="dx", routing_key="a.#")  # exchange -> exchange
    ch.queue_bind("dq2", "dx2", "")
    ch.queue_bind("dq3", "hx", "", arguments=HEADERS_ARGS)
    ch.queue_bind("tq", "dx", "a.*")  # durable source, transient queue: not stored
    ch.queue_bind("dq", "tx", "k")  # transient source: not stored
    # deleted again before the stop: deletes and unbinds are durable too
    ch.exchange_declare("gone", "direct", durable=True)
    ch.queue_declare("gq", durable=True)
    ch.queue_bind("gq", "dx", "a.*")
    ch.queue_bind("dq", "gone", "k")
    ch.queue_bind("dq", "dx", "z.*")
    ch.basic_publish("", "gq", b"lost-with-queue", PERSISTENT)
    ch.queue_unbind("dq", "dx", "z.*")
    ch.exchange_delete("gone")
    ch.queue_delete("gq")
    ch.queue_declare("pq", durable=True)
    ch.basic_publish("", "pq", b"purged", PERSISTENT)
    ch.queue_purge("pq")


def _barrier(ch) -> None:
    """A confirmed persistent publish: every write submitted before it is committed by now."""
    ch.basic_publish("", "sync", b"barrier", PERSISTENT)


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_definitions_and_messages_survive_restart(broker_factory, backend, stop):
    b = broker_factory()
    conn = connect(b)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        _declare_topology(ch)
        props = pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id="m-1",
                                     headers={"h": "x", "n": 7}, priority=3)
        ch.basic_publish("dx", "a.b", b"p1", props)                       # -> dq, dq2 (via dx2), tq
        ch.basic_publish("dx", "a.b", b"t1", TRANSIENT)                    # transient: dq, dq2, tq
        ch.basic_publish("hx", "", b"h1", pika.BasicProperties(delivery_mode=2, headers={"k": "v"}))
        ch.basic_publish("", "tq", b"p-tq", PERSISTENT)                    # non-durable queue
        ch.basic_publish("", "xq", b"p-xq", PERSISTENT)                    # exclusive queue
        ch.basic_publish("", "du", b"u1", PERSISTENT)
        method, _p, body = ch.basic_get("du", auto_ack=False)  # delivered, never acked
        assert body == b"u1" and not method.redelivered
        _barrier(ch)

        # only the persistent messages on durable queues were written
        assert backend.message_rows("dq") == 1
        assert backend.message_rows("dq2") == 1
        assert backend.message_rows("dq3") == 1
        assert backend.message_rows("du") == 1
        assert backend.message_rows("tq") == 0
        assert backend.message_rows("xq") == 0
        assert backend.message_rows("pq") == 0
        assert backend.message_rows() == 5  # the four above + the barrier
        with backend.engine.connect() as db:
            stored_queues = {r[0] for r in db.execute(select(queues.c.name))}
            stored_exchanges = {r[0] for r in db.execute(select(exchanges.c.name))}
        assert stored_queues == DURABLE_QUEUES
        assert stored_exchanges == {"dx", "dx2", "hx"}

        # declare-ok means stored: a burst of declarations right before the stop/kill survives
        for i in range(LATE):
            ch.queue_declare(f"late-{i}", durable=True)
            ch.queue_bind(f"late-{i}", "dx", f"late.{i}")

        if stop == "sigterm":
            assert b.terminate(pump=pumper(conn)) == 0
            assert "shutting down" in b.log()
        else:
            b.kill()
    finally:
        close_quietly(conn)

    b2 = broker_factory()
    counts = re.search(r"recovered \d+ vhosts, (\d+) exchanges, (\d+) queues, (\d+) bindings",
                       b2.log())
    assert counts and counts.groups() == ("3", str(6 + LATE), str(4 + LATE)), counts and counts.group(0)
    conn = connect(b2)
    try:
        for name in ("dx", "dx2", "hx"):
            assert exists(conn, "exchange", name), name
        for name in sorted(DURABLE_QUEUES):
            assert exists(conn, "queue", name), name
        assert not exists(conn, "exchange", "tx")
        assert not exists(conn, "queue", "tq")
        assert not exists(conn, "queue", "xq")
        for i in range(LATE):
            assert exists(conn, "queue", f"late-{i}"), f"late-{i} lost although declare-ok was sent"
        assert not exists(conn, "exchange", "gone")
        assert not exists(conn, "queue", "gq")
        assert message_count(conn, "pq") == 0

        assert message_count(conn, "dq") == 1  # the transient t1 is gone
        assert message_count(conn, "dq2") == 1
        assert message_count(conn, "dq3") == 1
        assert message_count(conn, "du") == 1

        ch = conn.channel()
        method, got, body = ch.basic_get("dq", auto_ack=True)
        assert body == b"p1" and not method.redelivered
        assert (got.delivery_mode, got.content_type, got.message_id, got.priority) == \
            (2, "text/plain", "m-1", 3)
        assert got.headers == {"h": "x", "n": 7}
        method, _p, body = ch.basic_get("du", auto_ack=True)
        assert body == b"u1" and method.redelivered  # delivered before the stop
        assert ch.basic_get("dq2", auto_ack=True)[2] == b"p1"
        assert ch.basic_get("dq3", auto_ack=True)[2] == b"h1"

        # the recovered bindings route (topic, exchange->exchange, headers with arguments)
        ch.confirm_delivery()
        ch.basic_publish("dx", "a.z", b"after", PERSISTENT)
        ch.basic_publish("dx", "b.z", b"unrouted", PERSISTENT)
        ch.basic_publish("dx", "z.z", b"unbound", PERSISTENT)  # unbound before the stop
        ch.basic_publish("hx", "", b"h-match", pika.BasicProperties(headers={"k": "v", "o": 1}))
        ch.basic_publish("hx", "", b"h-miss", pika.BasicProperties(headers={"k": "w"}))
        assert ch.basic_get("dq", auto_ack=True)[2] == b"after"
        assert ch.basic_get("dq2", auto_ack=True)[2] == b"after"
        assert ch.basic_get("dq3", auto_ack=True)[2] == b"h-match"
        for q in ("dq", "dq2", "dq3"):
            assert message_count(conn, q) == 0, q

        # recovered properties and arguments are still checked on redeclaration
        ch.queue_declare("dq", durable=True, arguments=QUEUE_ARGS)
        ch.exchange_declare("dx", "topic", durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("dq", durable=True, arguments={"x-max-length": 5})
        assert err.value.reply_code == 406
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare("dx", "direct", durable=True)
        assert err.value.reply_code == 406
    finally:
        close_quietly(conn)


def _admin(method: str, url: str, body: dict | None = None) -> int:
    req = urllib.request.Request(url, method=method, data=json.dumps(body or {}).encode(),
                                 headers={"content-type": "application/json", "authorization":
                                          "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def test_second_vhost_survives_sigkill(broker_factory, backend):
    if not serve_has_option("--admin-port"):
        pytest.skip("no admin API: a vhost cannot be created from outside the broker")
    port = free_port()
    b = broker_factory("--admin-port", str(port))
    api = f"http://127.0.0.1:{port}/api"
    assert _admin("PUT", f"{api}/vhosts/v2") in (201, 204)
    assert _admin("PUT", f"{api}/permissions/v2/guest",
                  {"configure": ".*", "write": ".*", "read": ".*"}) in (201, 204)
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{b.port}/v2"))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("v2x", "fanout", durable=True)
        ch.queue_declare("v2q", durable=True)
        ch.queue_bind("v2q", "v2x")
        ch.basic_publish("v2x", "", b"in-v2", PERSISTENT)
    finally:
        close_quietly(conn)
    assert backend.message_rows("v2q", vhost="v2") == 1
    b.kill()

    b2 = broker_factory("--admin-port", str(free_port()))
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{b2.port}/v2"))
    try:
        assert exists(conn, "exchange", "v2x") and exists(conn, "queue", "v2q")
        ch = conn.channel()
        assert ch.basic_get("v2q", auto_ack=True)[2] == b"in-v2"
        ch.basic_publish("v2x", "", b"routed", PERSISTENT)
        assert ch.basic_get("v2q", auto_ack=True)[2] == b"routed"
    finally:
        close_quietly(conn)
