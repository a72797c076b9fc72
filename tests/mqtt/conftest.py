"""Fixtures of the MQTT tests: a broker with an MQTT listener, paho clients closed at teardown."""

from __future__ import annotations

import pytest
from paho_support import Paho

from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def mqtt_broker():
    with ThreadedBroker(mqtt=True) as tb:
        yield tb


@pytest.fixture
def paho_at():
    """paho_at(port, client_id, **options) -> a connected Paho client of the broker on ``port``."""
    made = []

    def _make(port: int, client_id: str = "", **kw) -> Paho:
        c = Paho(port, client_id, **kw)
        made.append(c)
        return c

    yield _make
    for c in made:
        try:
            c.close()
        except Exception:
            pass


@pytest.fixture
def paho(mqtt_broker, paho_at):
    """paho(client_id, **options) -> a connected Paho client of ``mqtt_broker``."""
    return lambda client_id="", **kw: paho_at(mqtt_broker.mqtt_port, client_id, **kw)
