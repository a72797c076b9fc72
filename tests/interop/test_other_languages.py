"""Clients in other languages, as Debian packages them, against the broker on a free port: each
script in tests/interop/clients/ connects, declares, publishes (with confirms where the client
has them), consumes and acks, and prints what it saw. Skipped, with the reason, when the language
or the client package is missing (.ci/run installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from eb_support import uniq

CLIENTS = Path(__file__).parent / "clients"


def _run(cmd: list[str], timeout: float = 120, cwd: Path | None = None, env: dict | None = None) -> list[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return lines


def _need(tool: str, what: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is needed for the {what} test (not on PATH)")
    return path


def test_perl_anyevent_rabbitmq(broker):
    # Net::AMQP opens with AMQP 0-9's protocol header (tests/compat/test_protocol_0_9.py)
    perl = _need("perl", "AnyEvent::RabbitMQ")
    if subprocess.run([perl, "-MAnyEvent::RabbitMQ", "-e1"], capture_output=True).returncode:
        pytest.skip("AnyEvent::RabbitMQ is not installed (Debian: libanyevent-rabbitmq-perl)")
    queue = uniq("perl")
    lines = _run([perl, str(CLIENTS / "anyevent_rabbitmq.pl"), "127.0.0.1", str(broker.port), queue])
    assert lines[:2] == ["connected exchange-broker", f"declared {queue}"]
    assert lines[-2:] == ["deleted", "ok"]
    # confirms and deliveries interleave as they arrive; each kind in its own order
    assert [x for x in lines if x.startswith("confirmed")] == [f"confirmed {i}" for i in (1, 2, 3)]
    assert [x for x in lines if x.startswith("got")] == [f"got perl {i} text/plain n={i}" for i in (1, 2, 3)]
    assert len(lines) == 10
