"""Policies that last: definitions export -> import round trip, a real RabbitMQ export with
policies (and an operator policy among its parameters) loads and applies, policies survive a
restart of the real broker process, and the `exchange-broker admin` commands."""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest
from admin_helpers import Api

from eb_support import close_quietly, free_port, pika_connect, uniq, wait_until
from exchange_broker.cli import main as broker_main
from exchange_broker.testing import ThreadedBroker

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "rabbitmq-3.10-policies-export.json"


def depth(ch, name) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def _policies(api: Api, vhost: str = "") -> tuple[list, list]:
    path = f"/{vhost}" if vhost else ""
    return api.ok("GET", f"/api/policies{path}"), api.ok("GET", f"/api/operator-policies{path}")


def test_export_import_round_trip(api):
    api.ok("PUT", "/api/vhosts/rt")
    api.ok("PUT", "/api/policies/rt/ttl", {"pattern": "^jobs", "definition": {"message-ttl": 5000,
                                                                               "dead-letter-exchange": "dlx"},
                                           "apply-to": "queues", "priority": 3})
    api.ok("PUT", "/api/policies/rt/ae", {"pattern": "^in$", "definition": {"alternate-exchange": "lost"},
                                          "apply-to": "exchanges"})
    api.ok("PUT", "/api/operator-policies/rt/cap", {"pattern": ".*", "definition": {"max-length": 100},
                                                    "apply-to": "queues", "priority": 1})
    api.ok("PUT", "/api/queues/rt/jobs", {"durable": True})
    exported = api.ok("GET", "/api/definitions")
    assert sorted(p["name"] for p in exported["policies"]) == ["ae", "ttl"]
    assert {"value": {"pattern": ".*", "apply-to": "queues", "priority": 1, "definition": {"max-length": 100}},
            "vhost": "rt", "component": "operator_policy", "name": "cap"} in exported["parameters"]
    one_vhost = api.ok("GET", "/api/definitions/rt")
    assert all("vhost" not in p for p in one_vhost["policies"] + one_vhost["parameters"])
    with ThreadedBroker(admin=True) as other:
        fresh = Api(other.admin_url)
        fresh.ok("POST", "/api/definitions", exported)
        assert _policies(fresh, "rt") == _policies(api, "rt")
        again = fresh.ok("GET", "/api/definitions")
        for key in ("policies", "parameters"):
            assert sorted(map(json.dumps, again[key])) == sorted(map(json.dumps, exported[key]))
        info = fresh.ok("GET", "/api/queues/rt/jobs")  # applied to the imported queue
        assert (info["policy"], info["operator_policy"]) == ("ttl", "cap")
        # the per-vhost format into another vhost
        fresh.ok("PUT", "/api/vhosts/copy")
        fresh.ok("POST", "/api/definitions/copy", one_vhost)
        assert [p["name"] for p in fresh.ok("GET", "/api/operator-policies/copy")] == ["cap"]
        assert fresh.ok("GET", "/api/queues/copy/jobs")["policy"] == "ttl"


def test_import_refuses_a_bad_policy_before_applying_anything(api):
    doc = {"vhosts": [{"name": "bad-import"}],
           "queues": [{"name": "q", "vhost": "bad-import", "durable": True, "arguments": {}}],
           "policies": [{"vhost": "bad-import", "name": "broken", "pattern": "x", "apply-to": "queues",
                         "definition": {"message-ttl": "soon"}, "priority": 0}]}
    status, body = api.post("/api/definitions", doc)
    assert status == 400
    assert body["reason"] == ("Validation failed\n\n&lt;&lt;\"soon\"&gt;&gt; is not a valid message TTL\n"
                              " (bad-import/broken)")
    assert api.get("/api/vhosts/bad-import")[0] == 404
    doc["policies"][0]["definition"] = {"message-ttl": 1}
    doc["policies"][0]["vhost"] = "elsewhere"
    assert api.post("/api/definitions", doc) == (400, {"error": "bad_request",
                                                       "reason": ["no_such_vhost", "elsewhere"]})


def test_rabbitmq_export_with_policies_loads_and_applies(api, admin_broker):
    """A RabbitMQ 3.10.8 export (policies, an operator policy as a parameter, classic mirroring)."""
    doc = json.loads(FIXTURE.read_text())
    api.ok("POST", "/api/definitions", doc)
    pols, ops = _policies(api, "shop")
    assert {p["name"] for p in pols} == {"orders-ttl", "ha-all", "events-ae"}
    assert [o["name"] for o in ops] == ["cap"]
    capped = api.ok("GET", "/api/queues/shop/orders.capped")
    assert (capped["policy"], capped["operator_policy"]) == ("orders-ttl", "cap")
    assert capped["effective_policy_definition"] == {"dead-letter-exchange": "dlx", "max-length": 5,
                                                     "message-ttl": 300}
    assert api.ok("GET", "/api/queues/shop/dead")["policy"] == "ha-all"
    conn = pika_connect(admin_broker.port, vhost="shop")
    try:
        ch = conn.channel()
        for i in range(8):  # max-length 5 (the policy's, under the argument's 100): 3 dropped
            ch.basic_publish("", "orders.capped", f"m{i}".encode())
        ch.basic_publish("events", "order.new", b"new order")  # bound: orders.new, then expires
        ch.basic_publish("events", "order.unknown", b"unroutable")  # the policy's alternate exchange
        assert wait_until(lambda: depth(ch, "dead") == 9, 10)
        reasons = Counter()
        for _ in range(9):
            _, props, _ = ch.basic_get("dead", auto_ack=True)
            death = props.headers["x-death"][0]
            reasons[(death["queue"], death["reason"])] += 1
        assert reasons == {("orders.capped", "maxlen"): 3, ("orders.capped", "expired"): 5,
                           ("orders.new", "expired"): 1}
        assert ch.basic_get("unrouted-q", auto_ack=True)[2] == b"unroutable"
    finally:
        close_quietly(conn)


