"""The admin HTTP API over real HTTP: RabbitMQ's paths, field names and status codes."""

from __future__ import annotations

import base64
import time

from admin_helpers import q


def test_overview_shape(api):
    status, ov = api.get("/api/overview")
    assert status == 200
    for key in ("object_totals", "queue_totals", "message_stats", "rabbitmq_version", "node"):
        assert key in ov
    assert set(ov["object_totals"]) >= {"connections", "channels", "consumers", "exchanges", "queues"}
    assert set(ov["queue_totals"]) >= {"messages", "messages_ready", "messages_unacknowledged"}
    for key in ("publish", "deliver", "ack"):
        assert isinstance(ov["message_stats"][key], int)
        assert isinstance(ov["message_stats"][f"{key}_details"]["rate"], float)


def test_overview_counts_publish_deliver_ack(api, pika_conn):
    ch = pika_conn.channel()
    ch.queue_declare("counted")
    for i in range(3):
        ch.basic_publish("", "counted", f"m{i}".encode())
    got = []
    for _ in range(3):
        method, _props, body = ch.basic_get("counted")
        got.append(method.delivery_tag)
    ch.queue_declare("consumed")
    ch.basic_publish("", "consumed", b"x")
    seen = []
    ch.basic_consume("consumed", lambda c, m, p, b: (seen.append(b), c.basic_ack(m.delivery_tag)))
    deadline = time.time() + 5
    while not seen and time.time() < deadline:
        pika_conn.process_data_events(0.05)
    ch.basic_ack(got[-1], multiple=True)
    pika_conn.process_data_events(0.2)
    ov = api.ok("GET", "/api/overview")
    stats = ov["message_stats"]
    assert stats["publish"] >= 4
    assert stats["deliver"] >= 1
    assert stats["ack"] >= 4
    assert ov["object_totals"]["connections"] == 1
    assert ov["object_totals"]["consumers"] == 1


def test_vhosts(api):
    vhosts = api.ok("GET", "/api/vhosts")
    assert [v["name"] for v in vhosts] == ["/"]
    assert api.ok("GET", "/api/vhosts/%2F")["name"] == "/"
    assert api.put("/api/vhosts/staging")[0] == 201
    assert api.put("/api/vhosts/staging")[0] == 204
    assert {v["name"] for v in api.ok("GET", "/api/vhosts")} == {"/", "staging"}
    assert api.put("/api/queues/staging/jobs", {"durable": True})[0] == 201
    assert api.delete("/api/vhosts/staging")[0] == 204
    assert api.get("/api/vhosts/staging")[0] == 404
    assert api.get("/api/queues/staging")[0] == 404


def test_exchange_lifecycle(api):
    assert api.put("/api/exchanges/%2F/orders", {"type": "topic", "durable": True,
                                                 "arguments": {"alternate-exchange": "ae"}})[0] == 201
    assert api.put("/api/exchanges/%2F/orders", {"type": "topic", "durable": True,
                                                 "arguments": {"alternate-exchange": "ae"}})[0] == 204
    ex = api.ok("GET", "/api/exchanges/%2F/orders")
    assert ex == {**ex, "name": "orders", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
                  "internal": False, "arguments": {"alternate-exchange": "ae"}}
    names = {e["name"] for e in api.ok("GET", "/api/exchanges/%2F")}
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match", "orders"} <= names
    assert {e["name"] for e in api.ok("GET", "/api/exchanges")} >= names
    # equivalence rules come from the broker's own declare
    status, err = api.put("/api/exchanges/%2F/orders", {"type": "direct", "durable": True})
    assert status == 400 and "inequivalent arg 'type'" in err["reason"]
    # defaults: {} declares a non-durable direct exchange, as RabbitMQ does
    assert api.put("/api/exchanges/%2F/plain", {})[0] == 201
    plain = api.ok("GET", "/api/exchanges/%2F/plain")
    assert (plain["type"], plain["durable"]) == ("direct", False)
    # if-unused
    api.put("/api/queues/%2F/oq")
    api.post("/api/bindings/%2F/e/orders/q/oq", {"routing_key": "o.#"})
    status, err = api.delete("/api/exchanges/%2F/orders?if-unused=true")
    assert status == 400 and "in use" in err["reason"]
    assert api.delete("/api/exchanges/%2F/orders")[0] == 204
    assert api.get("/api/exchanges/%2F/orders")[0] == 404
    assert api.delete("/api/exchanges/%2F/orders")[0] == 404


