"""Node's amqplib: a burst of sendToQueue, then connection.close(cb) at once (issue 12, §1).

amqplib writes the connection.close on channel 0 ahead of channel frames still in its buffer, so
publishes keep arriving after the close. RabbitMQ answers close-ok, ignores what follows and lets
the client hang up; ``cb`` is then called without an error. The script is
tests/compat/node/burst_close.js; it uses amqplib from tests/interop/node (installed with
``npm ci`` from its package-lock.json on first use, skipped when node/npm or the registry are
missing).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from eb_support import node_with_amqplib

HERE = Path(__file__).parent
SCRIPT = HERE / "node" / "burst_close.js"


def run_burst(port: int, rounds: int) -> list[dict]:
    node = node_with_amqplib()
    proc = subprocess.run([node, str(SCRIPT), f"amqp://guest:guest@127.0.0.1:{port}/", str(rounds)],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}): {proc.stderr[-2000:]}"
    out = json.loads(lines[-1])
    assert "error" not in out, out
    assert proc.returncode == 0, proc.stderr
    return out["results"]


def test_burst_then_close_gets_close_ok(broker):
    results = run_burst(broker.port, 5)
    assert len(results) == 5
    for r in results:
        assert r["sent"] > 100  # the write buffer really filled up (about 2,000 small messages)
        assert r["closeError"] is None
        assert r["errors"] == []  # no `write EPIPE` / reset under the client
    # every connection is gone and its exclusive queue with it
    assert broker.call(lambda: len(broker.broker.sessions)) == 0
    assert broker.call(lambda: [q for q in broker.broker.vhosts["/"].queues if q.startswith("amq.gen-")]) == []


def test_burst_then_close_with_a_store(spawn_broker, workdir):
    results = run_burst(spawn_broker("--data-dir", str(workdir / "data")).port, 2)
    assert [r["closeError"] for r in results] == [None, None]
    assert [r["errors"] for r in results] == [[], []]
