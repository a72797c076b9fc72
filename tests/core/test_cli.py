"""`exchange-broker serve` reports start-up failures clearly instead of a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_serve_on_a_taken_port_exits_1_with_a_clear_message(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--host", "127.0.0.1",
             "--port", str(port), "--admin-port", "0"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    finally:
        holder.close()
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr and "address already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
