"""Topic permissions: /api/topic-permissions (answers as RabbitMQ 3.10 gives them, compared by
hand), enforced as RabbitMQ enforces them on real pika and aio-pika connections: the routing key
of a publish to a topic exchange must match the write pattern, the binding key of a bind / unbind
from it the read pattern; ``{username}`` and ``{vhost}`` are expanded. Definitions carry them."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys

import pika
import pytest

from exchange_broker.testing import ThreadedBroker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "admin"))
from admin_helpers import Api  # noqa: E402

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "admin" / "fixtures" / "rabbitmq-3.10-export-limits.json"
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture
def tb():
    with ThreadedBroker(admin=True) as tb:
        yield tb


@pytest.fixture
def api(tb) -> Api:
    return Api(tb.admin_url)


def add_user(api: Api, name: str, vhost: str = "%2F") -> None:
    api.ok("PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})
    api.ok("PUT", f"/api/permissions/{vhost}/{name}", FULL)


def connect(tb, user: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", tb.port, vhost, pika.PlainCredentials(user, "pw"), heartbeat=0, connection_attempts=1))


class Client:
    """One pika connection; each attempt on a fresh channel (a refusal closes the channel)."""

    def __init__(self, tb, user: str, vhost: str = "/") -> None:
        self.conn = connect(tb, user, vhost)

    def attempt(self, fn) -> str | None:
        """None when ``fn(channel)`` succeeds, else the broker's refusal."""
        ch = self.conn.channel()
        try:
            fn(ch)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return f"{exc.reply_code} {exc.reply_text}"
        ch.close()
        return None

    def publish(self, exchange: str, key: str) -> str | None:
        def go(ch):
            ch.confirm_delivery()
            ch.basic_publish(exchange, key, b"x")
        return self.attempt(go)

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def refusal(key: str, exchange: str = "amq.topic", user: str = "tp", vhost: str = "/") -> str:
    return (f"403 ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost '{vhost}' "
            f"refused for user '{user}'")


