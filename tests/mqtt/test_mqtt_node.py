"""The npm ``mqtt`` client (Node.js) against the MQTT listener: tests/mqtt/node/mqtt_roundtrip.js.

node_modules is installed with ``npm ci`` (package-lock.json) on first run; skipped, with the
reason, when node/npm are missing or the npm registry cannot be reached."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent / "node"


def ensure_mqtt_npm() -> str:
    """The node binary, once node_modules/mqtt is installed (also used by the browser test)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the npm mqtt client test (not on PATH)")
    if not (NODE_DIR / "node_modules" / "mqtt" / "package.json").exists():
        cmd = [npm, "ci", "--silent", "--no-audit", "--no-fund"]
        try:
            proc = subprocess.run(cmd, cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip("`npm ci` timed out (npm registry unreachable?)")
        if proc.returncode != 0:
            pytest.skip(f"`npm ci` failed with exit code {proc.returncode} (npm registry unreachable?): "
                        f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return node


def test_npm_mqtt_client_round_trips(mqtt_broker):
    node = ensure_mqtt_npm()
    proc = subprocess.run([node, "mqtt_roundtrip.js", f"mqtt://127.0.0.1:{mqtt_broker.mqtt_port}"],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (rc={proc.returncode}): {proc.stderr}"
    out = json.loads(lines[-1])
    assert "error" not in out, out["error"]
    assert out["granted"] == [1]
    assert sorted(out["v311"]) == [["node/a/v311", "qos1", 1], ["node/b/v311", "qos0", 0]]
    assert out["connack5"] == {"topicAliasMaximum": 16}
    assert out["retained"] == [["node/retained", "kept", True]]
    assert out["v5"] == {"topic": "node/v5/x", "payload": "props", "userProperties": {"origin": "node"},
                         "correlationData": "c-7", "contentType": "text/plain",
                         "responseTopic": "node/replies"}
