"""Fixtures for the queue/exchange extension tests: pika connections to the in-process broker,
and a subprocess broker (``python -m exchange_broker serve``) for restart / watermark tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from ext_helpers import BrokerProc, pika_connect


@pytest.fixture
def connect(broker):
    """connect() -> a new pika BlockingConnection to the in-process broker (closed afterwards)."""
    opened = []

    def _connect(**kw):
        conn = pika_connect(broker.port, **kw)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        try:
            if conn.is_open:
                conn.close()
        except Exception:  # noqa: BLE001
            pass


@pytest.fixture
def ch(connect):
    return connect().channel()


@pytest.fixture
def broker_proc():
    """A subprocess broker on a private data dir; ``start()``/``kill()`` across restarts."""
    d = Path(tempfile.mkdtemp(prefix="eb-ext-"))
    bp = BrokerProc(d, [])
    try:
        yield bp
    finally:
        bp.kill()
        if bp.proc is not None:
            print(bp.log()[-4000:])
        shutil.rmtree(d, ignore_errors=True)
