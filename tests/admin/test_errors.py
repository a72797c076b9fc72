"""Errors: RabbitMQ's shapes and codes, and no request can crash the broker or corrupt its state."""

from __future__ import annotations

import json
import random

import pytest
from admin_helpers import q

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@pytest.mark.parametrize("path", ["/api/queues/%2F/missing", "/api/exchanges/%2F/missing",
                                  "/api/queues/no-such-vhost", "/api/exchanges/no-such-vhost/x",
                                  "/api/vhosts/no-such-vhost", "/api/connections/nobody",
                                  "/api/channels/nothing", "/api/bindings/%2F/e/amq.direct/q/missing",
                                  "/api/no/such/endpoint", "/api/definitions/no-such-vhost"])
def test_unknown_objects_are_404(shared_api, path):
    status, body = shared_api.get(path)
    assert status == 404
    assert body["error"] == "Object Not Found" and body["reason"]


def test_unknown_object_mutations_are_404(api):
    assert api.delete("/api/queues/%2F/missing") == (404, NOT_FOUND)
    assert api.delete("/api/exchanges/%2F/missing") == (404, NOT_FOUND)
    assert api.delete("/api/queues/%2F/missing/contents")[0] == 404
    assert api.post("/api/queues/%2F/missing/get", {"count": 1, "ackmode": "ack_requeue_true",
                                                     "encoding": "auto"})[0] == 404
    status, body = api.post("/api/exchanges/%2F/missing/publish", {"routing_key": "", "payload": "",
                                                                    "payload_encoding": "string",
                                                                    "properties": {}})
    assert status == 404 and body["error"] == "Object Not Found" and "missing" in body["reason"]
    assert api.put("/api/queues/no-such-vhost/q")[0] == 404


def test_bad_json_is_400(api):
    for raw in (b"{bad", b"[1, 2", b"\xff\xfe", b'{"durable": NaN}', b"nul"):
        status, body = api.call("PUT", "/api/queues/%2F/q", raw=raw)
        assert status == 400, raw
        assert body["error"] == "bad_request" and body["reason"]
    status, body = api.call("PUT", "/api/queues/%2F/q", raw=b"[1, 2]")
    assert status == 400 and body["error"] == "bad_request"
    status, body = api.call("POST", "/api/definitions", raw=b"")
    assert status == 400
    assert api.get("/api/queues/%2F/q")[0] == 404  # nothing was declared


@pytest.mark.parametrize("method,path,body,needle", [
    ("PUT", "/api/queues/%2F/q", {"durable": "yes"}, "not_boolean"),
    ("PUT", "/api/queues/%2F/q", {"arguments": "x"}, "arguments"),
    ("PUT", "/api/queues/%2F/q", {"arguments": {"x-big": 2 ** 70}}, "out of range"),
    ("PUT", "/api/exchanges/%2F/x", {"type": "bogus"}, "invalid exchange type"),
    ("PUT", "/api/exchanges/%2F/x", {"type": 5}, "type"),
    ("POST", "/api/queues/%2F/present/get", {"count": 1, "ackmode": "bogus", "encoding": "auto"}, "ackmode"),
    ("POST", "/api/queues/%2F/present/get", {"count": 1, "encoding": "auto"}, "ackmode"),
    ("POST", "/api/queues/%2F/present/get", {"count": -1, "ackmode": "ack_requeue_true"}, "count"),
    ("POST", "/api/queues/%2F/present/get", {"count": 1, "ackmode": "ack_requeue_true",
                                             "encoding": "utf-32"}, "encoding"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"payload": "x"}, "routing_key"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k"}, "payload"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "%%%",
                                                       "payload_encoding": "base64"}, "base64"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                                       "payload_encoding": "rot13"}, "payload_encoding"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                                       "properties": {"delivery_mode": 7}}, "delivery_mode"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                                       "properties": {"bogus": 1}}, "bogus"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                                       "properties": {"headers": {"n": 2 ** 80}}}, "range"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k" * 300, "payload": "x"}, "255"),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/present", {"routing_key": 5}, "routing_key"),
    ("POST", "/api/definitions", {"queues": "nope"}, "queues"),
    ("POST", "/api/definitions", {"queues": [{"name": "q", "vhost": "nowhere"}]}, "no_such_vhost"),
    ("POST", "/api/definitions", {"bindings": [{"source": "a", "vhost": "/", "destination": "b",
                                                "destination_type": "topic"}]}, "destination_type"),
])
def test_bad_arguments_are_400(shared_api, method, path, body, needle):
    shared_api.put("/api/queues/%2F/present")
    status, err = shared_api.call(method, path, body)
    assert status == 400, err
    assert needle in json.dumps(err["reason"]), err


def test_publish_to_internal_exchange_is_400(api):
    api.put("/api/exchanges/%2F/inner", {"type": "direct", "internal": True})
    status, err = api.post("/api/exchanges/%2F/inner/publish", {"routing_key": "", "payload": "x"})
    assert status == 400 and "internal" in err["reason"]


def test_reserved_names_are_refused_like_rabbitmq(api):
    status, err = api.put("/api/exchanges/%2F/amq.custom", {"type": "direct"})
    assert status == 401 and err["error"] == "not_authorised"
    status, err = api.delete("/api/exchanges/%2F/amq.direct")
    assert status == 401
    assert api.get("/api/exchanges/%2F/amq.direct")[0] == 200


