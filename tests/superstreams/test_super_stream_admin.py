"""Super streams in the admin API, the CLI and /metrics: partitions, groups (members, assignment,
committed offsets, lag), Prometheus lag gauges, and raising x-partitions (new partitions start
empty; keys are then routed mod the new count)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from eb_support import wait_until
from exchange_broker.cli import main as broker_main
from exchange_broker.testing import ThreadedBroker
from routing.super_stream import partition_of
from ss_helpers import Member, connect, key_of, publish, run_until


@pytest.fixture
def admin_broker():
    with ThreadedBroker(admin=True) as tb:
        yield tb


def _http(tb, method: str, path: str, body=None):
    req = urllib.request.Request(tb.admin_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode()


def test_admin_api_cli_metrics_and_grow(admin_broker, capsys):
    tb = admin_broker

    def admin(*args):
        code = broker_main(["admin", "--url", tb.admin_url, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = admin("super-stream", "declare", "orders", "--partitions", "2",
                         "--arguments", '{"x-max-age": "7D"}')
    assert code == 0, out
    conn = connect(tb.port)
    publish(conn.channel(), "orders", total=600)
    a = Member(tb.port, "orders", "billing", prefetch=10, ack_limit=100)
    run_until([a], lambda: len(a.got) >= 110)

    status, info = _http(tb, "GET", "/api/super-streams/%2F/orders")
    assert status == 200 and info["partitions"] == 2 and info["messages"] == 600
    assert [p["queue"] for p in info["partition_details"]] == ["orders-0", "orders-1"]
    assert info["arguments"]["x-max-age"] == "7D" and info["groups"] == ["billing"]
    assert _http(tb, "GET", "/api/queues/%2F/orders-1")[1]["arguments"]["x-max-age"] == "7D"
    assert wait_until(lambda: _http(tb, "GET", "/api/super-streams/%2F/orders/groups/billing")[1]["lag"] == 500)
    group = _http(tb, "GET", "/api/super-streams/%2F/orders/groups/billing")[1]
    assert [m["partitions"] for m in group["members"]] == [[0, 1]]
    assert {p["owner"] for p in group["partitions"]} == {a.tag}
    assert sum(p["committed_offset"] + 1 for p in group["partitions"]) == 100
    assert sum(p["unacked"] for p in group["partitions"]) == 10
    assert [g["group"] for g in _http(tb, "GET", "/api/super-streams/%2F/orders/groups")[1]] == ["billing"]
    assert _http(tb, "GET", "/api/super-streams/%2F")[1][0]["name"] == "orders"
    consumers = _http(tb, "GET", "/api/consumers/%2F")[1]    # one per partition held, with its tag
    assert sorted((c["queue"]["name"], c["consumer_tag"]) for c in consumers) == \
        [("orders-0", a.tag), ("orders-1", a.tag)]

    status, text = _http(tb, "GET", "/metrics")
    lines = [ln for ln in text.splitlines() if ln.startswith("exchange_broker_consumer_group_lag{")]
    assert len(lines) == 2 and sum(float(ln.split()[-1]) for ln in lines) == 500
    assert 'exchange_broker_consumer_group_members{group="billing",super_stream="orders",vhost="/"} 1.0' in text

    code, out, _ = admin("super-stream", "groups", "orders")
    assert code == 0 and out.count("billing") == 2 and "active" in out
    code, out, _ = admin("super-stream", "show", "orders")
    assert code == 0 and "orders-1" in out

    # raising x-partitions: new partitions start empty; the member now holds all four
    code, out, _ = admin("super-stream", "grow", "orders", "4")
    assert code == 0, out
    info = _http(tb, "GET", "/api/super-streams/%2F/orders")[1]
    assert [p["messages"] for p in info["partition_details"]][2:] == [0, 0]
    assert wait_until(lambda: _http(tb, "GET", "/api/super-streams/%2F/orders/groups/billing")[1]
                      ["members"][0]["partitions"] == [0, 1, 2, 3])
    conn.channel().exchange_declare("orders", "x-super-stream", durable=True,
                                    arguments={"x-partitions": 4})   # the new count is current
    a.close()
    publish(conn.channel(), "orders", total=300, start=600)
    b = Member(tb.port, "orders", "billing", prefetch=50)
    run_until([b], lambda: len(b.got) >= 800)
    assert sorted(i for i, _, _ in b.got) == sorted(set(range(900)) - {i for i, _, _ in a.acked})
    assert all(p == partition_of(key_of(i), 4) for i, p, _ in b.got if i >= 600)
    assert {p for i, p, _ in b.got if i >= 600} == {0, 1, 2, 3}

    # definitions: exported and imported again after the super stream was deleted
    status, defs = _http(tb, "GET", "/api/definitions")
    assert status == 200
    assert _http(tb, "DELETE", "/api/exchanges/%2F/orders")[0] == 204
    assert _http(tb, "GET", "/api/queues/%2F/orders-3")[0] == 404   # its partitions went too
    assert _http(tb, "POST", "/api/definitions", defs)[0] in (200, 201, 204)
    info = _http(tb, "GET", "/api/super-streams/%2F/orders")[1]
    assert info["partitions"] == 4 and [p["queue"] for p in info["partition_details"]] == \
        [f"orders-{i}" for i in range(4)]

    # bad input: JSON errors, the CLI's one line
    assert _http(tb, "PUT", "/api/super-streams/%2F/orders", {"partitions": 3})[0] == 400
    status, err = _http(tb, "PUT", "/api/super-streams/%2F/orders", {"partitions": "many"})
    assert status == 400 and "partitions" in err["reason"]
    assert _http(tb, "GET", "/api/super-streams/%2F/nope")[0] == 404
    assert _http(tb, "GET", "/api/super-streams/%2F/orders/groups/nobody")[0] == 404
    code, _out, err = admin("super-stream", "grow", "orders", "2")
    assert code == 1 and "partitions are never removed" in err and len(err.strip().splitlines()) == 1
    b.close()
    conn.close()


def test_partition_moves_only_once_its_deliveries_are_settled(admin_broker):
    """A holds every partition with 30 unacked deliveries (10 from each); B joins and is given
    partition 2, which stays 'draining' (B gets nothing from it) until A acks; B then starts
    right after A's last acked offset: no offset is out at two members."""
    tb = admin_broker
    conn = connect(tb.port)
    ch = conn.channel()
    ch.exchange_declare("moves", "x-super-stream", durable=True, arguments={"x-partitions": 3})
    publish(ch, "moves")
    a = Member(tb.port, "moves", "g", prefetch=30, ack_limit=0)
    run_until([a], lambda: len(a.got) >= 30)
    assert sorted({p for _, p, _ in a.got}) == [0, 1, 2]
    b = Member(tb.port, "moves", "g", prefetch=30)

    def part2():
        return _http(tb, "GET", "/api/super-streams/%2F/moves/groups/g")[1]["partitions"][2]
    assert wait_until(lambda: part2()["owner"] == b.tag)
    assert part2()["state"] == "draining" and part2()["unacked"] == 10
    b.pump()
    assert b.got == []                      # nothing from partition 2 while A holds its deliveries
    a.ch.basic_ack(a.last_tag, multiple=True)   # A settles: partition 2 moves to B
    a.ack_limit = None
    run_until([a, b], lambda: len(a.got) + len(b.got) >= 3000)
    assert {p for _, p, _ in b.got} == {2}
    assert min(o for _, _, o in b.got) == 10   # right after A's last acked offset on partition 2
    items = a.got + b.got
    assert len(items) == 3000 and len({(p, o) for _, p, o in items}) == 3000
    a.close()
    b.close()
    conn.close()
