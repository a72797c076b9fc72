"""Users, tags, vhosts and permissions are stored in the SQL store and restored at start-up.

Each "restart" builds a new Broker on the same SQLite file exactly as ``exchange-broker serve``
does (SqlStore -> SqlDurability -> recovery.restore) and serves it on an ephemeral port.
"""

from __future__ import annotations

import asyncio

import pika
import pytest
from sec_helpers import close_quietly, connect, roundtrip

from exchange_broker.app import build_broker, recover
from exchange_broker.core.auth import HASHING_SHA512, hash_password
from exchange_broker.core.broker import Broker
from exchange_broker.durability.sql import SqlDurability
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker


class DurableBroker:
    def __init__(self, url: str) -> None:
        from persistence.sql_store import SqlStore
        loop = asyncio.new_event_loop()
        self.store = SqlStore(url, sqlite_synchronous="OFF")
        self.store.open()
        self.durability = SqlDurability(self.store, loop)
        broker = build_broker(LoopClock(loop), durability=self.durability)
        recover(broker, self.durability, 1000)
        self.tb = ThreadedBroker(broker, loop=loop)
        self.tb.start()

    @property
    def broker(self) -> Broker:
        return self.tb.broker

    @property
    def port(self) -> int:
        return self.tb.port

    def call(self, fn, *args):
        return self.tb.call(fn, *args)

    def stop(self) -> None:
        self.tb.stop()
        self.durability.stop()
        self.store.close()


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'broker.db'}"


def stored(url):
    from persistence.sql_store import SqlStore
    s = SqlStore(url)
    s.open()
    try:
        return s.load_definitions()
    finally:
        s.close()


def test_fresh_store_is_seeded_with_the_default_user(url):
    b = DurableBroker(url)
    roundtrip(b.port)
    b.stop()
    defs = stored(url)
    assert [u["name"] for u in defs.users] == ["guest"]
    assert defs.users[0]["tags"] == ["administrator"]
    assert [(p["user"], p["vhost"], p["configure"], p["write"], p["read"]) for p in defs.permissions] == \
        [("guest", "/", ".*", ".*", ".*")]
    assert "/" in {v["name"] for v in defs.vhosts}


def test_users_permissions_and_vhosts_survive_a_restart(url):
    b = DurableBroker(url)
    b.call(b.broker.add_vhost, "orders")
    b.call(lambda: b.broker.add_user("alice", "alice-pw", ["management"]))
    b.call(lambda: b.broker.add_user("imported", None, ["monitoring"],
                                     password_hash=hash_password("imp-pw", HASHING_SHA512),
                                     hashing_algorithm=HASHING_SHA512))
    b.call(b.broker.set_permissions, "alice", "orders", "^alice-", "^alice-|amq\\.default", ".*")
    b.call(b.broker.set_permissions, "imported", "/", "", "", ".*")
    b.call(b.broker.set_permissions, "guest", "orders", ".*", ".*", ".*")
    b.call(b.broker.set_user_tags, "alice", ["management", "policymaker"])
    b.call(b.broker.delete_user, "guest")  # RabbitMQ: a deleted guest stays deleted
    b.stop()

    b = DurableBroker(url)
    try:
        assert set(b.broker.users) == {"alice", "imported"}
        assert b.broker.users["alice"].tags == ["management", "policymaker"]
        assert b.broker.permissions[("alice", "orders")] == ("^alice-", "^alice-|amq\\.default", ".*")
        assert ("guest", "orders") not in b.broker.permissions  # deleted with the user
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(b.port)  # guest/guest
        conn = connect(b.port, "alice", "alice-pw", "orders")
        ch = conn.channel()
        ch.queue_declare("alice-q")
        ch.basic_publish("", "alice-q", b"m")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="403.*queue 'bob-q' in vhost 'orders'"):
            ch.queue_declare("bob-q")
        close_quietly(conn)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            connect(b.port, "alice", "alice-pw", "/")  # no permissions there
        conn = connect(b.port, "imported", "imp-pw")  # a sha512 hash, stored as given
        conn.close()
    finally:
        b.stop()


def test_deletions_and_cleared_permissions_survive_a_restart(url):
    b = DurableBroker(url)
    b.call(b.broker.add_vhost, "tmp")
    b.call(b.broker.add_user, "erin", "erin", [])
    b.call(b.broker.set_permissions, "erin", "/", ".*", ".*", ".*")
    b.call(b.broker.set_permissions, "erin", "tmp", ".*", ".*", ".*")
    conn = connect(b.port, "erin", "erin", "tmp")
    conn.channel().queue_declare("kept-until-vhost-goes", durable=True)
    conn.close()
    assert b.call(b.broker.clear_permissions, "erin", "/")
    assert b.call(b.broker.delete_vhost, "tmp")
    b.stop()

    b = DurableBroker(url)
    try:
        assert "tmp" not in b.broker.vhosts
        assert ("erin", "/") not in b.broker.permissions and ("erin", "tmp") not in b.broker.permissions
        assert "erin" in b.broker.users
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            connect(b.port, "erin", "erin")
        roundtrip(b.port)  # guest as before
        b.call(b.broker.delete_vhost, "/")
    finally:
        b.stop()
    b = DurableBroker(url)  # a deleted default vhost is not re-created at start-up
    try:
        assert "/" not in b.broker.vhosts
        assert "guest" in b.broker.users
    finally:
        b.stop()


def test_admin_api_user_changes_are_stored(url):
    pytest.importorskip("fastapi")
    import asyncio
    import json
    import urllib.request

    from exchange_broker.management.server import AdminServer

    b = DurableBroker(url)
    admin = AdminServer(b.broker, "127.0.0.1", 0, amqp_server=b.tb.server)
    asyncio.run_coroutine_threadsafe(admin.start(), b.tb.loop).result(10)

    def call(method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{admin.port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status

    try:
        assert call("PUT", "/api/vhosts/api-vh") in (201, 204)
        assert call("PUT", "/api/users/frank", {"password": "frank", "tags": "monitoring"}) in (201, 204)
        assert call("PUT", "/api/permissions/api-vh/frank", {"configure": "", "write": "", "read": ".*"}) in (201, 204)
        assert call("PUT", "/api/users/gone", {"password": "x", "tags": ""}) in (201, 204)
        assert call("DELETE", "/api/users/gone") == 204
        assert call("PUT", "/api/users/frank", {"tags": "management"}) in (201, 204)  # tags only
    finally:
        asyncio.run_coroutine_threadsafe(admin.stop(), b.tb.loop).result(10)
        b.stop()
    b = DurableBroker(url)
    try:
        assert "gone" not in b.broker.users
        assert b.broker.users["frank"].tags == ["management"]
        assert b.broker.permissions[("frank", "api-vh")] == ("", "", ".*")
        conn = connect(b.port, "frank", "frank", "api-vh")
        conn.close()
    finally:
        b.stop()
