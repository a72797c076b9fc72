"""The event exchange (serve --event-exchange, RabbitMQ's rabbitmq_event_exchange plugin): a pika
consumer bound to amq.rabbitmq.event sees queue, exchange, binding, connection, channel and
consumer events with RabbitMQ's routing keys and header fields."""
from __future__ import annotations

import asyncio

import pika
import pytest
from ext_helpers import get_all

from eb_support import close_quietly, uniq, wait_until
from exchange_broker.app import build_broker
from exchange_broker.config import Config
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def event_broker():
    loop = asyncio.new_event_loop()
    broker = build_broker(LoopClock(loop), config=Config(event_exchange=True))
    with ThreadedBroker(broker, loop=loop) as tb:
        yield tb


def _events(ch, q):
    return [(m.routing_key, props, body) for m, props, body in get_all(ch, q)]


def test_events_as_the_plugin_publishes_them(event_broker):
    watcher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", event_broker.port))
    actor = None
    try:
        wch = watcher.channel()
        eq = wch.queue_declare("", exclusive=True).method.queue
        wch.queue_bind(eq, "amq.rabbitmq.event", "#")
        _events(wch, eq)
        actor = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", event_broker.port, client_properties={"connection_name": "actor"}))
        ch = actor.channel()
        q, x = uniq("evq"), uniq("evx")
        ch.queue_declare(q, durable=True, arguments={"x-max-length": 5})
        ch.exchange_declare(x, "fanout")
        ch.queue_bind(q, x, "rk")
        tag = ch.basic_consume(q, lambda *a: None)
        ch.basic_cancel(tag)
        ch.queue_unbind(q, x, "rk")
        ch.exchange_delete(x)
        ch.queue_delete(q)
        ch.close()
        actor.close()
        actor = None
        wanted = ["connection.created", "channel.created", "queue.created", "exchange.created",
                  "binding.created", "consumer.created", "consumer.deleted", "binding.deleted",
                  "exchange.deleted", "queue.deleted", "channel.closed", "connection.closed"]
        got = []
        assert wait_until(lambda: got.extend(_events(wch, eq)) or
                          [k for k, _, _ in got if k in wanted] == wanted, 10), [k for k, _, _ in got]
        by_key = {}
        for key, props, body in got:
            by_key.setdefault(key, (props, body))
        props, body = by_key["queue.created"]
        h = props.headers
        assert body == b"" and props.delivery_mode == 2 and props.timestamp
        assert h["name"] == q and h["vhost"] == "/" and h["durable"] is True and h["auto_delete"] is False
        assert h["type"] == "rabbit_classic_queue" and h["arguments"] == {"x-max-length": 5}
        assert h["user_who_performed_action"] == "guest" and h["timestamp_in_ms"] > 0
        h = by_key["binding.created"][0].headers
        assert (h["source_name"], h["source_kind"], h["destination_name"], h["destination_kind"],
                h["routing_key"], h["vhost"]) == (x, "exchange", q, "queue", "rk", "/")
        h = by_key["exchange.created"][0].headers
        assert h["name"] == x and h["type"] == "fanout" and h["internal"] is False
        h = by_key["consumer.created"][0].headers
        assert h["consumer_tag"] == tag and h["queue"] == q and h["ack_required"] is True
        h = by_key["connection.created"][0].headers
        assert h["user"] == "guest" and h["vhost"] == "/" and h["protocol"] == "AMQP 0-9-1"
        assert h["client_properties"]["connection_name"] == "actor"
        h = by_key["connection.closed"][0].headers
        assert h["user_provided_name"] == "actor"
        assert by_key["queue.deleted"][0].headers["name"] == q
    finally:
        close_quietly(*(c for c in (watcher, actor) if c is not None))