# ---- the API -------------------------------------------------------------------------------------
def test_topic_permissions_api(api):
    add_user(api, "tp")
    base = "/api/topic-permissions/%2F/tp"
    assert api.get(base)[0] == 404
    assert api.put(base, {"exchange": "amq.topic", "write": "^a\\.", "read": "^r\\.{username}"}) == (201, None)
    assert api.put(base, {"exchange": "events", "write": ".*", "read": ".*"}) == (204, None)
    assert api.put(base, {"exchange": "events", "write": "^w", "read": ".*"}) == (204, None)
    one = {"user": "tp", "vhost": "/", "exchange": "amq.topic", "write": "^a\\.", "read": "^r\\.{username}"}
    two = {"user": "tp", "vhost": "/", "exchange": "events", "write": "^w", "read": ".*"}
    assert api.get(base) == (200, [one, two])
    assert api.get(f"{base}/events") == (200, [one, two])  # RabbitMQ lists them all here too
    assert api.get("/api/topic-permissions") == (200, [one, two])
    assert api.get("/api/users/tp/topic-permissions") == (200, [one, two])
    assert api.get("/api/vhosts/%2F/topic-permissions") == (200, [one, two])
    assert api.get("/api/topic-permissions/%2F")[0] == 404  # no such path in RabbitMQ
    assert api.get("/api/users/nobody/topic-permissions")[0] == 404
    assert api.get("/api/vhosts/nowhere/topic-permissions")[0] == 404
    assert api.put(base, {"exchange": "x", "write": "("})[1]["reason"] == "[{key_missing,read}]"
    assert api.put(base, {"exchange": "x"})[1]["reason"] == "[{key_missing,write},{key_missing,read}]"
    status, body = api.put(base, {"exchange": "x", "write": "(", "read": ""})
    assert status == 400 and body["reason"][:2] == ["invalid_regexp", "("]
    for path in ("/api/topic-permissions/%2F/nobody", "/api/topic-permissions/nowhere/tp"):
        assert api.put(path, {"exchange": "x", "write": "", "read": ""}) == (
            400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    add_user(api, "watcher")
    api.ok("PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})
    assert api.as_user("watcher", "pw").get("/api/topic-permissions")[0] == 401
    assert api.delete(f"{base}/events") == (204, None)
    assert api.delete(f"{base}/not-there") == (204, None)  # RabbitMQ: 204 while the user has some
    assert api.get(base) == (200, [one])
    assert api.delete(base) == (204, None)
    assert api.delete(base)[0] == 404
    assert api.get("/api/topic-permissions") == (200, [])


# ---- enforcement ---------------------------------------------------------------------------------
def test_publish_and_bind_are_checked_on_topic_exchanges(api, tb):
    add_user(api, "tp")
    api.ok("PUT", "/api/exchanges/%2F/events", {"type": "topic"})
    api.ok("PUT", "/api/exchanges/%2F/other", {"type": "topic"})
    api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "^{username}\\.",
                                                    "read": "^(public|{username})\\."})
    api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "events", "write": "^w\\.{vhost}$", "read": ".*"})
    c = Client(tb, "tp")
    try:
        assert c.publish("amq.topic", "tp.orders") is None
        assert c.publish("amq.topic", "other.orders") == refusal("other.orders")
        assert c.publish("amq.topic", "xtp.orders") == refusal("xtp.orders")
        assert c.publish("events", "w./") is None
        assert c.publish("events", "w.x") == refusal("w.x", "events")
        assert c.publish("other", "anything") is None   # no topic permission for this exchange
        assert c.publish("amq.direct", "anything") is None  # not a topic exchange
        assert c.publish("", "anything") is None
        assert c.publish("missing", "k") == "404 NOT_FOUND - no exchange 'missing' in vhost '/'"
        c.attempt(lambda ch: ch.queue_declare("tpq"))
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "amq.topic", "public.news")) is None
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "amq.topic", "tp.#")) is None
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "amq.topic", "secret.#")) == refusal("secret.#")
        assert c.attempt(lambda ch: ch.queue_unbind("tpq", "amq.topic", "secret.#")) == refusal("secret.#")
        assert c.attempt(lambda ch: ch.queue_unbind("tpq", "amq.topic", "tp.#")) is None
        c.attempt(lambda ch: ch.exchange_declare("fan", "fanout"))
        assert c.attempt(lambda ch: ch.exchange_bind("fan", "amq.topic", "secret.x")) == refusal("secret.x")
        assert c.attempt(lambda ch: ch.exchange_bind("fan", "amq.topic", "public.x")) is None
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "missing", "secret.#")) == \
            "404 NOT_FOUND - no exchange 'missing' in vhost '/'"
        # a change applies at once to the open connection
        api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "^other\\.", "read": ""})
        assert c.publish("amq.topic", "tp.orders") == refusal("tp.orders")
        assert c.publish("amq.topic", "other.orders") is None
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "amq.topic", "")) is None  # "" matches only ""
        assert c.attempt(lambda ch: ch.queue_bind("tpq", "amq.topic", "a")) == refusal("a")
        api.ok("DELETE", "/api/topic-permissions/%2F/tp")
        assert c.publish("amq.topic", "tp.orders") is None
    finally:
        c.close()
    guest = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port, heartbeat=0))
    try:  # another user's topic permissions do not touch guest
        api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "^$", "read": "^$"})
        ch = guest.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "anything", b"x")
    finally:
        guest.close()


def test_names_are_expanded_literally(api, tb):
    api.ok("PUT", "/api/vhosts/dev.v1")
    add_user(api, "a.b", "dev.v1")
    api.ok("PUT", "/api/topic-permissions/dev.v1/a.b", {"exchange": "amq.topic", "write": "^{username}@{vhost}$",
                                                        "read": ".*"})
    c = Client(tb, "a.b", "dev.v1")
    try:
        assert c.publish("amq.topic", "a.b@dev.v1") is None
        assert c.publish("amq.topic", "axb@devxv1") == refusal("axb@devxv1", user="a.b", vhost="dev.v1")
    finally:
        c.close()


def test_aio_pika_publisher_is_refused(api, tb):
    aio_pika = pytest.importorskip("aio_pika")
    add_user(api, "tp")
    api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "^ok\\.", "read": ".*"})

    async def main() -> str:
        conn = await aio_pika.connect(f"amqp://tp:pw@127.0.0.1:{tb.port}/")
        try:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange("amq.topic")
            await ex.publish(aio_pika.Message(b"x"), routing_key="ok.1")
            try:
                await ex.publish(aio_pika.Message(b"x"), routing_key="nope.1")
            except aio_pika.exceptions.ChannelClosed as exc:
                return str(exc)
            return "published"
        finally:
            await conn.close()
    text = asyncio.run(main())
    assert "access to topic 'nope.1' in exchange 'amq.topic' in vhost '/' refused for user 'tp'" in text


