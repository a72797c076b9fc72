"""/api/policies and /api/operator-policies over real HTTP: RabbitMQ's shapes, status codes,
validation errors and who may do what."""

from __future__ import annotations

import pytest
from admin_helpers import Api

from eb_support import uniq

TTL = {"pattern": "^orders\\.", "definition": {"message-ttl": 1000}, "apply-to": "queues", "priority": 1}


@pytest.fixture
def api(shared_api: Api) -> Api:
    return shared_api


def cleanup(api: Api, *paths: str) -> None:
    for path in paths:
        api.delete(path)


def test_put_get_list_delete(api):
    name = uniq("p")
    path = f"/api/policies/%2F/{name}"
    try:
        assert api.put(path, TTL) == (201, None)
        assert api.put(path, {**TTL, "priority": 2}) == (204, None)  # replaced
        expected = {"vhost": "/", "name": name, "pattern": "^orders\\.", "apply-to": "queues",
                    "definition": {"message-ttl": 1000}, "priority": 2}
        assert api.get(path) == (200, expected)
        assert expected in api.ok("GET", "/api/policies")
        assert expected in api.ok("GET", "/api/policies/%2F")
        # defaults: priority 0, apply-to all
        assert api.put(path, {"pattern": ".*", "definition": {"expires": 5000}})[0] == 204
        got = api.ok("GET", path)
        assert (got["priority"], got["apply-to"]) == (0, "all")
        assert api.delete(path) == (204, None)
        assert api.delete(path) == (404, {"error": "Object Not Found", "reason": "Not Found"})
        assert api.get(path) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    finally:
        cleanup(api, path)


def test_listing_sorted_by_priority_and_per_vhost(api):
    vhost = uniq("vh")
    api.ok("PUT", f"/api/vhosts/{vhost}")
    try:
        for name, prio in (("high", 9), ("low", -3), ("mid", 1)):
            api.ok("PUT", f"/api/policies/{vhost}/{name}", {"pattern": "x", "definition": {"expires": 10},
                                                            "priority": prio})
        assert [p["name"] for p in api.ok("GET", f"/api/policies/{vhost}")] == ["low", "mid", "high"]
        assert api.ok("GET", f"/api/operator-policies/{vhost}") == []
        assert api.get("/api/policies/no-such-vhost")[0] == 404
    finally:
        api.delete(f"/api/vhosts/{vhost}")
    assert all(p["vhost"] != vhost for p in api.ok("GET", "/api/policies"))  # gone with the vhost


def test_validation_errors_as_rabbitmq(api):
    path = f"/api/policies/%2F/{uniq('p')}"
    status, body = api.put(path, {"pattern": "(", "definition": {"message-ttl": "x", "foo": 1},
                                  "apply-to": "bogus", "priority": "x"})
    assert status == 400 and body["error"] == "bad_request"
    lines = body["reason"].split("\n")
    assert lines[:3] == ["Validation failed", "", "&lt;&lt;\"x\"&gt;&gt; is not a valid message TTL"]
    assert lines[3].startswith("apply-to 'bogus' unrecognised; should be one of: 'queues'")
    assert lines[4].startswith("pattern should be regular expression but is invalid")
    assert lines[5] == "priority should be a number, actually was &lt;&lt;\"x\"&gt;&gt;"
    assert api.put(path, {"pattern": "a", "definition": {"max-priority": 5}}) == (400, {
        "error": "bad_request",
        "reason": "Validation failed\n\n[{&lt;&lt;\"max-priority\"&gt;&gt;,5}] are not recognised policy settings\n"})
    assert api.put(path, {"pattern": "a", "definition": {}})[1]["reason"] == "Validation failed\n\nno policy provided\n"
    assert api.put(path, {}) == (400, {"error": "bad_request",
                                       "reason": "[{key_missing,pattern},{key_missing,definition}]"})
    assert api.put(path, {"definition": {"expires": 1}})[1]["reason"] == "[{key_missing,pattern}]"
    assert api.put(path, raw=b"[1]")[0] == 400
    assert api.put(path, raw=b"nonsense")[0] == 400
    assert api.put(path, {"pattern": "a", "definition": "x"})[0] == 400
    assert api.put("/api/policies/no-such-vhost/p", TTL) == (404, {"error": "not_found",
                                                                   "reason": "vhost_not_found"})
    assert api.get(path)[0] == 404  # nothing was stored


def test_operator_policies(api):
    name = uniq("op")
    path = f"/api/operator-policies/%2F/{name}"
    try:
        body = {"pattern": "^orders\\.", "definition": {"max-length": 5, "message-ttl": 100, "expires": 60000,
                                                        "overflow": "reject-publish", "delivery-limit": 3},
                "apply-to": "queues", "priority": 0}
        assert api.put(path, body) == (201, None)
        assert api.ok("GET", path) == {"vhost": "/", "name": name, **body}
        assert api.ok("GET", "/api/operator-policies") == [{"vhost": "/", "name": name, **body}]
        assert all(p["name"] != name for p in api.ok("GET", "/api/policies"))  # a separate namespace
        status, err = api.put(path, {"pattern": "a", "definition": {"dead-letter-exchange": "x"}})
        # operator policies accept only the operator keys; this endpoint does not HTML-escape
        assert (status, err["reason"]) == (400, 'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] '
                                                'are not recognised policy settings\n')
        assert api.delete(path) == (204, None)
        assert api.ok("GET", "/api/operator-policies") == []
    finally:
        cleanup(api, path)


def test_who_may(api):
    vhost = uniq("vh")
    users = {"pm": "policymaker", "mgmt": "management", "pm2": "policymaker"}
    api.ok("PUT", f"/api/vhosts/{vhost}")
    try:
        for user, tag in users.items():
            api.ok("PUT", f"/api/users/{user}", {"password": "pw", "tags": tag})
        for user in ("pm", "mgmt"):
            api.ok("PUT", f"/api/permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
        pm, mgmt, other = api.as_user("pm", "pw"), api.as_user("mgmt", "pw"), api.as_user("pm2", "pw")
        path = f"/api/policies/{vhost}/p"
        assert pm.put(path, TTL) == (201, None)
        assert pm.ok("GET", path)["name"] == "p"
        refused = (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
        assert mgmt.put(path, TTL) == refused
        assert mgmt.get(path) == refused
        assert other.put(path, TTL) == refused  # a policymaker without permissions in the vhost
        assert [p["name"] for p in mgmt.ok("GET", f"/api/policies/{vhost}")] == ["p"]  # listing: any user
        assert other.ok("GET", "/api/policies") == [p for p in other.ok("GET", "/api/policies")
                                                     if p["vhost"] != vhost]
        assert pm.put(f"/api/operator-policies/{vhost}/op", {"pattern": "a", "definition": {"expires": 1}}) == \
            (401, {"error": "not_authorised", "reason": "Not administrator user"})
        assert api.put(f"/api/operator-policies/{vhost}/op", {"pattern": "a", "definition": {"expires": 1}})[0] == 201
        assert pm.delete(path) == (204, None)
        assert api.as_user("pm", "wrong").get("/api/policies")[0] == 401
    finally:
        api.delete(f"/api/vhosts/{vhost}")
        for user in users:
            api.delete(f"/api/users/{user}")