def test_internal_and_off_by_default(event_broker, broker, connect):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", event_broker.port))
    try:
        ch = conn.channel()
        ch.exchange_declare("amq.rabbitmq.event", "topic", passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("amq.rabbitmq.event", "queue.created", b"forged")
            ch.queue_declare("", exclusive=True)
        assert err.value.reply_code == 403
    finally:
        close_quietly(conn)
    # a broker without --event-exchange has no such exchange
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        connect().channel().exchange_declare("amq.rabbitmq.event", "topic", passive=True)
    assert err.value.reply_code == 404


def test_durable_binding_to_the_event_exchange_survives_a_restart(spawn_broker):
    b = spawn_broker("--event-exchange")
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("audit", durable=True)
    ch.queue_bind("audit", "amq.rabbitmq.event", "queue.*")
    conn.close()
    assert b.terminate() == 0
    b = spawn_broker("--event-exchange")
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_purge("audit")
        ch.queue_declare("after-restart")
        assert wait_until(lambda: ch.queue_declare("audit", durable=True, passive=True).method.message_count == 1)
        m, props, _ = ch.basic_get("audit", auto_ack=True)
        assert m.routing_key == "queue.created" and props.headers["name"] == "after-restart"
    finally:
        conn.close()


def _admin(tb, method: str, path: str, body=None) -> int:
    import base64
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(tb.admin_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_operator_changes_alarms_and_logins_are_events():
    loop = asyncio.new_event_loop()
    broker = build_broker(LoopClock(loop), config=Config(event_exchange=True))
    with ThreadedBroker(broker, loop=loop, admin=True) as tb:
        watcher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port))
        try:
            wch = watcher.channel()
            eq = wch.queue_declare("", exclusive=True).method.queue
            for key in ("permission.*", "topic.permission.*", "policy.*", "user.tags.set", "alarm.*",
                        "user.authentication.*"):
                wch.queue_bind(eq, "amq.rabbitmq.event", key)
            assert _admin(tb, "PUT", "/api/users/evu", {"password": "pw", "tags": ""}) in (201, 204)
            assert _admin(tb, "PUT", "/api/permissions/%2F/evu", {"configure": ".*", "write": "w.*", "read": ""}) in (201, 204)
            assert _admin(tb, "PUT", "/api/topic-permissions/%2F/evu",
                          {"exchange": "amq.topic", "write": "a.*", "read": ".*"}) in (201, 204)
            assert _admin(tb, "PUT", "/api/users/evu", {"password": "pw", "tags": "monitoring"}) in (201, 204)
            assert _admin(tb, "PUT", "/api/policies/%2F/evp",
                          {"pattern": "^ev", "definition": {"max-length": 3}, "priority": 2, "apply-to": "queues"}) in (201, 204)
            assert _admin(tb, "DELETE", "/api/policies/%2F/evp") == 204
            assert _admin(tb, "DELETE", "/api/topic-permissions/%2F/evu") == 204
            assert _admin(tb, "DELETE", "/api/permissions/%2F/evu") == 204
            tb.call(lambda: broker.set_alarm("memory", True, "test"))
            tb.call(lambda: broker.set_alarm("memory", False))
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", tb.port, credentials=pika.PlainCredentials("evu", "wrong")))
            with pytest.raises(pika.exceptions.ProbableAccessDeniedError):  # logged in; no permission left on /
                pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", tb.port, credentials=pika.PlainCredentials("evu", "pw")))
            wanted = ["permission.created", "topic.permission.created", "user.tags.set", "policy.set",
                      "policy.cleared", "topic.permission.deleted", "permission.deleted", "alarm.set",
                      "alarm.cleared", "user.authentication.failure"]
            got: list = []
            # every admin API call logs in too (user.authentication.success for guest), as in RabbitMQ
            assert wait_until(lambda: got.extend(_events(wch, eq)) or
                              [k for k, _, _ in got if k in wanted] == wanted and
                              any(k.endswith("success") and p.headers["name"] == "evu" for k, p, _ in got), 10), \
                [k for k, _, _ in got if "authentication" not in k]
            by_key = {key: props.headers for key, props, _ in got
                      if "authentication" not in key or props.headers["name"] == "evu"}
            assert by_key["permission.created"]["user"] == "evu" and by_key["permission.created"]["write"] == "w.*"
            assert by_key["permission.created"]["vhost"] == "/"
            assert by_key["topic.permission.created"]["exchange"] == "amq.topic"
            assert by_key["user.tags.set"]["tags"] == ["monitoring"]
            policy = by_key["policy.set"]
            assert (policy["name"], policy["vhost"], policy["pattern"], policy["apply-to"], policy["priority"]) == \
                ("evp", "/", "^ev", "queues", 2) and policy["definition"] == {"max-length": 3}
            assert by_key["alarm.set"]["source"] == "memory"
            failure = by_key["user.authentication.failure"]
            assert failure["name"] == "evu" and failure["auth_mechanism"] == "PLAIN" and failure["error"]
            assert by_key["user.authentication.success"]["name"] == "evu"
        finally:
            close_quietly(watcher)
