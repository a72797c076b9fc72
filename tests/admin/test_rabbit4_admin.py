"""Admin API for the RabbitMQ 4.x features: the new exchange types listed and created like any."""
from __future__ import annotations

import pika

from eb_support import uniq, wait_until

NEW_TYPES = ("x-consistent-hash", "x-modulus-hash", "x-local-random")


def test_overview_lists_the_new_exchange_types(api):
    listed = [t["name"] for t in api.ok("GET", "/api/overview")["exchange_types"]]
    assert set(NEW_TYPES) <= set(listed)


def test_create_consistent_hash_exchange_and_bind_through_the_api(api, pika_conn):
    x = uniq("chx")
    api.ok("PUT", f"/api/exchanges/%2F/{x}", {"type": "x-consistent-hash",
                                              "arguments": {"hash-header": "customer"}})
    got = api.ok("GET", f"/api/exchanges/%2F/{x}")
    assert got["type"] == "x-consistent-hash" and got["arguments"] == {"hash-header": "customer"}
    ch = pika_conn.channel()
    names = [uniq("q") for _ in range(2)]
    for n in names:
        ch.queue_declare(n)
        api.ok("POST", f"/api/bindings/%2F/e/{x}/q/{n}", {"routing_key": "5"})
    status, _ = api.post(f"/api/bindings/%2F/e/{x}/q/{names[0]}", {"routing_key": "0"})
    assert status == 400
    for _ in range(10):
        ch.basic_publish(x, "", b"m", pika.BasicProperties(headers={"customer": "c1"}))
    wait_until(lambda: sum(ch.queue_declare(n, passive=True).method.message_count for n in names) == 10)
    assert sorted(ch.queue_declare(n, passive=True).method.message_count for n in names) == [0, 10]


def test_create_the_other_types_and_refuse_bad_arguments(api):
    for t in ("x-modulus-hash", "x-local-random"):
        x = uniq("x")
        api.ok("PUT", f"/api/exchanges/%2F/{x}", {"type": t})
        assert api.ok("GET", f"/api/exchanges/%2F/{x}")["type"] == t
    status, body = api.put(f"/api/exchanges/%2F/{uniq('x')}",
                           {"type": "x-consistent-hash", "arguments": {"hash-property": "nope"}})
    assert status == 400 and "Unsupported property: nope" in str(body)
