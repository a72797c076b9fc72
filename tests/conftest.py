"""Shared fixtures: a real broker on an ephemeral port (never 5672), real clients."""

from __future__ import annotations

import os

import pytest

from exchange_broker.testing import ThreadedBroker

# `exchange-broker serve` started by tests must never take the admin API's default port 15672
# (RabbitMQ's): off unless a test asks for a port of its own (tests/admin does).
os.environ["EXCHANGE_BROKER_ADMIN_PORT"] = "0"


@pytest.fixture
def broker():
    """A fresh in-process broker per test, on an ephemeral port."""
    with ThreadedBroker() as tb:
        yield tb


@pytest.fixture
def pika_conn(broker):
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port,
                                                             heartbeat=0, blocked_connection_timeout=30))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(pika_conn):
    return pika_conn.channel()
