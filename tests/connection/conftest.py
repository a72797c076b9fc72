"""Fixtures of the connection layer's rule tests."""

from __future__ import annotations

import pytest
from sansio import SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock


@pytest.fixture
def client():
    """A sans-IO client of a fresh in-memory broker on a ManualClock (``tests/sansio.py``)."""
    clock = ManualClock()
    return SansIOClient(make_broker(clock=clock), clock)
