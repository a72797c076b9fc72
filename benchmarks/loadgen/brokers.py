"""The brokers under test: this project's broker as a child process (ephemeral port, a fresh
temporary data directory, its own process group, stopped on every exit path), RabbitMQ's
address, and throwaway PostgreSQL databases for the broker's store."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from .procs import raise_nofile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(HERE)
STORE_FLAGS = ("--data-dir", "--database-url", "--in-memory")
PG_ADMIN_URL = os.environ.get("EB_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class BrokerFailed(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def default_broker_cmd() -> list[str]:
    """``python -m exchange_broker serve`` with this interpreter (the repository is put first on
    PYTHONPATH, so the checkout's code runs even when another copy is installed)."""
    return [sys.executable, "-m", "exchange_broker", "serve"]


def tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()[-16384:]
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class OurBroker:
    """This project's broker as a child process in its own process group.

    ``cmd`` (default ``python -m exchange_broker serve`` with this checkout first on
    PYTHONPATH; a given ``cmd`` runs with the environment as it is) gets ``--host 127.0.0.1 --port 0
    --port-file F --admin-port 0`` and, unless ``extra`` names a store, ``--data-dir`` in a new
    temporary directory. A command containing ``{port}`` is a complete template instead: a free
    port is substituted and nothing is appended. ``{host}``, ``{port}`` and ``{tmpdir}`` are
    substituted in the command and in ``extra``. The temporary directory goes with ``stop()``.
    """

    def __init__(self, extra: list[str] | tuple = (), *, cmd: list[str] | None = None,
                 host: str = "127.0.0.1", admin_port: bool = True, temp_data_dir: bool = True,
                 log_path: str | None = None) -> None:
        self.host = host
        self.tmpdir = tempfile.mkdtemp(prefix="exchange-broker-bench-")
        self.log_path = log_path or os.path.join(self.tmpdir, "broker.log")
        self.default_cmd = not cmd
        base = list(cmd) if cmd else default_broker_cmd()
        self.template = any("{port}" in part for part in base)
        self.port = free_port(host) if self.template else 0
        subst = {"host": host, "port": str(self.port), "tmpdir": self.tmpdir}
        extra = list(extra)
        store_given = any(a.split("=", 1)[0] in STORE_FLAGS for a in extra)
        if temp_data_dir and not store_given and not self.template:
            os.makedirs(os.path.join(self.tmpdir, "data"))
            extra += ["--data-dir", "{tmpdir}/data"]
        self.port_file = os.path.join(self.tmpdir, "port")
        self.cmd = [part.format(**subst) for part in base]
        if not self.template:
            self.cmd += ["--host", host, "--port", "0", "--port-file", self.port_file]
            if admin_port:
                self.cmd += ["--admin-port", "0"]
        self.cmd += [a.format(**subst) for a in extra]
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> "OurBroker":
        raise_nofile()  # many-connection runs: the broker inherits the raised limit
        env = dict(os.environ)
        if self.default_cmd:  # this checkout's broker; a --broker-cmd decides for itself
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.tmpdir, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise BrokerFailed(f"broker exited with code {rc} during start-up:\n"
                                   + self.log_tail())
            if self._ready():
                return self
            time.sleep(0.05)
        raise BrokerFailed(f"broker did not accept connections within {timeout:.0f} s:\n"
                           + self.log_tail())

    def _ready(self) -> bool:
        if not self.template:
            try:
                with open(self.port_file) as fh:
                    self.port = int(fh.read().strip() or 0)
            except (OSError, ValueError):
                return False
            if not self.port:
                return False
        return port_open(self.host, self.port, 0.25)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def stop(self, grace: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            # our own child, started with start_new_session=True: its pgid is its pid
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def __enter__(self) -> "OurBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> str:
        return shlex.join(self.cmd)


class ThrowawayDatabase:
    """``CREATE DATABASE bench_<random>`` on PostgreSQL (default 127.0.0.1:5432, user postgres;
    ``EB_BENCH_PG_URL`` or ``admin_url`` for another maintenance database), dropped with
    ``WITH (FORCE)`` by ``drop()``. ``url`` is the broker's ``--database-url``."""

    def __init__(self, admin_url: str = PG_ADMIN_URL) -> None:
        import psycopg  # the broker's PostgreSQL driver
        from sqlalchemy.engine import make_url

        self._psycopg = psycopg
        admin = make_url(admin_url)
        self.admin = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.url = admin.set(drivername="postgresql+psycopg", database=self.name) \
            .render_as_string(hide_password=False)

    def drop(self) -> None:
        with self._psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
