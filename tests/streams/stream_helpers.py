"""Helpers for the stream queue tests: pika/aio-pika consumers and a subprocess broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika

REPO = Path(__file__).resolve().parents[2]
STREAM = {"x-queue-type": "stream"}


def uniq(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=60, socket_timeout=10))


def declare_stream(ch, name: str, **args) -> None:
    ch.queue_declare(name, durable=True, arguments={**STREAM, **args})


def publish(ch, queue: str, bodies, headers=None) -> None:
    """Publish (the channel should be in confirm mode for the offsets to be settled)."""
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(headers=headers))


def read(conn: pika.BlockingConnection, queue: str, n: int | None = None, *, offset=None,
         name: str | None = None, prefetch: int = 100, ack: bool = True, idle: float = 0.5,
         timeout: float = 10.0, extra: dict | None = None) -> list[tuple[bytes, int, dict]]:
    """Consume on a fresh channel until ``n`` messages (or, without ``n``, until ``idle`` s pass
    without one); returns (body, x-stream-offset, headers) in delivery order.

    With ``n``, delivery ``k`` is acked at once only while ``k + prefetch <= n`` (the rest after
    the consumer is cancelled), so the broker never sends more than ``n`` and exactly the first
    ``n`` are processed (pika rejects deliveries still pending at cancel, which a stream
    refuses with 540, as RabbitMQ does)."""
    ch = conn.channel()
    if n:
        prefetch = min(prefetch, n)
    ch.basic_qos(prefetch_count=prefetch)
    args = dict(extra or {})
    if offset is not None:
        args["x-stream-offset"] = offset
    if name is not None:
        args["x-stream-consumer-name"] = name
    got: list[tuple[bytes, int, dict]] = []
    last_tag = [0]

    def on_message(chan, method, props, body):
        got.append((body, props.headers["x-stream-offset"], props.headers))
        last_tag[0] = method.delivery_tag
        if ack and (n is None or len(got) + prefetch <= n):
            chan.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, arguments=args)
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    count = 0
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)
        if len(got) != count:
            count, last = len(got), time.monotonic()
        if n is not None and len(got) >= n:
            break
        if n is None and time.monotonic() - last > idle:
            break
    ch.basic_cancel(tag)
    if ack and n is not None and last_tag[0] and len(got) + prefetch > n:
        ch.basic_ack(last_tag[0], multiple=True)
    ch.close()
    return got


class BrokerProcess:
    """`python -m exchange_broker serve` on a free port with a given --data-dir."""

    def __init__(self, data_dir: Path, env: dict | None = None) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = data_dir / "broker.log"

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        port_file = self.data_dir / "port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
               "--port-file", str(port_file), "--data-dir", str(self.data_dir / "db"),
               "--heartbeat", "0"]
        if _serve_has("--admin-port"):
            cmd += ["--admin-port", "0"]  # never 15672
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log,
                                         start_new_session=True)
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

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def kill(self) -> None:
        """SIGKILL: no shutdown work at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _serve_has(option: str) -> bool:
    from exchange_broker.cli import build_parser
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    return option in serve._option_string_actions  # noqa: SLF001
