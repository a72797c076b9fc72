"""Admin API fixtures: a real broker with its admin HTTP API on ephemeral ports (never 15672/5672)."""

from __future__ import annotations

import pytest
from admin_helpers import Api

from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def admin_broker():
    with ThreadedBroker(admin=True) as tb:
        yield tb


@pytest.fixture
def api(admin_broker) -> Api:
    return Api(admin_broker.admin_url)


@pytest.fixture
def pika_conn(admin_broker):
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", admin_broker.port, heartbeat=0, client_properties={"connection_name": "test-client"}))
    yield conn
    if conn.is_open:
        try:
            conn.close()
        except pika.exceptions.AMQPError:
            pass  # e.g. the test closed it through the API


@pytest.fixture(scope="module")
def shared_api():
    """One broker for a module's read-mostly tests (each test uses its own object names)."""
    with ThreadedBroker(admin=True) as tb:
        yield Api(tb.admin_url)
