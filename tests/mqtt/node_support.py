"""The npm ``mqtt`` package for the tests (tests/mqtt/node): installed with ``npm ci`` from
package-lock.json on first use; the test skips, with the reason, without node/npm or registry."""

from __future__ import annotations

from pathlib import Path

from eb_support import node_with

NODE_DIR = Path(__file__).parent / "node"


def ensure_mqtt_npm() -> str:
    """The node binary, once node_modules/mqtt is installed (also used by the browser test)."""
    return node_with(NODE_DIR, "mqtt", "the npm mqtt client test")
