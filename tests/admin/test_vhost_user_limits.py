"""/api/vhost-limits and /api/user-limits: the API (answers and texts as RabbitMQ 3.10 gives them,
compared by hand), the limits enforced on real pika connections with RabbitMQ's refusal texts,
and the definitions document (a RabbitMQ export with limits loads and is enforced)."""

from __future__ import annotations

import json
import pathlib

import pika
import pytest
from admin_helpers import Api

from exchange_broker.testing import ThreadedBroker

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "rabbitmq-3.10-export-limits.json"


def connect(tb, vhost: str = "/", user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", tb.port, vhost, pika.PlainCredentials(user, password), heartbeat=0,
        connection_attempts=1))


def refused_text(fn) -> str:
    """The broker's reply text when ``fn`` fails with a pika error (connection or channel)."""
    with pytest.raises(pika.exceptions.AMQPError) as info:
        fn()
    return str(info.value)


def close(*conns) -> None:
    for c in conns:
        if c is not None and c.is_open:
            c.close()


# ---- the API -------------------------------------------------------------------------------------
def test_vhost_limits_api(api):
    api.ok("PUT", "/api/vhosts/lim")
    assert api.get("/api/vhost-limits/lim") == (200, [])
    assert api.put("/api/vhost-limits/lim/max-connections", {"value": 1}) == (204, None)
    assert api.put("/api/vhost-limits/lim/max-queues", {"value": 2}) == (204, None)
    expected = [{"vhost": "lim", "value": {"max-connections": 1, "max-queues": 2}}]
    assert api.get("/api/vhost-limits/lim") == (200, expected)
    assert api.get("/api/vhost-limits") == (200, expected)
    assert api.get("/api/vhost-limits/lim/max-queues")[0] == 405
    assert api.get("/api/vhost-limits/nowhere")[0] == 404
    assert api.put("/api/vhost-limits/nowhere/max-queues", {"value": 1}) == (
        404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api.put("/api/vhost-limits/lim/max-foo", {"value": 1}) == (
        400, {"error": "bad_request", "reason": 'Validation failed\n\nUnrecognised terms [{<<"max-foo">>,1}] in limits\n'})
    assert api.put("/api/vhost-limits/lim/max-queues", {"value": "7"}) == (
        400, {"error": "bad_request", "reason": 'Validation failed\n\nmax-queues should be a number, actually was <<"7">>\n'})
    for bad, shown in ((1.5, "1.5"), (True, "true"), (None, "null")):
        status, body = api.put("/api/vhost-limits/lim/max-queues", {"value": bad})
        assert status == 400 and body["reason"].endswith(f"actually was {shown}\n")
    assert api.put("/api/vhost-limits/lim/max-queues", {}) == (
        400, {"error": "bad_request", "reason": "[{key_missing,value}]"})
    assert api.delete("/api/vhost-limits/lim/max-queues") == (204, None)
    assert api.delete("/api/vhost-limits/lim/max-queues") == (204, None)  # RabbitMQ: also when unset
    assert api.get("/api/vhost-limits/lim") == (200, [{"vhost": "lim", "value": {"max-connections": 1}}])
    assert api.delete("/api/vhost-limits/nowhere/max-queues")[0] == 404
    api.ok("DELETE", "/api/vhosts/lim")  # the vhost's limits go with it
    assert api.get("/api/vhost-limits") == (200, [])
    api.ok("PUT", "/api/vhosts/lim")
    assert api.get("/api/vhost-limits/lim") == (200, [])


def test_user_limits_api(api):
    api.ok("PUT", "/api/users/limited", {"password": "pw", "tags": ""})
    assert api.get("/api/user-limits/limited") == (200, [])
    assert api.put("/api/user-limits/limited/max-connections", {"value": 1}) == (204, None)
    assert api.put("/api/user-limits/limited/max-channels", {"value": -1}) == (204, None)
    expected = [{"user": "limited", "value": {"max-connections": 1, "max-channels": -1}}]
    assert api.get("/api/user-limits/limited") == (200, expected)
    assert api.get("/api/user-limits") == (200, expected)
    assert api.ok("GET", "/api/users/limited")["limits"] == {"max-connections": 1, "max-channels": -1}
    listed = {u["name"]: u["limits"] for u in api.ok("GET", "/api/users")}
    assert listed == {"guest": {}, "limited": {"max-connections": 1, "max-channels": -1}}
    assert api.get("/api/user-limits/nobody")[0] == 404
    assert api.put("/api/user-limits/nobody/max-channels", {"value": 1}) == (
        400, {"error": "bad_request", "reason": ["no_such_user", "nobody"]})
    assert api.put("/api/user-limits/limited/max-foo", {"value": 1}) == (
        400, {"error": "bad_request", "reason": 'Unrecognised terms [{<<"max-foo">>,1}] in user-limits'})
    assert api.put("/api/user-limits/limited/max-channels", {"value": 1.5}) == (
        400, {"error": "bad_request", "reason": "max-channels should be a number, actually was 1.5"})
    monitor = api.as_user("limited", "pw")
    assert monitor.get("/api/user-limits")[0] == 401
    assert api.delete("/api/user-limits/limited/max-channels") == (204, None)
    assert api.get("/api/user-limits/limited") == (200, [{"user": "limited", "value": {"max-connections": 1}}])
    api.ok("DELETE", "/api/users/limited")  # the user's limits go with it
    assert api.get("/api/user-limits") == (200, [])


# ---- enforcement ---------------------------------------------------------------------------------
def test_vhost_max_connections(api, admin_broker):
    api.ok("PUT", "/api/vhosts/lim")
    api.ok("PUT", "/api/permissions/lim/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    api.ok("PUT", "/api/vhost-limits/lim/max-connections", {"value": 1})
    first = connect(admin_broker, "lim")
    try:
        text = refused_text(lambda: connect(admin_broker, "lim"))
        assert "530" in text and ("NOT_ALLOWED - access to vhost 'lim' refused for user 'guest': "
                                  "connection limit (1) is reached") in text
        close(connect(admin_broker, "/"))  # other vhosts are not limited
    finally:
        close(first)
    close(connect(admin_broker, "lim"))  # the slot is free again
    api.ok("PUT", "/api/vhost-limits/lim/max-connections", {"value": 0})  # 0: no connection at all
    assert "connection limit (0) is reached" in refused_text(lambda: connect(admin_broker, "lim"))
    api.ok("PUT", "/api/vhost-limits/lim/max-connections", {"value": -1})  # negative: no limit
    a, b = connect(admin_broker, "lim"), connect(admin_broker, "lim")
    close(a, b)


def test_vhost_max_queues(api, admin_broker):
    api.ok("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 2})
    conn = connect(admin_broker)
    try:
        ch = conn.channel()
        ch.queue_declare("lq1")
        ch.queue_declare("lq2", exclusive=True)  # exclusive queues count too
        ch.queue_declare("lq1")  # a redeclaration is not a new queue
        text = refused_text(lambda: ch.queue_declare("lq3"))
        assert "406" in text and ("PRECONDITION_FAILED - cannot declare queue 'lq3': queue limit in vhost "
                                  "'/' (2) is reached") in text
        ch = conn.channel()
        text = refused_text(lambda: ch.queue_declare("", exclusive=True))
        assert "cannot declare queue 'amq.gen-" in text and "queue limit in vhost '/' (2) is reached" in text
        status, body = api.put("/api/queues/%2F/lq3")
        assert status == 400 and "queue limit in vhost '/' (2) is reached" in body["reason"]
        ch = conn.channel()
        ch.queue_delete("lq1")
        ch.queue_declare("lq3")  # room again
    finally:
        close(conn)


def test_user_max_connections_and_max_channels(api, admin_broker):
    api.ok("PUT", "/api/users/limited", {"password": "pw", "tags": ""})
    api.ok("PUT", "/api/permissions/%2F/limited", {"configure": ".*", "write": ".*", "read": ".*"})
    api.ok("PUT", "/api/user-limits/limited/max-connections", {"value": 1})
    api.ok("PUT", "/api/user-limits/limited/max-channels", {"value": 2})
    first = connect(admin_broker, user="limited", password="pw")
    try:
        text = refused_text(lambda: connect(admin_broker, user="limited", password="pw"))
        assert ("NOT_ALLOWED - connection refused for user 'limited': user connection limit (1) is "
                "reached") in text
        # the user limit comes before the permission check, as in RabbitMQ
        api.ok("PUT", "/api/vhosts/elsewhere")
        assert "user connection limit (1)" in refused_text(
            lambda: connect(admin_broker, "elsewhere", user="limited", password="pw"))
        first.channel()
        first.channel()
        text = refused_text(first.channel)
        assert "530" in text and ("NOT_ALLOWED - number of channels opened for user 'limited' has reached "
                                  "the maximum allowed user limit of (2)") in text
        assert not first.is_open  # a connection error, as in RabbitMQ
    finally:
        close(first)
    api.ok("PUT", "/api/user-limits/limited/max-connections", {"value": 2})
    a = connect(admin_broker, user="limited", password="pw")
    b = connect(admin_broker, user="limited", password="pw")
    try:
        a.channel()
        b.channel()  # two channels on two connections: the user's limit is over all of them
        assert "maximum allowed user limit of (2)" in refused_text(a.channel)
    finally:
        close(a, b)
    close(connect(admin_broker))  # other users are not limited


# ---- definitions ---------------------------------------------------------------------------------
def test_limits_in_definitions_export_and_import(api, admin_broker):
    api.ok("PUT", "/api/vhosts/lim")
    api.ok("PUT", "/api/vhost-limits/lim/max-queues", {"value": 5})
    api.ok("PUT", "/api/users/limited", {"password": "pw", "tags": ""})
    api.ok("PUT", "/api/user-limits/limited/max-channels", {"value": 3})
    defs = api.ok("GET", "/api/definitions")
    assert {"value": {"max-queues": 5}, "vhost": "lim", "component": "vhost-limits",
            "name": "limits"} in defs["parameters"]
    users = {u["name"]: u for u in defs["users"]}
    assert users["limited"]["limits"] == {"max-channels": 3} and users["guest"]["limits"] == {}
    one = api.ok("GET", "/api/definitions/lim")
    (param,) = one["parameters"]  # (RabbitMQ 3.10 also keeps "vhost" in a per-vhost export's parameters)
    assert {k: v for k, v in param.items() if k != "vhost"} == {"value": {"max-queues": 5},
                                                                 "component": "vhost-limits", "name": "limits"}
    with ThreadedBroker(admin=True) as other:
        fresh = Api(other.admin_url)
        fresh.ok("POST", "/api/definitions", defs)
        assert fresh.get("/api/vhost-limits") == (200, [{"vhost": "lim", "value": {"max-queues": 5}}])
        assert fresh.get("/api/user-limits") == (200, [{"user": "limited", "value": {"max-channels": 3}}])
        fresh.ok("PUT", "/api/vhosts/copy")
        fresh.ok("POST", "/api/definitions/copy", one)  # a per-vhost import sets its vhost's limits
        assert fresh.get("/api/vhost-limits/copy") == (200, [{"vhost": "copy", "value": {"max-queues": 5}}])
    bad = {"parameters": [{"component": "vhost-limits", "name": "limits", "vhost": "lim",
                           "value": {"max-bananas": 1}}]}
    status, body = api.post("/api/definitions", bad)
    assert status == 400 and "Unrecognised terms" in body["reason"]
    status, body = api.post("/api/definitions", {"parameters": [{"component": "vhost-limits", "name": "limits",
                                                                 "vhost": "nowhere", "value": {"max-queues": 1}}]})
    assert status == 400 and body["reason"] == ["no_such_vhost", "nowhere"]


def test_rabbitmq_export_with_limits_loads_and_is_enforced(api, admin_broker):
    doc = json.loads(FIXTURE.read_text())
    api.ok("POST", "/api/definitions", doc)
    assert api.get("/api/vhost-limits/h12v") == (
        200, [{"vhost": "h12v", "value": {"max-queues": 20, "max-connections": 10}}])
    assert api.get("/api/user-limits/h12u") == (
        200, [{"user": "h12u", "value": {"max-channels": 50, "max-connections": 5}}])
    api.ok("PUT", "/api/user-limits/h12u/max-connections", {"value": 1})
    first = connect(admin_broker, "h12v", "h12u", "pw")  # the password of the RabbitMQ export
    try:
        assert "user connection limit (1)" in refused_text(lambda: connect(admin_broker, "h12v", "h12u", "pw"))
    finally:
        close(first)