def test_queue_lifecycle(api, admin_broker):
    assert api.put("/api/queues/%2F/work", {"durable": True, "arguments": {"x-max-length": 10}})[0] == 201
    assert api.put("/api/queues/%2F/work", {"durable": True, "arguments": {"x-max-length": 10}})[0] == 204
    qi = api.ok("GET", "/api/queues/%2F/work")
    for key in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "state", "messages",
                "messages_ready", "messages_unacknowledged", "consumers", "message_bytes"):
        assert key in qi, key
    assert (qi["name"], qi["vhost"], qi["durable"], qi["state"]) == ("work", "/", True, "running")
    assert qi["arguments"] == {"x-max-length": 10}
    assert admin_broker.call(lambda: "work" in admin_broker.broker.vhosts["/"].queues)
    status, err = api.put("/api/queues/%2F/work", {"durable": False})
    assert status == 400 and "inequivalent arg 'durable'" in err["reason"]
    # publish two, then if-empty refuses
    for body in ("a", "bc"):
        assert api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                      {"routing_key": "work", "payload": body, "payload_encoding": "string",
                       "properties": {}}) == {"routed": True}
    qi = api.ok("GET", "/api/queues/%2F/work")
    assert (qi["messages"], qi["messages_ready"], qi["message_bytes"]) == (2, 2, 3)
    status, err = api.delete("/api/queues/%2F/work?if-empty=true")
    assert status == 400 and "not empty" in err["reason"]
    assert api.delete("/api/queues/%2F/work/contents")[0] == 204
    assert api.ok("GET", "/api/queues/%2F/work")["messages"] == 0
    assert api.delete("/api/queues/%2F/work?if-empty=true")[0] == 204
    assert api.get("/api/queues/%2F/work")[0] == 404
    assert api.delete("/api/queues/%2F/work")[0] == 404


def test_queue_if_unused(api, pika_conn):
    api.put("/api/queues/%2F/busy")
    ch = pika_conn.channel()
    ch.basic_consume("busy", lambda *a: None)
    pika_conn.process_data_events(0.1)
    assert api.ok("GET", "/api/queues/%2F/busy")["consumers"] == 1
    status, err = api.delete("/api/queues/%2F/busy?if-unused=true")
    assert status == 400 and "in use" in err["reason"]
    assert api.delete("/api/queues/%2F/busy")[0] == 204


def test_names_needing_escapes(api):
    for name in ("a/b", "with space", "ünï", "x%y", "a.b#c*"):
        assert api.put(f"/api/queues/%2F/{q(name)}")[0] == 201, name
        assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["name"] == name
        api.put(f"/api/exchanges/%2F/{q(name)}", {"type": "fanout"})
        assert api.ok("GET", f"/api/exchanges/%2F/{q(name)}")["name"] == name
    api.put("/api/vhosts/" + q("v/h"))
    api.put(f"/api/queues/{q('v/h')}/{q('q/1')}")
    assert api.ok("GET", f"/api/queues/{q('v/h')}/{q('q/1')}")["vhost"] == "v/h"


