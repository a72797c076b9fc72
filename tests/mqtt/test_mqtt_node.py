"""The npm ``mqtt`` client (Node.js) against the MQTT listener: tests/mqtt/node/mqtt_roundtrip.js.

node_modules is installed with ``npm ci`` (package-lock.json) on first run; skipped, with the
reason, when node/npm are missing or the npm registry cannot be reached."""

from __future__ import annotations

import json
import subprocess

from node_support import NODE_DIR, ensure_mqtt_npm


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
