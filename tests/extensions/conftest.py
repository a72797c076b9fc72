"""Fixtures for the queue/exchange extension tests: a channel on the in-process broker (through
``connect`` from tests/conftest.py), and a subprocess broker (``python -m exchange_broker serve``)
for restart / watermark tests."""

from __future__ import annotations

import pytest

from eb_support import SubprocessBroker


@pytest.fixture
def ch(connect):
    return connect().channel()


@pytest.fixture
def broker_proc(workdir):
    """A subprocess broker on a private SQLite data dir; ``start(*extra)``/``kill()`` across
    restarts."""
    bp = SubprocessBroker(workdir, ["--data-dir", str(workdir / "data")])
    try:
        yield bp
    finally:
        bp.kill()
        if bp.proc is not None:
            print(bp.log()[-4000:])
