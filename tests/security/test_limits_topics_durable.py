"""Vhost limits, user limits and topic permissions are stored in the SQL store (SQLite and
PostgreSQL) and restored at start-up; cleared ones, and those of a deleted user or vhost, stay gone.

Each "restart" builds a new Broker on the same store exactly as ``exchange-broker serve`` does
(SqlStore -> SqlDurability -> recovery) and serves it, with its admin API, on ephemeral ports.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pika
import pytest

from exchange_broker.app import build_broker, recover
from exchange_broker.durability.sql import SqlDurability
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker
from persistence import limits_store

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "admin"))
from admin_helpers import Api  # noqa: E402


class Durable:
    def __init__(self, url: str) -> None:
        from persistence.sql_store import SqlStore
        loop = asyncio.new_event_loop()
        self.store = SqlStore(url, sqlite_synchronous="OFF")
        self.store.open()
        self.durability = SqlDurability(self.store, loop)
        broker = build_broker(LoopClock(loop), durability=self.durability)
        recover(broker, self.durability, 1000)
        self.tb = ThreadedBroker(broker, loop=loop, admin=True)
        self.tb.start()
        self.api = Api(self.tb.admin_url)

    def stop(self) -> None:
        self.tb.stop()
        self.durability.stop()
        self.store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'broker.db'}"
        return
    from eb_support import create_pg_database, drop_pg_database, pg_reachable
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable")
    name, pg_url = create_pg_database("eb_limits")
    try:
        yield pg_url
    finally:
        drop_pg_database(name)


def restart(url: str, previous: Durable | None = None) -> Durable:
    if previous is not None:
        previous.stop()
    return Durable(url)


def stored(url: str) -> limits_store.LimitsAndTopics:
    from persistence.sql_store import SqlStore
    s = SqlStore(url)
    s.open()
    try:
        return limits_store.load(s)
    finally:
        s.close()


def test_limits_and_topic_permissions_survive_a_restart(url):
    b = restart(url)
    try:
        api = b.api
        api.ok("PUT", "/api/vhosts/prod")
        api.ok("PUT", "/api/users/app", {"password": "pw", "tags": ""})
        api.ok("PUT", "/api/permissions/prod/app", {"configure": ".*", "write": ".*", "read": ".*"})
        api.ok("PUT", "/api/vhost-limits/prod/max-queues", {"value": 1})
        api.ok("PUT", "/api/vhost-limits/prod/max-connections", {"value": 7})
        api.ok("PUT", "/api/user-limits/app/max-channels", {"value": 3})
        api.ok("PUT", "/api/topic-permissions/prod/app", {"exchange": "amq.topic", "write": "^{username}\\.",
                                                          "read": ".*"})
        b = restart(url, b)
        api = b.api
        assert api.get("/api/vhost-limits") == (200, [{"vhost": "prod", "value": {"max-queues": 1,
                                                                                  "max-connections": 7}}])
        assert api.get("/api/user-limits") == (200, [{"user": "app", "value": {"max-channels": 3}}])
        assert api.ok("GET", "/api/topic-permissions") == [
            {"user": "app", "vhost": "prod", "exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}]
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", b.tb.port, "prod", pika.PlainCredentials("app", "pw"), heartbeat=0))
        try:  # enforced after the restart
            ch = conn.channel()
            ch.queue_declare("one")
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                ch.queue_declare("two")
            assert "queue limit in vhost 'prod' (1) is reached" in info.value.reply_text
        finally:
            conn.close()
        # cleared ones stay cleared; the deleted vhost's and user's go with them
        api.ok("DELETE", "/api/vhost-limits/prod/max-connections")
        api.ok("DELETE", "/api/users/app")
        b = restart(url, b)
        assert b.api.get("/api/vhost-limits") == (200, [{"vhost": "prod", "value": {"max-queues": 1}}])
        assert b.api.get("/api/user-limits") == (200, [])
        assert b.api.get("/api/topic-permissions") == (200, [])
        b.api.ok("DELETE", "/api/vhosts/prod")
        b.stop()
        b = None
        left = stored(url)
        assert (left.vhost_limits, left.user_limits, left.topic_permissions) == ([], [], [])
    finally:
        if b is not None:
            b.stop()
