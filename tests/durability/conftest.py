"""Durability fixtures: the real `exchange-broker serve` as a subprocess on a real store.

Every test that uses ``backend`` runs once on SQLite (a file in its own temp dir) and once on
a throwaway PostgreSQL database (created per test, dropped WITH (FORCE) afterwards).
``broker_factory`` starts broker processes on that store (the same store across restarts) and
kills whatever is still running at teardown.  Broker stderr (its log) goes to a file so tests
can assert on log lines without a pipe ever filling up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import Engine, make_url

from durability_helpers import PG_ADMIN_URL, dispose_pg_admin, pg_admin_engine, serve_has_option
from persistence.models import messages, queues

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


@pytest.fixture(scope="session", autouse=True)
def _dispose_pg_admin() -> Iterator[None]:
    yield
    dispose_pg_admin()


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A private temp dir (port files, logs, SQLite store), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="eb-durability-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class Backend:
    """One durable store: how to point the CLI at it, and SQL access for assertions."""

    name: str
    url: str
    args: list[str]
    dbname: str | None = None  # PostgreSQL database name
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_engine(self.url, pool_pre_ping=True)
        return self._engine

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def message_rows(self, queue: str | None = None, vhost: str = "/") -> int:
        """Rows in the ``messages`` table (of one queue, when named)."""
        stmt = select(func.count()).select_from(messages)
        if queue is not None:
            qid = select(queues.c.id).where(queues.c.vhost == vhost, queues.c.name == queue)
            stmt = stmt.where(messages.c.queue_id.in_(qid.scalar_subquery()))
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def stored_bodies(self, queue: str, vhost: str = "/") -> list[bytes]:
        qid = select(queues.c.id).where(queues.c.vhost == vhost, queues.c.name == queue)
        stmt = (select(messages.c.body).where(messages.c.queue_id.in_(qid.scalar_subquery()))
                .order_by(messages.c.seq))
        with self.engine.connect() as conn:
            return [bytes(r[0]) for r in conn.execute(stmt)]


def _sqlite_backend(workdir: Path) -> Backend:
    data = workdir / "data"
    data.mkdir()
    return Backend("sqlite", f"sqlite:///{data / 'broker.db'}", ["--data-dir", str(data)])


def _pg_create() -> tuple[str, str]:
    admin = pg_admin_engine()
    name = f"eb_dur_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    return name, url


def pg_drop(name: str) -> None:
    admin = pg_admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_database() -> Iterator[tuple[str, str]]:
    """(name, url) of a fresh, empty PostgreSQL database, dropped afterwards."""
    name, url = _pg_create()
    try:
        yield name, url
    finally:
        pg_drop(name)


def _make_backend(kind: str, request, workdir: Path) -> Backend:
    if kind == "sqlite":
        return _sqlite_backend(workdir)
    name, url = request.getfixturevalue("pg_database")
    return Backend("postgresql", url, ["--database-url", url], dbname=name)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, workdir) -> Iterator[Backend]:
    """Each test using this runs on SQLite and on PostgreSQL."""
    b = _make_backend(request.param, request, workdir)
    try:
        yield b
    finally:
        b.dispose()


@pytest.fixture
def pg_backend(request, workdir) -> Iterator[Backend]:
    """PostgreSQL only (for outage tests)."""
    b = _make_backend("postgresql", request, workdir)
    try:
        yield b
    finally:
        b.dispose()


class BrokerProcess:
    """`python -m exchange_broker serve` on an ephemeral port; stderr goes to ``log_path``."""

    _counter = 0

    def __init__(self, backend: Backend, workdir: Path, extra_args: list[str]) -> None:
        BrokerProcess._counter += 1
        n = BrokerProcess._counter
        self.backend = backend
        self.port_file = workdir / f"port-{n}"
        self.log_path = workdir / f"broker-{n}.log"
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.startup_seconds = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1",
               "--port", "0", "--port-file", str(self.port_file), "--heartbeat", "0",
               *self.backend.args, *self.extra_args]
        if "--admin-port" not in self.extra_args and serve_has_option("--admin-port"):
            cmd += ["--admin-port", "0"]  # never the default 15672 (a real RabbitMQ may be there)
        return cmd

    def start(self, timeout: float = START_TIMEOUT) -> "BrokerProcess":
        self.port_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXCHANGE_BROKER_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, cwd=str(REPO),
                                         env=env, start_new_session=True)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode} during start-up:\n"
                                   f"{self.log()[-4000:]}")
            try:
                raw = self.port_file.read_text().strip()
                if raw:
                    self.port = int(raw)
                    break
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker did not start within {timeout}s:\n{self.log()[-4000:]}")
            time.sleep(0.02)
        self.startup_seconds = time.monotonic() - t0
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 20.0, pump: Callable[[], None] | None = None) -> int:
        """Graceful stop (SIGTERM); returns the exit code.

        The broker sends connection.close to its clients and waits (up to 5 s) for close-ok:
        ``pump`` lets a blocking client in this thread answer meanwhile."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None:
                if time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"broker ignored SIGTERM for {timeout}s:\n{self.log()[-4000:]}")
                if pump is not None:
                    try:
                        pump()
                    except Exception:  # noqa: BLE001 - the client sees the close: stop pumping
                        pump = None
                else:
                    time.sleep(0.02)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, like a power cut for the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS line")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return True
            time.sleep(0.05)
        return needle in self.log()


BrokerFactory = Callable[..., BrokerProcess]


@pytest.fixture
def broker_factory(backend: Backend, workdir: Path) -> Iterator[BrokerFactory]:
    """``start(*extra_args)`` -> a running broker on this test's store; all killed at teardown."""
    yield from _factory(backend, workdir)


@pytest.fixture
def pg_broker_factory(pg_backend: Backend, workdir: Path) -> Iterator[BrokerFactory]:
    yield from _factory(pg_backend, workdir)


def _factory(backend: Backend, workdir: Path) -> Iterator[BrokerFactory]:
    started: list[BrokerProcess] = []

    def start(*extra_args: str) -> BrokerProcess:
        for p in started:  # one broker per store at a time
            assert not p.alive(), "a broker is still running on this store"
        p = BrokerProcess(backend, workdir, list(extra_args))
        started.append(p)
        return p.start()

    try:
        yield start
    finally:
        for p in started:
            p.kill()
        for p in started:  # shown by pytest only when the test failed
            print(f"----- {p.log_path.name} (exit {p.proc.returncode if p.proc else None}) -----")
            print(p.log()[-6000:])
