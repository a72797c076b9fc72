"""Federation between two brokers of this project (in-process, real sockets, pika): upstreams and
sets as runtime parameters, policies choosing what is federated, exchange federation following
the local bindings as they are added and removed, a cycle of two brokers delivering each message
once, queue federation pulling only for local consumers, /api/federation-links."""

from __future__ import annotations

import time

import pika
import pytest
from admin_helpers import Api

from eb_support import close_quietly, pika_connect, wait_until
from mover_support import depth


def uri(tb) -> str:
    return f"amqp://guest:guest@127.0.0.1:{tb.port}"


def links(api: Api) -> list[dict]:
    return api.ok("GET", "/api/federation-links")


def wait_running(api: Api, n: int = 1) -> list[dict]:
    assert wait_until(lambda: [x["status"] for x in links(api)] == ["running"] * n, 20), links(api)
    return links(api)


def upstream_keys(tb, exchange: str) -> set[str]:
    """The binding keys of the federation queue on ``tb``'s ``exchange``."""
    def keys():
        ex = tb.broker.vhosts["/"].exchanges.get(exchange)
        return {rk for (_k, dest), rk, _a in ex.index.bindings() if dest.startswith("federation:")} \
            if ex is not None else set()
    return tb.call(keys)


def send(port: int, exchange: str, keys: list[str]) -> None:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i, key in enumerate(keys):
            ch.basic_publish(exchange, key, f"{key}/{i}".encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        close_quietly(conn)


def test_parameters_are_checked(here):
    code, body = here.api.put("/api/parameters/federation-upstream/%2F/up", {"value": {"max-hops": 1}})
    assert code == 400 and body["reason"] == 'Validation failed\n\nKey "uri" not found in up\n'
    code, body = here.api.put("/api/parameters/federation-upstream/%2F/up",
                              {"value": {"uri": "amqp://h", "ack-mode": "never"}})
    assert code == 400 and "ack-mode should be one of [no-ack,on-publish,on-confirm]" in body["reason"]
    code, body = here.api.put("/api/parameters/federation-upstream-set/%2F/s", {"value": [{"uri": "amqp://"}]})
    assert code == 400 and 'Key "upstream" not found in s' in body["reason"]
    code, body = here.api.put("/api/policies/%2F/p", {"pattern": "x", "definition": {"federation-upstream-set": 5}})
    assert code == 400 and "5 is not a valid federation upstream set name" in body["reason"]
    assert here.api.put("/api/parameters/federation-upstream-set/%2F/s", {"value": [{"upstream": "a"}]})[0] == 201


def test_exchange_federation_follows_bindings(upstream, here):
    conn = pika_connect(here.port)
    try:
        ch = conn.channel()
        ch.exchange_declare("fx", "topic", durable=True)
        for q in ("got-a", "got-b"):
            ch.queue_declare(q)
        ch.queue_bind("got-a", "fx", "a.*")
        here.api.ok("PUT", "/api/parameters/federation-upstream/%2F/up", {"value": {"uri": uri(upstream)}})
        here.api.ok("PUT", "/api/policies/%2F/fed", {"pattern": "^fx$", "apply-to": "exchanges",
                                                     "definition": {"federation-upstream-set": "all"}})
        (link,) = wait_running(here.api)
        assert (link["type"], link["exchange"], link["upstream"], link["upstream_exchange"]) == \
            ("exchange", "fx", "up", "fx")
        assert link["uri"] == f"amqp://guest@127.0.0.1:{upstream.port}"
        assert wait_until(lambda: upstream_keys(upstream, "fx") == {"a.*"}, 10)
        send(upstream.port, "fx", ["a.1", "b.1"] * 250)  # only what is bound here comes over
        assert wait_until(lambda: depth(here.port, "got-a") == 250, 20)
        ch.queue_bind("got-b", "fx", "b.*")  # added while it runs
        assert wait_until(lambda: upstream_keys(upstream, "fx") == {"a.*", "b.*"}, 10)
        send(upstream.port, "fx", ["a.2", "b.2"] * 250)
        assert wait_until(lambda: depth(here.port, "got-b") == 250 and depth(here.port, "got-a") == 500, 20)
        ch.queue_unbind("got-a", "fx", "a.*")  # removed while it runs
        assert wait_until(lambda: upstream_keys(upstream, "fx") == {"b.*"}, 10)
        send(upstream.port, "fx", ["a.3"] * 100 + ["b.fence"])
        assert wait_until(lambda: depth(here.port, "got-b") == 251, 20)
        assert depth(here.port, "got-a") == 500
        _m, props, body = ch.basic_get("got-b", auto_ack=True)
        (entry,) = props.headers["x-received-from"]
        assert entry["exchange"] == "fx" and entry["cluster-name"] == upstream.broker.cluster_name
        assert links(here.api)[0]["forwarded"] == 751
        here.api.ok("DELETE", "/api/policies/%2F/fed")  # no policy: no link
        assert wait_until(lambda: links(here.api) == [], 10)
    finally:
        close_quietly(conn)


def test_a_cycle_delivers_each_message_once(upstream, here):
    for a, b in ((here, upstream), (upstream, here)):
        conn = pika_connect(a.port)
        ch = conn.channel()
        ch.exchange_declare("ring", "fanout")
        ch.queue_declare("seen")
        ch.queue_bind("seen", "ring")
        close_quietly(conn)
        a.api.ok("PUT", "/api/parameters/federation-upstream/%2F/peer", {"value": {"uri": uri(b), "max-hops": 5}})
        a.api.ok("PUT", "/api/policies/%2F/ring", {"pattern": "^ring$", "apply-to": "exchanges",
                                                   "definition": {"federation-upstream": "peer"}})
    wait_running(here.api)
    wait_running(upstream.api)
    assert wait_until(lambda: upstream_keys(here, "ring") == {"seen"} and upstream_keys(upstream, "ring") == {"seen"}, 10)
    send(here.port, "ring", ["k"] * 10)
    send(upstream.port, "ring", ["k"] * 5)
    assert wait_until(lambda: depth(here.port, "seen") == 15 and depth(upstream.port, "seen") == 15, 20)
    assert wait_until(lambda: sum(x["dropped"] for x in links(here.api) + links(upstream.api)) == 15, 10)
    assert depth(here.port, "seen") == 15 and depth(upstream.port, "seen") == 15


def test_queue_federation_pulls_for_local_consumers(upstream, here):
    conn = pika_connect(upstream.port)
    ch = conn.channel()
    ch.queue_declare("work", durable=True)
    for i in range(60):
        ch.basic_publish("", "work", str(i).encode())
    close_quietly(conn)
    local = pika_connect(here.port)
    try:
        lch = local.channel()
        lch.queue_declare("work", durable=True)
        here.api.ok("PUT", "/api/parameters/federation-upstream/%2F/up",
                    {"value": {"uri": uri(upstream), "prefetch-count": 10}})
        here.api.ok("PUT", "/api/policies/%2F/q", {"pattern": "^work$", "apply-to": "queues",
                                                   "definition": {"federation-upstream": "up"}})
        (link,) = wait_running(here.api)
        assert (link["type"], link["queue"], link["upstream_queue"]) == ("queue", "work", "work")
        assert depth(upstream.port, "work") == 60  # no consumer here: nothing is pulled
        got = []
        lch.basic_qos(prefetch_count=5)
        lch.basic_consume("work", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
        deadline = time.monotonic() + 30
        while len(got) < 60 and time.monotonic() < deadline:
            local.process_data_events(time_limit=0.1)
        assert sorted(int(b) for b in got) == list(range(60))
        assert depth(upstream.port, "work") == 0
    finally:
        close_quietly(local)


@pytest.mark.parametrize("trust", [False, True], ids=["user-id-removed", "trust-user-id"])
def test_user_id_crosses_only_with_trust_user_id(upstream, here, trust):
    """RabbitMQ's federation: the upstream's validated ``user_id`` is removed from what comes
    over unless the upstream has ``trust-user-id``."""
    local = pika_connect(here.port)
    try:
        lch = local.channel()
        lch.exchange_declare("ux", "fanout", durable=True)
        lch.queue_declare("ux-got")
        lch.queue_bind("ux-got", "ux")
        here.api.ok("PUT", "/api/parameters/federation-upstream/%2F/up",
                    {"value": {"uri": uri(upstream), "trust-user-id": trust}})
        here.api.ok("PUT", "/api/policies/%2F/fed", {"pattern": "^ux$", "apply-to": "exchanges",
                                                     "definition": {"federation-upstream": "up"}})
        wait_running(here.api)
        assert wait_until(lambda: upstream_keys(upstream, "ux") == {"ux-got"}, 10)  # pika: the queue name
        conn = pika_connect(upstream.port)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("ux", "", b"signed", pika.BasicProperties(user_id="guest", message_id="1"))
        finally:
            close_quietly(conn)
        assert wait_until(lambda: depth(here.port, "ux-got") == 1, 20)
        _m, props, body = lch.basic_get("ux-got", auto_ack=True)
        assert body == b"signed" and props.message_id == "1"
        assert props.user_id == ("guest" if trust else None)
    finally:
        close_quietly(local)
