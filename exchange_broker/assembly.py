"""One way to build a broker: the core with the standard queue types (used by app.py, testing.py
and anything embedding the broker)."""

from __future__ import annotations

from exchange_broker.core.broker import Broker
from exchange_broker.queue_types import QUEUE_TYPES


def make_broker(**kwargs) -> Broker:
    """``Broker(**kwargs)`` with the registered queue types (classic, stream) unless given."""
    kwargs.setdefault("queue_types", QUEUE_TYPES)
    return Broker(**kwargs)