def test_authentication(api, admin_broker):
    anonymous = api.as_user(None)
    status, body = anonymous.get("/api/overview")
    assert status == 401 and body == {"error": "not_authorized", "reason": "Login failed"}
    assert anonymous.last_headers["WWW-Authenticate"].startswith("Basic realm=")
    assert api.as_user("guest", "wrong").get("/api/overview")[0] == 401
    assert api.as_user("nobody", "x").get("/api/queues")[0] == 401
    for header in ("Basic !!!", "Bearer abc", "Basic", "Basic Z3Vlc3Q="):  # last: "guest" with no colon
        assert api.as_user(None).get("/api/overview", headers={"Authorization": header})[0] == 401
    # a user without a management tag cannot use the API
    api.put("/api/users/app", {"password": "pw", "tags": ""})
    status, body = api.as_user("app", "pw").get("/api/overview")
    assert status == 401 and body["reason"] == "Not management user"
    # a monitoring user reads everything, changes nothing outside its vhosts
    api.put("/api/users/watcher", {"password": "pw", "tags": "monitoring"})
    watcher = api.as_user("watcher", "pw")
    assert watcher.get("/api/queues")[0] == 200
    assert watcher.put("/api/queues/%2F/sneaky")[0] == 401
    assert watcher.get("/api/definitions")[0] == 401
    # a management user with permissions on a vhost works there
    api.put("/api/users/dev", {"password": "pw", "tags": ["management"]})
    api.put("/api/permissions/%2F/dev", {"configure": ".*", "write": ".*", "read": ".*"})
    assert api.as_user("dev", "pw").put("/api/queues/%2F/devq")[0] == 201
    # ... within its resource permissions (RabbitMQ's unanchored regex match)
    api.put("/api/users/narrow", {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%2F/narrow", {"configure": "^team\\.", "write": "^team\\.", "read": ""})
    narrow = api.as_user("narrow", "pw")
    assert narrow.put("/api/queues/%2F/team.q")[0] == 201
    status, err = narrow.put("/api/queues/%2F/other")
    assert status == 401 and "access to queue 'other'" in err["reason"]
    assert narrow.post("/api/queues/%2F/team.q/get", {"count": 1, "ackmode": "ack_requeue_true"})[0] == 401
    assert narrow.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": "team.q",
                                                                  "payload": "x"})[0] == 401
    assert narrow.get("/api/queues/%2F/team.q")[0] == 200
    assert narrow.get("/api/users")[0] == 401
    # UTF-8 passwords
    api.put("/api/users/uni", {"password": "päss wörd:x", "tags": "administrator"})
    assert api.as_user("uni", "päss wörd:x").get("/api/overview")[0] == 200
    # metrics are open to scrapers, like rabbitmq_prometheus
    assert api.as_user(None).get("/metrics")[0] == 200


def test_garbage_requests_do_not_hurt_the_broker(api, admin_broker, pika_conn):
    """Random bodies and paths against every mutating endpoint: 4xx answers, state intact."""
    api.put("/api/queues/%2F/keep", {"durable": True})
    api.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": "keep", "payload": "precious",
                                                         "payload_encoding": "string", "properties": {}})
    rng = random.Random(1234)
    values = [None, True, 0, -1, 2 ** 65, 1.5, "", "x" * 300, [], [1, {"a": None}], {}, {"a": [1]},
              "ack_requeue_false", "base64", {"x-match": "any"}, "\u0000"]
    keys = ["durable", "auto_delete", "arguments", "type", "internal", "routing_key", "payload",
            "payload_encoding", "properties", "count", "ackmode", "encoding", "truncate", "queues",
            "exchanges", "bindings", "users", "vhosts", "permissions", "password", "tags"]
    targets = [("PUT", "/api/queues/%2F/{n}"), ("PUT", "/api/exchanges/%2F/{n}"),
               ("POST", "/api/exchanges/%2F/amq.direct/publish"), ("POST", "/api/queues/%2F/{n}/get"),
               ("POST", "/api/bindings/%2F/e/amq.topic/q/{n}"), ("POST", "/api/definitions"),
               ("PUT", "/api/users/{n}"), ("PUT", "/api/vhosts/{n}"), ("DELETE", "/api/queues/%2F/{n}"),
               ("DELETE", "/api/connections/{n}"), ("POST", "/api/bindings/%2F/e/{n}/e/{n}")]
    names = ["", "%2F", "amq.gen", q("a/b"), "%00", "%FF%FE", "x" * 300, "..", "ok"]
    for _ in range(250):
        method, path = rng.choice(targets)
        path = path.replace("{n}", rng.choice(names) or "n")
        if rng.random() < 0.2:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
            status, _ = api.call(method, path, raw=raw)
        else:
            body = {rng.choice(keys): rng.choice(values) for _ in range(rng.randrange(5))}
            status, _ = api.call(method, path, body)
        assert status < 500, (method, path)
    # the broker still works and the queue kept its message
    ch = pika_conn.channel()
    method, _props, body = ch.basic_get("keep", auto_ack=True)
    assert body == b"precious"
    assert api.get("/api/overview")[0] == 200