def test_deleting_the_user_or_vhost_drops_its_topic_permissions(api):
    api.ok("PUT", "/api/vhosts/tv")
    add_user(api, "tp", "tv")
    api.ok("PUT", "/api/permissions/%2F/tp", FULL)
    api.ok("PUT", "/api/topic-permissions/tv/tp", {"exchange": "amq.topic", "write": "", "read": ""})
    api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "", "read": ""})
    api.ok("DELETE", "/api/vhosts/tv")
    assert [p["vhost"] for p in api.ok("GET", "/api/topic-permissions")] == ["/"]
    api.ok("DELETE", "/api/users/tp")
    assert api.ok("GET", "/api/topic-permissions") == []


# ---- definitions ---------------------------------------------------------------------------------
def test_topic_permissions_in_definitions(api, tb):
    add_user(api, "tp")
    api.ok("PUT", "/api/topic-permissions/%2F/tp", {"exchange": "amq.topic", "write": "^w", "read": "^r"})
    defs = api.ok("GET", "/api/definitions")
    assert defs["topic_permissions"] == [{"user": "tp", "vhost": "/", "exchange": "amq.topic",
                                          "write": "^w", "read": "^r"}]
    assert "topic_permissions" not in api.ok("GET", "/api/definitions/%2F")  # as RabbitMQ's per-vhost export
    with ThreadedBroker(admin=True) as other:
        fresh = Api(other.admin_url)
        fresh.ok("POST", "/api/definitions", defs)
        assert fresh.ok("GET", "/api/topic-permissions") == defs["topic_permissions"]
    status, body = api.post("/api/definitions", {"topic_permissions": [
        {"user": "nobody", "vhost": "/", "exchange": "amq.topic", "write": "", "read": ""}]})
    assert status == 400 and body["reason"] == ["no_such_user", "nobody"]
    status, body = api.post("/api/definitions", {"topic_permissions": [
        {"user": "tp", "vhost": "/", "exchange": "amq.topic", "write": "("}]})
    assert status == 400 and body["reason"] == "[{key_missing,read}]"


def test_rabbitmq_export_with_topic_permissions_loads_and_is_enforced(api, tb):
    api.ok("POST", "/api/definitions", json.loads(FIXTURE.read_text()))
    assert len(api.ok("GET", "/api/topic-permissions/h12v/h12u")) == 2
    c = Client(tb, "h12u", "h12v")  # the user and password of the RabbitMQ export
    try:
        assert c.publish("amq.topic", "h12u.x") is None
        assert c.publish("amq.topic", "public.x") == refusal("public.x", user="h12u", vhost="h12v")
        assert c.publish("h12tx", "w.h12v") is None
        assert c.publish("h12tx", "w.other") == refusal("w.other", "h12tx", user="h12u", vhost="h12v")
        c.attempt(lambda ch: ch.queue_declare("inbox"))
        assert c.attempt(lambda ch: ch.queue_bind("inbox", "amq.topic", "public.#")) is None
        assert c.attempt(lambda ch: ch.queue_bind("inbox", "amq.topic", "admin.#")) == \
            refusal("admin.#", user="h12u", vhost="h12v")
    finally:
        c.close()


def test_publishing_through_the_api_obeys_topic_permissions(api):
    """POST /api/exchanges/.../publish checks the user's topic write pattern as an AMQP publish
    does (RabbitMQ publishes through a channel of the user's); refused: 401 with the AMQP text."""
    api.ok("PUT", "/api/users/tpapi", {"password": "pw", "tags": "management"})
    api.ok("PUT", "/api/permissions/%2F/tpapi", FULL)
    api.ok("PUT", "/api/topic-permissions/%2F/tpapi", {"exchange": "amq.topic", "write": "^allowed\\.",
                                                        "read": ".*"})
    user = api.as_user("tpapi", "pw")
    body = {"routing_key": "allowed.x", "payload": "hi", "payload_encoding": "string", "properties": {}}
    status, data = user.post("/api/exchanges/%2F/amq.topic/publish", body)
    assert status == 200 and data == {"routed": False}
    status, data = user.post("/api/exchanges/%2F/amq.topic/publish", dict(body, routing_key="other.x"))
    assert status == 401
    assert refusal("other.x", user="tpapi").split(" - ", 1)[1] in data["reason"]
    # an administrator is not held by topic permissions in the API, as before
    status, _ = api.post("/api/exchanges/%2F/amq.topic/publish", dict(body, routing_key="other.x"))
    assert status == 200


def test_a_lone_surrogate_in_a_json_body_is_a_400_not_a_500(api):
    raw = b'{"routing_key": "\\udcff", "payload": "x", "payload_encoding": "string", "properties": {}}'
    status, data = api.call("POST", "/api/exchanges/%2F/amq.topic/publish", raw=raw,
                            headers={"Content-Type": "application/json"})
    assert status == 400 and "surrogate" in data["reason"]
    assert api.get("/api/overview")[0] == 200
