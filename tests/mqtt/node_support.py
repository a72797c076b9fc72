"""The npm ``mqtt`` package for the tests (tests/mqtt/node): installed with ``npm ci`` from
package-lock.json on first use; the test skips, with the reason, without node/npm or registry."""

from __future__ import annotations

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