def test_get_ackmodes_and_encodings(api):
    api.put("/api/queues/%2F/g")
    for i in range(3):
        api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
               {"routing_key": "g", "payload": f"message-{i}", "payload_encoding": "string",
                "properties": {"delivery_mode": 2, "headers": {"n": i}, "content_type": "text/plain",
                               "timestamp": 1700000000, "type": "t", "message_id": f"id{i}"}})
    msgs = api.ok("POST", "/api/queues/%2F/g/get", {"count": 2, "ackmode": "ack_requeue_true",
                                                     "encoding": "auto"})
    assert [m["payload"] for m in msgs] == ["message-0", "message-1"]
    m0 = msgs[0]
    assert m0["payload_encoding"] == "string" and m0["payload_bytes"] == 9 and m0["redelivered"] is False
    assert m0["exchange"] == "" and m0["routing_key"] == "g" and m0["message_count"] == 2
    assert m0["properties"] == {"delivery_mode": 2, "headers": {"n": 0}, "content_type": "text/plain",
                                "timestamp": 1700000000, "type": "t", "message_id": "id0"}
    # requeued: same messages again, now redelivered, in the original order
    again = api.ok("POST", "/api/queues/%2F/g/get", {"count": 5, "ackmode": "reject_requeue_true",
                                                      "encoding": "base64", "truncate": 4})
    assert [m["redelivered"] for m in again] == [True, True, False]
    assert [base64.b64decode(m["payload"]) for m in again] == [b"mess"] * 3
    assert all(m["payload_encoding"] == "base64" and m["payload_bytes"] == 9 for m in again)
    assert api.ok("GET", "/api/queues/%2F/g")["messages"] == 3
    taken = api.ok("POST", "/api/queues/%2F/g/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                      "encoding": "auto"})
    assert taken[0]["payload"] == "message-0"
    api.ok("POST", "/api/queues/%2F/g/get", {"count": 1, "ackmode": "reject_requeue_false",
                                             "encoding": "auto"})
    assert api.ok("GET", "/api/queues/%2F/g")["messages"] == 1
    # binary payloads come back base64 under "auto"
    api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
           {"routing_key": "g", "payload": base64.b64encode(b"\xff\x00\xfe").decode(),
            "payload_encoding": "base64", "properties": {}})
    rest = api.ok("POST", "/api/queues/%2F/g/get", {"count": 10, "ackmode": "ack_requeue_false",
                                                     "encoding": "auto"})
    assert rest[-1]["payload_encoding"] == "base64"
    assert base64.b64decode(rest[-1]["payload"]) == b"\xff\x00\xfe"
    assert api.ok("POST", "/api/queues/%2F/g/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                     "encoding": "auto"}) == []


def test_publish_routed_flag(api):
    assert api.ok("POST", "/api/exchanges/%2F/amq.direct/publish",
                  {"routing_key": "nowhere", "payload": "x", "payload_encoding": "string",
                   "properties": {}}) == {"routed": False}
    api.put("/api/queues/%2F/here")
    api.post("/api/bindings/%2F/e/amq.direct/q/here", {"routing_key": "k"})
    assert api.ok("POST", "/api/exchanges/%2F/amq.direct/publish",
                  {"routing_key": "k", "payload": "x", "payload_encoding": "string",
                   "properties": {}}) == {"routed": True}


def test_bindings(api):
    api.put("/api/exchanges/%2F/src", {"type": "topic"})
    api.put("/api/exchanges/%2F/dst", {"type": "fanout"})
    api.put("/api/queues/%2F/bq")
    status, _ = api.post("/api/bindings/%2F/e/src/q/bq", {"routing_key": "a.*", "arguments": {"x": 1}})
    assert status == 201
    location = api.last_headers["Location"]
    assert location.startswith("bq/a.%252A~")
    assert api.post("/api/bindings/%2F/e/src/q/bq", {"routing_key": "plain"})[0] == 201
    assert api.post("/api/bindings/%2F/e/src/e/dst", {"routing_key": "#", "arguments": []})[0] == 201
    between = api.ok("GET", "/api/bindings/%2F/e/src/q/bq")
    assert {(b["routing_key"], b["properties_key"].split("~")[0]) for b in between} == \
        {("a.*", "a.%2A"), ("plain", "plain")}
    for b in between:
        assert b == {**b, "source": "src", "vhost": "/", "destination": "bq", "destination_type": "queue"}
    # the default exchange's implicit binding is listed, like RabbitMQ
    allb = api.ok("GET", "/api/bindings/%2F")
    assert {"source": "", "vhost": "/", "destination": "bq", "destination_type": "queue", "routing_key": "bq",
            "arguments": {}, "properties_key": "bq"} in allb
    assert api.ok("GET", "/api/bindings") == allb
    e2e = api.ok("GET", "/api/bindings/%2F/e/src/e/dst")
    assert [(b["destination_type"], b["routing_key"]) for b in e2e] == [("exchange", "#")]
    assert [b["destination"] for b in api.ok("GET", "/api/exchanges/%2F/src/bindings/source")
            ] == ["bq", "bq", "dst"]
    assert [b["source"] for b in api.ok("GET", "/api/exchanges/%2F/dst/bindings/destination")] == ["src"]
    assert {b["source"] for b in api.ok("GET", "/api/queues/%2F/bq/bindings")} == {"", "src"}
    # one binding by its properties_key (the key is percent-encoded once more in the path)
    with_args = next(b for b in between if b["arguments"])
    assert api.ok("GET", f"/api/bindings/%2F/e/src/q/bq/{q(with_args['properties_key'])}") == with_args
    assert api.delete(f"/api/bindings/%2F/e/src/q/bq/{q(with_args['properties_key'])}")[0] == 204
    assert api.delete(f"/api/bindings/%2F/e/src/q/bq/{q(with_args['properties_key'])}")[0] == 404
    assert api.delete("/api/bindings/%2F/e/src/q/bq/plain")[0] == 204
    assert api.delete(f"/api/bindings/%2F/e/src/e/dst/{q(e2e[0]['properties_key'])}")[0] == 204
    assert api.ok("GET", "/api/bindings/%2F/e/src/q/bq") == []
    # routing follows the binding table
    assert api.ok("POST", "/api/exchanges/%2F/src/publish", {"routing_key": "a.b", "payload": "",
                                                             "payload_encoding": "string",
                                                             "properties": {}}) == {"routed": False}
    assert api.post("/api/bindings/%2F/e/missing/q/bq", {})[0] == 404
    assert api.post("/api/bindings/%2F/e/src/q/missing", {})[0] == 404


def test_paging_sorting_columns(api):
    for i in range(7):
        api.put(f"/api/queues/%2F/page-{i}")
    api.put("/api/queues/%2F/other")
    page = api.ok("GET", "/api/queues/%2F?page=2&page_size=3&name=page-")
    assert {k: page[k] for k in ("filtered_count", "item_count", "page", "page_count", "page_size",
                                 "total_count")} == {"filtered_count": 7, "item_count": 3, "page": 2,
                                                     "page_count": 3, "page_size": 3, "total_count": 8}
    assert [i["name"] for i in page["items"]] == ["page-3", "page-4", "page-5"]
    last = api.ok("GET", "/api/queues?page=3&page_size=3&name=page-")
    assert [i["name"] for i in last["items"]] == ["page-6"]
    rx = api.ok("GET", "/api/queues/%2F?page=1&name=%5Epage-%5B12%5D%24&use_regex=true")
    assert [i["name"] for i in rx["items"]] == ["page-1", "page-2"]
    desc = api.ok("GET", "/api/queues/%2F?sort=name&sort_reverse=true&columns=name,vhost")
    assert desc[0] == {"name": "page-6", "vhost": "/"} and desc[-1] == {"name": "other", "vhost": "/"}
    empty = api.ok("GET", "/api/queues/%2F?page=1&name=zzz")
    assert (empty["items"], empty["page_count"], empty["filtered_count"]) == ([], 0, 0)
    status, err = api.get("/api/queues/%2F?page=9&page_size=3")
    assert status == 400 and err["error"] == "page_out_of_range"
    status, err = api.get("/api/queues/%2F?page=1&page_size=501")
    assert status == 400 and err["error"] == "invalid_pagination_parameters"
    status, err = api.get("/api/queues/%2F?page=x")
    assert status == 400 and err["error"] == "bad_request"
    ex_page = api.ok("GET", "/api/exchanges/%2F?page=1&page_size=2")
    assert ex_page["item_count"] == 2 and ex_page["total_count"] == 7  # as RabbitMQ: amq.rabbitmq.trace too


def test_connections_channels_consumers(api, pika_conn):
    ch = pika_conn.channel()
    ch.basic_qos(prefetch_count=7)
    ch.queue_declare("cq")
    ch.basic_consume("cq", lambda *a: None, consumer_tag="my-tag", arguments={"x-priority": 3})
    pika_conn.process_data_events(0.1)
    conns = api.ok("GET", "/api/connections")
    assert len(conns) == 1
    c = conns[0]
    assert c == {**c, "user": "guest", "vhost": "/", "protocol": "AMQP 0-9-1", "state": "running",
                 "channels": 1, "user_provided_name": "test-client", "peer_host": "127.0.0.1"}
    assert c["client_properties"]["product"] == "Pika Python Client Library"
    assert " -> " in c["name"]
    assert api.ok("GET", f"/api/connections/{q(c['name'])}")["name"] == c["name"]
    chans = api.ok("GET", "/api/channels")
    assert len(chans) == 1
    assert chans[0] == {**chans[0], "name": f"{c['name']} (1)", "number": 1, "prefetch_count": 7,
                        "consumer_count": 1, "vhost": "/", "user": "guest"}
    assert api.ok("GET", f"/api/channels/{q(chans[0]['name'])}")["number"] == 1
    assert api.ok("GET", f"/api/connections/{q(c['name'])}/channels")[0]["name"] == chans[0]["name"]
    consumers = api.ok("GET", "/api/consumers/%2F")
    assert len(consumers) == 1
    cons = consumers[0]
    assert cons == {**cons, "consumer_tag": "my-tag", "ack_required": True, "exclusive": False,
                    "prefetch_count": 7, "arguments": {"x-priority": 3},
                    "queue": {"name": "cq", "vhost": "/"}}
    assert cons["channel_details"]["connection_name"] == c["name"]
    assert api.ok("GET", "/api/consumers") == consumers
    assert api.ok("GET", "/api/queues/%2F/cq")["consumer_details"][0]["consumer_tag"] == "my-tag"
    assert api.get("/api/connections/nope")[0] == 404


def test_delete_connection_closes_client_with_reason(api, pika_conn):
    import pika.exceptions
    pika_conn.channel()
    name = api.ok("GET", "/api/connections")[0]["name"]
    status, _ = api.delete(f"/api/connections/{q(name)}", headers={"X-Reason": "maintenance window"})
    assert status == 204
    closed = None
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            pika_conn.process_data_events(0.1)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            closed = exc
            break
    assert closed is not None
    assert closed.reply_code == 320 and "maintenance window" in closed.reply_text
    deadline = time.time() + 5
    while api.ok("GET", "/api/connections") and time.time() < deadline:
        time.sleep(0.05)
    assert api.ok("GET", "/api/connections") == []


def test_exclusive_queue_is_listed_with_owner(api, pika_conn):
    ch = pika_conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    info = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    assert info["exclusive"] is True and " -> " in info["owner_pid_details"]["name"]
    # not exported: it dies with its connection
    assert name not in {x["name"] for x in api.ok("GET", "/api/definitions")["queues"]}


def test_openapi_document(api):
    status, doc = api.get("/api/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path in ("/api/overview", "/api/queues/{vhost}/{name}", "/api/queues/{vhost}/{name}/get",
                 "/api/exchanges/{vhost}/{name}/publish", "/api/definitions", "/metrics",
                 "/api/bindings/{vhost}/e/{source}/q/{dest}/{props}"):
        assert path in paths, path
    assert "HTTPBasic" in str(doc["components"]["securitySchemes"]) or \
        "basic" in str(doc["components"]["securitySchemes"]).lower()
    status, html = api.as_user(None).get("/api/docs")
    assert status == 200 and "swagger" in html.lower()


def test_aliveness_whoami(api):
    assert api.ok("GET", "/api/aliveness-test/%2F") == {"status": "ok"}
    assert api.ok("GET", "/api/whoami") == {"name": "guest", "tags": ["administrator"]}


def test_rates_are_sampled(api, admin_broker):
    admin_broker.call(admin_broker.admin.context.sample)
    api.put("/api/queues/%2F/rated")
    for _ in range(10):
        api.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": "rated", "payload": "x",
                                                             "payload_encoding": "string"})
    time.sleep(0.6)
    ov = api.ok("GET", "/api/overview")
    assert ov["message_stats"]["publish"] == 10
    assert ov["message_stats"]["publish_details"]["rate"] > 0
    qi = api.ok("GET", "/api/queues/%2F/rated")
    assert qi["message_stats"]["publish"] == 10


def test_internal_error_is_a_500_and_the_broker_lives_on(api, admin_broker, monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("simulated bug")
    from exchange_broker.management import overview
    monkeypatch.setattr(overview, "build_overview", boom)
    status, body = api.get("/api/overview")
    assert status == 500 and body["error"] == "internal_error" and "simulated bug" in body["reason"]
    monkeypatch.undo()
    assert api.get("/api/overview")[0] == 200
    assert api.put("/api/queues/%2F/still-works")[0] == 201
