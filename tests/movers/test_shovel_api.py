"""Dynamic shovels through the admin API, between two real brokers of this project (in-process,
real sockets, pika as the client): RabbitMQ's parameter names, checks and texts, the status
listing, moving messages with each ack mode, forward headers, delete-after, a refusing end shown
as a state with its reason (one warning, not a crash loop), restart, definitions round trip."""

from __future__ import annotations

import logging

import pytest
from admin_helpers import Api

from eb_support import close_quietly, pika_connect, uniq, wait_until
from mover_support import depth, publish
from exchange_broker.testing import ThreadedBroker

SHOVEL = "/api/parameters/shovel/%2F/"


def status(api: Api, name: str) -> dict:
    code, body = api.get(f"/api/shovels/vhost/%2F/{name}")
    return body if code == 200 else {}


def wait_state(api: Api, name: str, state: str, timeout: float = 15.0) -> dict:
    assert wait_until(lambda: status(api, name).get("state") == state, timeout), status(api, name)
    return status(api, name)


@pytest.mark.parametrize("value, reason", [
    ({"src-queue": "a", "dest-uri": "amqp://"}, 'Key "src-uri" not found in s'),
    ({"src-uri": "amqp://", "src-queue": "a"}, 'Key "dest-uri" not found in s'),
    ({"src-uri": "amqp://", "dest-uri": "amqp://"}, "Must specify 'src-exchange' or 'src-queue'"),
    ({"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://"},
     "Cannot specify 'src-exchange' and 'src-queue'"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b", "dest-exchange": "x"},
     "Cannot specify 'dest-exchange' and 'dest-queue'"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "later"},
     "ack-mode should be one of [no-ack,on-publish,on-confirm], actually was <<\"later\">>"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "prefetch-count": "many"},
     "prefetch-count should be a number, actually was <<\"many\">>"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-delete-after": "soon"},
     'src-delete-after should be a number greater than or equal to 0, "never" or "queue-length", '
     'actually was <<"soon">>'),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "no-ack", "src-delete-after": 5},
     "Cannot specify 'no-ack' and numerical 'delete-after'"),
    ({"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://"}, '"http://x" not a valid URI: bad_scheme'),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "colour": "red"},
     'Unrecognised terms [{<<"colour">>,<<"red">>}] in s'),
])
def test_refused_values_are_400_with_rabbitmq_text(here, value, reason):
    code, body = here.api.put(SHOVEL + "s", {"value": value})
    assert code == 400, body
    assert body == {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"}
    assert here.api.ok("GET", "/api/parameters/shovel") == []


def test_other_bad_requests(here):
    assert here.api.put(SHOVEL + "s", {"src-uri": "amqp://"})[0] == 400  # no "value"
    code, body = here.api.put("/api/parameters/nonesuch/%2F/s", {"value": {}})
    assert code == 400 and "component <<\"nonesuch\">> not found" in body["reason"]
    assert here.api.put("/api/parameters/shovel/nowhere/s", {"value": {}})[0] == 404
    assert here.api.get(SHOVEL + "missing")[0] == 404
    assert here.api.delete(SHOVEL + "missing")[0] == 404
    assert here.api.delete("/api/shovels/vhost/%2F/missing/restart")[0] == 404


def test_shovel_moves_queue_to_remote_queue_with_confirms(there, here):
    publish(here.port, "outbox", 0)  # declared, empty: the shovel replaced below has nothing to move
    value = {"src-uri": "amqp://", "src-queue": "outbox", "dest-uri": f"amqp://guest:guest@127.0.0.1:{there.port}",
             "dest-queue": "inbox", "dest-add-forward-headers": True, "prefetch-count": 50}
    assert here.api.put(SHOVEL + "out", {"value": value})[0] == 201
    assert here.api.put(SHOVEL + "out", {"value": value})[0] == 204  # replaced: a new shovel, its counters at 0
    assert here.api.ok("GET", SHOVEL + "out") == {"value": value, "vhost": "/", "component": "shovel", "name": "out"}
    publish(here.port, "outbox", 300, declare=False)
    assert wait_until(lambda: depth(there.port, "inbox") == 300, 20)
    assert depth(here.port, "outbox") == 0
    wait_state(here.api, "out", "running")
    # counted as each confirm comes back, which can trail the destination's depth by a moment
    assert wait_until(lambda: status(here.api, "out").get("forwarded") == 300, 10), status(here.api, "out")
    info = status(here.api, "out")
    assert info["forwarded"] == 300 and info["pending"] == 0
    assert (info["type"], info["vhost"], info["src_queue"], info["dest_queue"]) == ("dynamic", "/", "outbox", "inbox")
    assert info["dest_uri"] == f"amqp://guest@127.0.0.1:{there.port}"  # no password
    assert info["src_uri"] == "amqp://"
    assert [s["name"] for s in here.api.ok("GET", "/api/shovels")] == ["out"]
    assert [s["name"] for s in here.api.ok("GET", "/api/shovels/%2F")] == ["out"]
    conn = pika_connect(there.port)
    try:
        _m, props, body = conn.channel().basic_get("inbox", auto_ack=True)
        assert body == b"m0" and props.message_id == "0" and props.delivery_mode == 2
        (entry,) = props.headers["x-shovelled"]
        assert entry["shovel-name"] == "out" and entry["src-queue"] == "outbox" and entry["dest-queue"] == "inbox"
        assert "guest:guest" not in entry["dest-uri"]
    finally:
        close_quietly(conn)
    publish(here.port, "outbox", 10, declare=False)  # keeps moving what comes
    assert wait_until(lambda: depth(there.port, "inbox") == 309, 20)
    assert here.api.delete(SHOVEL + "out")[0] == 204
    assert here.api.ok("GET", "/api/shovels") == []
    publish(here.port, "outbox", 5, declare=False)  # stopped: stays here
    assert wait_until(lambda: depth(here.port, "outbox") == 5, 5)


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_other_ack_modes_and_exchange_ends(here, ack_mode):
    """From a source exchange (a queue of its own bound with the key) to a destination exchange
    with a key, within this broker (``amqp://`` both ends), with publish properties set."""
    conn = pika_connect(here.port)
    try:
        ch = conn.channel()
        ch.exchange_declare("events", "topic")
        ch.exchange_declare("copies", "direct")
        ch.queue_declare("copied")
        ch.queue_bind("copied", "copies", "k")
        name = uniq("s")
        value = {"src-uri": "amqp://", "src-exchange": "events", "src-exchange-key": "a.#", "dest-uri": "amqp://",
                 "dest-exchange": "copies", "dest-exchange-key": "k", "ack-mode": ack_mode,
                 "dest-publish-properties": {"app_id": "shovelled"}}
        assert here.api.put(SHOVEL + name, {"value": value})[0] == 201
        wait_state(here.api, name, "running")
        for key in ("a.1", "b.1", "a.2"):
            ch.basic_publish("events", key, key.encode())
        assert wait_until(lambda: ch.queue_declare("copied", passive=True).method.message_count == 2, 10)
        got = [ch.basic_get("copied", auto_ack=True) for _ in range(2)]
        assert [g[2] for g in got] == [b"a.1", b"a.2"] and got[0][1].app_id == "shovelled"
        assert status(here.api, name)["src_exchange_key"] == "a.#"
    finally:
        close_quietly(conn)


def test_delete_after_queue_length_moves_what_was_there_then_goes(here):
    publish(here.port, "backlog", 40)
    value = {"src-uri": "amqp://", "src-queue": "backlog", "dest-uri": "amqp://", "dest-queue": "drained",
             "src-delete-after": "queue-length", "prefetch-count": 7}
    assert here.api.put(SHOVEL + "drain", {"value": value})[0] == 201
    assert wait_until(lambda: here.api.get(SHOVEL + "drain")[0] == 404, 15)  # the parameter is removed
    assert depth(here.port, "drained") == 40 and depth(here.port, "backlog") == 0
    assert here.api.ok("GET", "/api/shovels") == []


def test_refusing_destination_is_a_state_not_a_crash_loop(there, here, caplog):
    publish(here.port, "held", 20)
    bad = f"amqp://guest:wrong@127.0.0.1:{there.port}"
    value = {"src-uri": "amqp://", "src-queue": "held", "dest-uri": bad, "dest-queue": "x", "reconnect-delay": 0.1}
    with caplog.at_level(logging.INFO, logger="exchange_broker.movers"):
        assert here.api.put(SHOVEL + "refused", {"value": value})[0] == 201
        info = wait_state(here.api, "refused", "terminated")
        assert "403" in info["reason"] and "ACCESS_REFUSED" in info["reason"] or "Login was refused" in info["reason"]
        assert "wrong" not in info["reason"]  # the password is not shown
        assert wait_until(lambda: depth(here.port, "held") == 20, 2)  # nothing taken, nothing lost
        # a missing predeclared source queue: 404 as the reason
        missing = {"src-uri": "amqp://", "src-queue": "nope", "src-predeclared": True, "dest-uri": "amqp://",
                   "dest-queue": "x", "reconnect-delay": 0.1}
        assert here.api.put(SHOVEL + "missing", {"value": missing})[0] == 201
        assert "404" in wait_state(here.api, "missing", "terminated")["reason"]
        # many retries (0.1 s apart), one warning each
        import time
        time.sleep(1.0)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        # fixed: the same name, a good URI -> running, everything moved
        value["dest-uri"] = f"amqp://guest:guest@127.0.0.1:{there.port}"
        assert here.api.put(SHOVEL + "refused", {"value": value})[0] == 204
        assert wait_until(lambda: depth(there.port, "x") == 20, 15)
        wait_state(here.api, "refused", "running")


def test_uri_list_tried_in_turn_and_restart(there, here):
    publish(here.port, "multi", 5)
    value = {"src-uri": "amqp://", "src-queue": "multi", "dest-queue": "multi",
             "dest-uri": ["amqp://guest:guest@127.0.0.1:1", f"amqp://guest:guest@127.0.0.1:{there.port}"]}
    assert here.api.put(SHOVEL + "m", {"value": value})[0] == 201
    assert wait_until(lambda: depth(there.port, "multi") == 5, 15)
    assert wait_state(here.api, "m", "running")["dest_uri"] == f"amqp://guest@127.0.0.1:{there.port}"
    assert here.api.delete("/api/shovels/vhost/%2F/m/restart")[0] == 204
    wait_state(here.api, "m", "running")
    publish(here.port, "multi", 5, declare=False)
    assert wait_until(lambda: depth(there.port, "multi") == 10, 15)


def test_definitions_round_trip_and_vhost_deletion(here):
    here.api.ok("PUT", "/api/vhosts/sv")
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
    here.api.ok("PUT", "/api/parameters/shovel/sv/copy", {"value": value})
    exported = here.api.ok("GET", "/api/definitions")
    item = {"value": value, "vhost": "sv", "component": "shovel", "name": "copy"}
    assert item in exported["parameters"]
    with ThreadedBroker(admin=True) as other:
        fresh = Api(other.admin_url)
        fresh.ok("POST", "/api/definitions", exported)
        assert fresh.ok("GET", "/api/parameters/shovel/sv") == [item]
        assert wait_until(lambda: [s["state"] for s in fresh.ok("GET", "/api/shovels/sv")] == ["running"], 15)
        bad = dict(exported, parameters=[{**item, "value": {"src-uri": "amqp://"}}])
        code, body = fresh.post("/api/definitions", bad)
        assert code == 400 and "sv/shovel/copy" in body["reason"]
    here.api.ok("DELETE", "/api/vhosts/sv")
    assert here.api.ok("GET", "/api/parameters/shovel") == []
    assert here.api.ok("GET", "/api/shovels") == []
