"""Fixtures for the movers (shovels): brokers of this project with their admin API on free
ports (never 5672 / 15672); the admin API client of tests/admin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "admin"))

from admin_helpers import Api  # noqa: E402

from exchange_broker.testing import ThreadedBroker  # noqa: E402


@pytest.fixture
def here():
    """An in-process broker with its admin API (shovels run in it)."""
    with ThreadedBroker(admin=True) as tb:
        tb.api = Api(tb.admin_url)
        yield tb


@pytest.fixture
def there():
    """A second broker: the other end of the shovels."""
    with ThreadedBroker() as tb:
        yield tb


@pytest.fixture
def upstream():
    """A federation upstream, with its admin API (a cycle federates both ways)."""
    with ThreadedBroker(admin=True) as tb:
        tb.api = Api(tb.admin_url)
        yield tb
