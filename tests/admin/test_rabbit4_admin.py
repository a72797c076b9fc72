"""Admin API for the RabbitMQ 4.x features: the new exchange types listed and created like any."""
from __future__ import annotations

import pika
import pytest

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


# ---- per-vhost default queue type -----------------------------------------------------------------
def _queue_type(api, vhost, name):
    return api.ok("GET", f"/api/queues/{vhost}/{name}")["type"]


def test_default_queue_type_applies_to_declarations_without_x_queue_type(api, admin_broker):
    api.ok("PUT", "/api/vhosts/qq", {"default_queue_type": "quorum"})
    got = api.ok("GET", "/api/vhosts/qq")
    assert got["default_queue_type"] == "quorum" and got["metadata"]["default_queue_type"] == "quorum"
    api.ok("PUT", "/api/permissions/qq/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", admin_broker.port, "qq"))
    try:
        ch = conn.channel()
        ch.queue_declare("orders", durable=True)                  # no x-queue-type: quorum
        ch.queue_declare("orders", durable=True)                  # redeclare: equivalent
        ch.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})  # explicit wins
        tmp = ch.queue_declare("", exclusive=True).method.queue   # cannot be quorum: classic
        ch.queue_declare("transient", durable=False)              # cannot be quorum: classic
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("orders", durable=True, arguments={"x-queue-type": "classic"})
        assert err.value.reply_code == 406 and "x-queue-type" in err.value.reply_text
    finally:
        if conn.is_open:
            conn.close()
    assert _queue_type(api, "qq", "orders") == "quorum"
    assert api.ok("GET", "/api/queues/qq/orders")["arguments"] == {"x-queue-type": "quorum"}
    assert _queue_type(api, "qq", "events") == "stream"
    assert _queue_type(api, "qq", "transient") == "classic"
    assert tmp  # (deleted with its connection)
    # the default vhost is untouched
    assert api.ok("GET", "/api/vhosts/%2F")["default_queue_type"] == "classic"


def test_default_queue_type_refused_when_unknown(api):
    status, body = api.put("/api/vhosts/bad", {"default_queue_type": "mirrored"})
    assert status == 400 and "unsupported queue type 'mirrored'" in str(body)
    assert api.get("/api/vhosts/bad")[0] == 404


def test_default_queue_type_in_definitions_export_and_import(api):
    api.ok("PUT", "/api/vhosts/streams", {"default_queue_type": "stream"})
    exported = api.ok("GET", "/api/definitions")
    (v,) = [v for v in exported["vhosts"] if v["name"] == "streams"]
    assert v["default_queue_type"] == "stream" and v["metadata"]["default_queue_type"] == "stream"
    api.ok("POST", "/api/definitions", {"vhosts": [{"name": "imported",
                                                     "metadata": {"default_queue_type": "quorum"}}]})
    assert api.ok("GET", "/api/vhosts/imported")["default_queue_type"] == "quorum"
    status, body = api.post("/api/definitions", {"vhosts": [{"name": "nope", "default_queue_type": "x"}]})
    assert status == 400 and "unsupported default_queue_type 'x'" in str(body)


def test_admin_cli_vhost_declare_with_default_queue_type(admin_broker, api, capsys):
    from exchange_broker.cli import main as broker_main
    code = broker_main(["admin", "--url", admin_broker.admin_url, "vhost", "declare", "cli-v",
                        "--default-queue-type", "quorum"])
    assert code == 0 and "vhost declared: cli-v" in capsys.readouterr().out
    assert api.ok("GET", "/api/vhosts/cli-v")["default_queue_type"] == "quorum"
    code = broker_main(["admin", "--url", admin_broker.admin_url, "vhost", "declare", "cli-w",
                        "--default-queue-type", "nope"])
    assert code == 1 and "unsupported queue type 'nope'" in capsys.readouterr().err
    code = broker_main(["admin", "--url", admin_broker.admin_url, "list", "vhosts"])
    out = capsys.readouterr().out
    assert code == 0 and any(line.split()[:2] == ["cli-v", "quorum"] for line in out.splitlines())


def test_default_queue_type_survives_a_restart(spawn_broker):
    from admin_helpers import Api

    from eb_support import free_port
    port = free_port()
    first = spawn_broker("--admin-port", str(port))
    api = Api(f"http://127.0.0.1:{port}")
    wait_until(lambda: api.get("/api/overview")[0] == 200, 20)
    api.ok("PUT", "/api/vhosts/kept", {"default_queue_type": "quorum"})
    assert first.terminate() == 0
    spawn_broker("--admin-port", str(port))
    wait_until(lambda: api.get("/api/overview")[0] == 200, 20)
    assert api.ok("GET", "/api/vhosts/kept")["default_queue_type"] == "quorum"
