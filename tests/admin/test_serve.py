"""`exchange-broker serve` runs the admin API in its own process and loop, and stops on SIGTERM."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from eb_support import free_port

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def start(tmp_path, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    port_file = tmp_path / "amqp-port"
    proc = subprocess.Popen([sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1",
                             "--port", "0", "--port-file", str(port_file), "--in-memory", *extra],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "wb"),
                            env=dict(os.environ, **(env or {})))
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError((tmp_path / "log").read_text())
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("broker did not start")


def get(url: str):
    req = urllib.request.Request(url, headers={"Authorization": AUTH})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.parametrize("via_env", [False, True])
def test_serve_with_admin_api_and_sigterm(tmp_path, via_env):
    admin_port = free_port()
    if via_env:
        proc, amqp_port = start(tmp_path, env={"EXCHANGE_BROKER_ADMIN_PORT": str(admin_port)})
    else:
        proc, amqp_port = start(tmp_path, "--admin-port", str(admin_port))
    try:
        overview = get(f"http://127.0.0.1:{admin_port}/api/overview")
        assert overview["listeners"][0]["port"] == amqp_port
    finally:
        code = stop(proc)
    assert code == 0, (tmp_path / "log").read_text()


def test_admin_port_zero_turns_it_off(tmp_path):
    admin_port = free_port()
    proc, _ = start(tmp_path, "--admin-port", "0", env={"EXCHANGE_BROKER_ADMIN_PORT": str(admin_port)})
    try:
        with pytest.raises(urllib.error.URLError):
            get(f"http://127.0.0.1:{admin_port}/api/overview")
    finally:
        assert stop(proc) == 0
