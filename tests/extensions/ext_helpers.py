"""Helpers for the queue/exchange extension tests (a module of its own, not conftest, so that
tests can import it whatever other conftest modules a run loads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions

REPO = Path(__file__).resolve().parents[2]


def uniq(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def pika_connect(port: int, **kw) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0,
                                       blocked_connection_timeout=kw.pop("blocked_connection_timeout", 30),
                                       **kw)
    return pika.BlockingConnection(params)


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def get_all(ch, queue: str, ack: bool = True) -> list:
    """basic.get until empty: [(method, props, body)]."""
    out = []
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=ack)
        if m is None:
            return out
        out.append((m, p, b))


class BrokerProc:
    """`python -m exchange_broker serve` on an ephemeral port with its own SQLite data dir."""

    def __init__(self, workdir: Path, extra: list[str]) -> None:
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.n = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, *extra: str, timeout: float = 30.0) -> "BrokerProc":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.n += 1
        port_file = self.workdir / f"port-{self.n}"
        self.log_path = self.workdir / f"broker-{self.n}.log"
        cmd = [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
               "--port-file", str(port_file), "--data-dir", str(self.workdir / "data"),
               "--heartbeat", "0", *self.extra, *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log, cwd=str(REPO), env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited during start-up:\n{self.log()[-3000:]}")
            try:
                raw = port_file.read_text().strip()
                if raw:
                    self.port = int(raw)
                    return self
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (FileNotFoundError, AttributeError):
            return ""