def _start(spawn_broker, store: list) -> tuple:
    port = free_port()
    broker = spawn_broker(*store, "--admin-port", str(port))
    api = Api(f"http://127.0.0.1:{port}")
    assert wait_until(lambda: api.get("/api/overview")[0] == 200, 10)
    return broker, api


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, workdir) -> list:
    """The broker's store options: a SQLite data dir, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        return ["--data-dir", str(workdir / "data")]
    _name, url = request.getfixturevalue("pg_database")
    return ["--database-url", url]


def test_policies_survive_a_restart(spawn_broker, store):
    data = store
    broker, api = _start(spawn_broker, data)
    api.ok("PUT", "/api/policies/%2F/limit", {"pattern": "^kept", "definition": {"max-length": 2},
                                              "apply-to": "queues", "priority": 4})
    api.ok("PUT", "/api/policies/%2F/gone", {"pattern": "^kept", "definition": {"max-length": 1}})
    api.ok("DELETE", "/api/policies/%2F/gone")
    api.ok("PUT", "/api/operator-policies/%2F/cap", {"pattern": ".*", "definition": {"message-ttl": 600000}})
    api.ok("PUT", "/api/queues/%2F/kept", {"durable": True})
    before = _policies(api)
    assert broker.terminate() == 0
    broker, api = _start(spawn_broker, data)
    assert _policies(api) == before
    assert "2 policies" in broker.log()  # the recovery line counts policies and operator policies
    info = api.ok("GET", "/api/queues/%2F/kept")
    assert (info["policy"], info["operator_policy"]) == ("limit", "cap")
    conn = pika_connect(broker.port)
    try:
        ch = conn.channel()
        for _ in range(5):
            ch.basic_publish("", "kept", b"x")
        assert depth(ch, "kept") == 2  # the restored policy applies to the restored queue
    finally:
        close_quietly(conn)
    api.ok("DELETE", "/api/policies/%2F/limit")
    broker.kill()  # even without a clean stop: the deletion was committed before the 204
    broker, api = _start(spawn_broker, data)
    assert _policies(api) == ([], before[1])
    assert api.ok("GET", "/api/queues/%2F/kept")["policy"] is None


def test_admin_commands(admin_broker, api, capsys):
    def admin(*args: str) -> tuple[int, str, str]:
        code = broker_main(["admin", "--url", admin_broker.admin_url, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    name = uniq("cli")
    code, out, _ = admin("set", "policy", "ttl", f"^{name}$", '{"message-ttl": 60000}', "--apply-to", "queues",
                         "--priority", "2")
    assert (code, out.strip()) == (0, "policy set: ttl")
    assert admin("set", "operator-policy", "cap", ".*", '{"max-length": 10}', "--apply-to", "queues")[0] == 0
    api.ok("PUT", f"/api/queues/%2F/{name}", {})
    assert api.ok("GET", f"/api/queues/%2F/{name}")["policy"] == "ttl"
    code, out, _ = admin("list", "policies")
    header, *rows = out.strip().splitlines()
    assert header.split() == ["vhost", "name", "pattern", "apply-to", "definition", "priority"]
    assert rows[0].split() == ["/", "ttl", f"^{name}$", "queues", '{"message-ttl":60000}', "2"]
    code, out, _ = admin("list", "operator-policies", "--format", "json")
    assert [p["name"] for p in json.loads(out)] == ["cap"]
    code, _, err = admin("set", "policy", "bad", ".*", '{"message-ttl": "x"}')
    assert code == 1
    assert err.strip() == ('exchange-broker admin: HTTP 400 - bad_request: Validation failed; '
                           '<<"x">> is not a valid message TTL')
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit, match="not valid JSON"):
        admin("set", "policy", "bad", ".*", "{not json")
    assert admin("delete", "policy", "ttl")[0] == 0
    assert admin("delete", "operator-policy", "cap")[0] == 0
    code, _, err = admin("delete", "policy", "ttl")
    assert code == 1 and "404" in err
    assert api.ok("GET", "/api/policies") == [] and api.ok("GET", f"/api/queues/%2F/{name}")["policy"] is None
