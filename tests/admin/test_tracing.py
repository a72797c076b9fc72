"""The firehose (amq.rabbitmq.trace): switched per vhost through PUT /api/vhosts/{name} {"tracing"}
and `exchange-broker admin trace on|off`, publish.<exchange> / deliver.<queue> copies with
RabbitMQ's headers, seen by a pika consumer."""
from __future__ import annotations

import pika
import pytest

from eb_support import uniq, wait_until
from exchange_broker.cli import main as broker_main


def _trace_queue(ch) -> str:
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.rabbitmq.trace", "#")
    return q


def _drain(ch, q):
    out = []
    while True:
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append((m.routing_key, props.headers, body))


def test_trace_exchange_exists_and_is_internal(pika_conn):
    ch = pika_conn.channel()
    ch.exchange_declare("amq.rabbitmq.trace", "topic", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.basic_publish("amq.rabbitmq.trace", "x", b"m")
        ch.queue_declare("", exclusive=True)   # the 403 arrives before this
    assert err.value.reply_code == 403


def test_firehose_publish_and_deliver(api, admin_broker, pika_conn):
    ch = pika_conn.channel()
    tq = _trace_queue(ch)
    work = uniq("work")
    ch.queue_declare(work)
    ch.basic_publish("", work, b"before")                        # tracing off: not traced
    assert api.ok("GET", "/api/vhosts/%2F")["tracing"] is False
    api.ok("PUT", "/api/vhosts/%2F", {"tracing": True})
    assert api.ok("GET", "/api/vhosts/%2F")["tracing"] is True
    ch.basic_publish("amq.direct", "nowhere", b"lost")
    ch.basic_publish("", work, b"hello", pika.BasicProperties(message_id="m1", headers={"h": 1},
                                                              content_type="text/plain"))
    m, _, body = ch.basic_get(work, auto_ack=False)              # "before", then "hello"
    ch.basic_ack(m.delivery_tag)
    assert wait_until(lambda: ch.queue_declare(tq, passive=True).method.message_count >= 3)
    traced = _drain(ch, tq)
    assert [k for k, _, _ in traced] == ["publish.amq.direct", "publish.", f"deliver.{work}"]
    by_key = {k: (h, b) for k, h, b in traced}
    h, b = by_key["publish."]
    assert b == b"hello"
    assert h["exchange_name"] == "" and h["routing_keys"] == [work] and h["routed_queues"] == [work]
    assert h["properties"]["message_id"] == "m1" and h["properties"]["headers"] == {"h": 1}
    assert h["properties"]["content_type"] == "text/plain"
    assert h["vhost"] == "/" and h["user"] == "guest" and h["channel"] == 1 and h["connection"]
    assert h["node"]
    h, b = by_key["publish.amq.direct"]
    assert h["routed_queues"] == [] and b == b"lost"
    h, b = by_key[f"deliver.{work}"]
    assert b == b"before" and h["redelivered"] == 0 and h["exchange_name"] == "" and h["channel"] == 1
    # the trace queue's own deliveries are not traced again
    assert _drain(ch, tq) == []
    api.ok("PUT", "/api/vhosts/%2F", {"tracing": False})
    ch.basic_publish("", work, b"after")
    ch.queue_declare(work, passive=True)
    assert _drain(ch, tq) == []


def test_admin_cli_trace_on_off(api, admin_broker, capsys):
    api.ok("PUT", "/api/vhosts/traced", {})
    code = broker_main(["admin", "--url", admin_broker.admin_url, "trace", "on", "--vhost", "traced"])
    assert code == 0 and "tracing on in vhost traced" in capsys.readouterr().out
    assert api.ok("GET", "/api/vhosts/traced")["tracing"] is True
    assert api.ok("GET", "/api/vhosts/%2F")["tracing"] is False
    assert broker_main(["admin", "--url", admin_broker.admin_url, "trace", "off", "-V", "traced"]) == 0
    assert api.ok("GET", "/api/vhosts/traced")["tracing"] is False
    status, body = api.put("/api/vhosts/traced", {"tracing": "yes"})
    assert status == 400
