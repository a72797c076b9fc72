"""Messages cross between the admin API and AMQP clients in both directions."""

from __future__ import annotations

import time

import pika


def _drain(conn, ch, queue: str, n: int, timeout: float = 5.0) -> list:
    got = []

    def on_message(c, method, props, body):
        got.append((method, props, body))
        c.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    deadline = time.time() + timeout
    while len(got) < n and time.time() < deadline:
        conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    return got


def test_rest_publish_is_consumed_over_amqp(api, pika_conn):
    ch = pika_conn.channel()
    ch.exchange_declare("orders", "topic")
    ch.queue_declare("eu-orders")
    ch.queue_bind("eu-orders", "orders", "eu.#")
    result = api.ok("POST", "/api/exchanges/%2F/orders/publish", {
        "routing_key": "eu.de.created", "payload": "{\"id\": 7}", "payload_encoding": "string",
        "properties": {"content_type": "application/json", "delivery_mode": 2, "priority": 3,
                       "correlation_id": "c-1", "reply_to": "replies", "message_id": "m-1",
                       "timestamp": 1700000000, "type": "order.created", "app_id": "rest",
                       "expiration": "60000", "headers": {"tenant": "acme", "n": 5, "ok": True,
                                                          "nested": {"a": [1, "b"]}}}})
    assert result == {"routed": True}
    [(method, props, body)] = _drain(pika_conn, ch, "eu-orders", 1)
    assert body == b'{"id": 7}'
    assert method.exchange == "orders" and method.routing_key == "eu.de.created"
    assert props.content_type == "application/json" and props.delivery_mode == 2 and props.priority == 3
    assert (props.correlation_id, props.reply_to, props.message_id) == ("c-1", "replies", "m-1")
    assert (props.timestamp, props.type, props.app_id, props.expiration) == \
        (1700000000, "order.created", "rest", "60000")
    assert props.headers["tenant"] in ("acme", b"acme") and props.headers["n"] == 5
    assert props.headers["ok"] is True


def test_rest_publish_binary_payload(api, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("bin")
    api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
           {"routing_key": "bin", "payload": "AAH/", "payload_encoding": "base64", "properties": {}})
    [(_m, _p, body)] = _drain(pika_conn, ch, "bin", 1)
    assert body == b"\x00\x01\xff"


def test_amqp_publish_is_read_over_rest(api, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("inbox", durable=True)
    ch.basic_publish("", "inbox", b"from amqp", pika.BasicProperties(
        content_type="text/plain", headers={"k": "v", "num": 42, "raw": b"\xff"}, delivery_mode=2,
        timestamp=1700000001, message_id="x1"))
    ch.basic_publish("", "inbox", b"\xc3\x28 not utf-8")
    pika_conn.process_data_events(0.1)
    info = api.ok("GET", "/api/queues/%2F/inbox")
    assert info["messages_ready"] == 2
    msgs = api.ok("POST", "/api/queues/%2F/inbox/get", {"count": 2, "ackmode": "ack_requeue_false",
                                                         "encoding": "auto"})
    assert msgs[0]["payload"] == "from amqp" and msgs[0]["payload_encoding"] == "string"
    props = msgs[0]["properties"]
    assert props["content_type"] == "text/plain" and props["delivery_mode"] == 2
    assert props["headers"]["k"] == "v" and props["headers"]["num"] == 42
    assert props["headers"]["raw"] == "\ufffd"  # bytes in a field table: UTF-8 with replacement
    assert props["timestamp"] == 1700000001 and props["message_id"] == "x1"
    assert msgs[1]["payload_encoding"] == "base64"
    assert api.ok("GET", "/api/queues/%2F/inbox")["messages"] == 0


def test_unacked_and_consumer_counts_follow_amqp(api, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("work")
    for i in range(5):
        ch.basic_publish("", "work", f"job{i}".encode())
    ch.basic_qos(prefetch_count=2)
    held = []
    ch.basic_consume("work", lambda c, m, p, b: held.append(m.delivery_tag))
    deadline = time.time() + 5
    while len(held) < 2 and time.time() < deadline:
        pika_conn.process_data_events(0.05)
    info = api.ok("GET", "/api/queues/%2F/work")
    assert (info["messages"], info["messages_ready"], info["messages_unacknowledged"]) == (5, 3, 2)
    assert info["message_bytes_unacknowledged"] == 8 and info["consumers"] == 1
    totals = api.ok("GET", "/api/overview")["queue_totals"]
    assert (totals["messages_ready"], totals["messages_unacknowledged"]) == (3, 2)
    assert api.ok("GET", "/api/channels")[0]["messages_unacknowledged"] == 2
    # a REST get takes from the ready part only
    got = api.ok("POST", "/api/queues/%2F/work/get", {"count": 10, "ackmode": "ack_requeue_true",
                                                      "encoding": "auto"})
    assert [m["payload"] for m in got] == ["job2", "job3", "job4"]
    ch.basic_ack(held[-1], multiple=True)
    deadline = time.time() + 5
    while len(held) < 4 and time.time() < deadline:
        pika_conn.process_data_events(0.05)
    info = api.ok("GET", "/api/queues/%2F/work")
    assert (info["messages_ready"], info["messages_unacknowledged"]) == (1, 2)


def test_rest_declared_objects_are_usable_over_amqp(api, pika_conn):
    api.put("/api/exchanges/%2F/fan", {"type": "fanout", "durable": True})
    api.put("/api/queues/%2F/fan-a", {"durable": True})
    api.put("/api/queues/%2F/fan-b", {"durable": True})
    api.post("/api/bindings/%2F/e/fan/q/fan-a", {})
    api.post("/api/bindings/%2F/e/fan/q/fan-b", {})
    ch = pika_conn.channel()
    ch.queue_declare("fan-a", durable=True, passive=True)
    ch.exchange_declare("fan", "fanout", durable=True)  # equivalent redeclare succeeds
    ch.basic_publish("fan", "", b"everyone")
    pika_conn.process_data_events(0.1)
    for name in ("fan-a", "fan-b"):
        assert api.ok("GET", f"/api/queues/%2F/{name}")["messages"] == 1
    assert api.delete("/api/queues/%2F/fan-a/contents")[0] == 204
    method, _p, body = ch.basic_get("fan-b", auto_ack=True)
    assert body == b"everyone"
    assert ch.basic_get("fan-a", auto_ack=True) == (None, None, None)
