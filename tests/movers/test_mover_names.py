"""Queue and exchange names RabbitMQ allows that pamqp's pattern refuses (``>``, ``!``, ``(``,
non-ASCII): shovels and federation links move between them (pika declares them)."""

from __future__ import annotations

import time

import pika

from eb_support import close_quietly, pika_connect, wait_until
from mover_support import depth

SRC, DEST = "orders > eu (é)", "in!box"
EXCHANGE = "events>all"


def publish_to(port: int, exchange: str, key: str, n: int) -> None:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish(exchange, key, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        close_quietly(conn)


def test_shovel_between_queues_and_exchanges_with_such_names(here, there):
    conn = pika_connect(here.port)
    try:
        ch = conn.channel()
        ch.queue_declare(SRC, durable=True)
        ch.exchange_declare(EXCHANGE, "fanout", durable=True)
    finally:
        close_quietly(conn)
    publish_to(here.port, "", SRC, 50)
    remote = f"amqp://guest:guest@127.0.0.1:{there.port}"
    value = {"src-uri": "amqp://", "src-queue": SRC, "dest-uri": remote, "dest-queue": DEST}
    assert here.api.put("/api/parameters/shovel/%2F/odd", {"value": value})[0] == 201
    assert wait_until(lambda: depth(there.port, DEST) == 50, 20), here.api.get("/api/shovels")[1]
    assert depth(here.port, SRC) == 0
    # from an exchange with such a name (the shovel's own queue bound to it) back to that queue
    value = {"src-uri": "amqp://", "src-exchange": EXCHANGE, "dest-uri": remote, "dest-queue": DEST}
    assert here.api.put("/api/parameters/shovel/%2F/odd-x", {"value": value})[0] == 201
    assert wait_until(lambda: here.api.get("/api/shovels/vhost/%2F/odd-x")[1].get("state") == "running", 15)
    publish_to(here.port, EXCHANGE, "", 7)
    assert wait_until(lambda: depth(there.port, DEST) == 57, 20)


def test_federation_of_exchange_and_queue_with_such_names(upstream, here):
    for tb in (upstream, here):
        conn = pika_connect(tb.port)
        try:
            ch = conn.channel()
            ch.exchange_declare(EXCHANGE, "direct", durable=True)
            ch.queue_declare(SRC, durable=True)
        finally:
            close_quietly(conn)
    conn = pika_connect(here.port)
    try:
        ch = conn.channel()
        ch.queue_declare("got é", durable=True)
        ch.queue_bind("got é", EXCHANGE, "k>1")
    finally:
        close_quietly(conn)
    here.api.ok("PUT", "/api/parameters/federation-upstream/%2F/up",
                {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{upstream.port}"}})
    here.api.ok("PUT", "/api/policies/%2F/fed", {"pattern": "^(events>all|orders > eu)", "apply-to": "all",
                                                 "definition": {"federation-upstream": "up"}})
    assert wait_until(lambda: sorted(x["status"] for x in here.api.ok("GET", "/api/federation-links"))
                      == ["running", "running"], 20), here.api.ok("GET", "/api/federation-links")
    time.sleep(1)  # the upstream queue is bound (SYNC_INTERVAL)
    publish_to(upstream.port, EXCHANGE, "k>1", 10)
    assert wait_until(lambda: depth(here.port, "got é") == 10, 20)
    publish_to(upstream.port, "", SRC, 5)
    local = pika_connect(here.port)
    try:
        got = []
        lch = local.channel()
        lch.basic_consume(SRC, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
        assert wait_until(lambda: (local.process_data_events(0.1), len(got) == 5)[1], 20)
    finally:
        close_quietly(local)
