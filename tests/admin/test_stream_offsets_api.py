"""Admin REST endpoints for stream queues' named-consumer offsets, against a real broker."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pika
import pytest

from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def admin_broker():
    with ThreadedBroker(admin=True) as tb:
        yield tb


def call(tb, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(tb.admin_url + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    pw = urllib.request.HTTPPasswordMgrWithDefaultRealm()
    pw.add_password(None, tb.admin_url, "guest", "guest")
    opener = urllib.request.build_opener(urllib.request.HTTPBasicAuthHandler(pw))
    try:
        with opener.open(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_offsets_stored_over_amqp_are_visible_and_settable_over_rest(admin_broker):
    tb = admin_broker
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port))
    try:
        ch = conn.channel()
        ch.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", "log", str(i).encode())
        ch.basic_qos(prefetch_count=10)
        seen = []
        # consume everything there is, so nothing is buffered when pika cancels (pika nacks
        # buffered deliveries on cancel, which stream queues refuse)
        for method, _props, body in ch.consume("log", arguments={"x-stream-offset": "first",
                                                                 "x-stream-consumer-name": "r1"},
                                               inactivity_timeout=5):
            seen.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(seen) == 4:
                break
        ch.cancel()
        assert seen == [b"0", b"1", b"2", b"3"]
        for i in range(4, 10):
            ch.basic_publish("", "log", str(i).encode())
        status, info = call(tb, "GET", "/api/stream-offsets/%2F/log")
        assert status == 200
        status, got = None, None
        for _ in range(50):  # the broker writes named offsets at most every 0.2 s
            status, got = call(tb, "GET", "/api/stream-offsets/%2F/log/r1")
            if status == 200:
                break
            conn.sleep(0.1)
        assert status == 200 and got["offset"] == 3

        assert call(tb, "PUT", "/api/stream-offsets/%2F/log/r1", {"offset": 7})[0] == 204
        ch.basic_qos(prefetch_count=1)  # one in flight: nothing buffered for pika to nack on cancel
        method, _props, body = next(ch.consume("log", arguments={"x-stream-consumer-name": "r1"},
                                               inactivity_timeout=5))
        assert body == b"8"  # resumes after the stored offset
        ch.cancel()
    finally:
        conn.close()


def test_stream_offset_errors(admin_broker):
    tb = admin_broker
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port))
    try:
        conn.channel().queue_declare("classic-q")
    finally:
        conn.close()
    assert call(tb, "GET", "/api/stream-offsets/%2F/nope")[0] == 404
    status, err = call(tb, "GET", "/api/stream-offsets/%2F/classic-q")
    assert status == 400 and "not a stream" in err["reason"]
    status, err = call(tb, "PUT", "/api/stream-offsets/%2F/classic-q/r", {"offset": -1})
    assert status == 400 and "non-negative" in err["reason"]
