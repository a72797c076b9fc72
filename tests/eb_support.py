"""Test scaffolding shared by every test directory (import it as ``eb_support``).

tests/conftest.py puts tests/ on sys.path (pytest's default "prepend" import mode), so
``import eb_support`` works from any test module, conftest or per-directory helper module.
Fixtures built on these helpers (``connect``, ``workdir``, ``spawn_broker``, ``pg_database``)
live in tests/conftest.py.

- names and waiting: ``uniq``, ``wait_until``, ``free_port``
- pika: ``pika_connect``, ``close_quietly``
- ``RawClient``: AMQP 0-9-1 over a plain socket, framed by pamqp
- ``SubprocessBroker``: the real ``python -m exchange_broker serve`` as a child process
- PostgreSQL: ``pg_admin_engine``, ``pg_reachable``, ``create_pg_database``,
  ``drop_pg_database``, ``table_names``
- Node.js: ``node_with_amqplib`` (amqplib installed once into tests/interop/node)
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Sequence

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.exceptions import UnmarshalingException
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url

REPO = Path(__file__).resolve().parents[1]
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


# -- names and waiting ---------------------------------------------------------------------------

def uniq(prefix: str = "q") -> str:
    """A name no other test uses: ``prefix-<8 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy or ``timeout`` passes; returns its
    last value (so ``assert wait_until(...)`` fails when it never held)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (for listeners that cannot take port 0), below Linux's
    ephemeral range (32768-60999): a port the kernel handed out for ``bind(0)`` and released is
    soon given to some outgoing connection of the busy suite (thousands of connections a minute),
    and a broker started on it meanwhile fails with "address already in use"."""
    return steady_port()


def _port_slice() -> tuple[int, int]:
    """This process's share of 20000-32000: each pytest-xdist worker draws from its own slice, so
    two workers never pick the same port in the moment between the pick and the broker's bind (CI
    once saw a node's admin port taken that way)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        return 20000, 32000
    width = 12000 // int(count)
    low = 20000 + (int(worker[2:]) % int(count)) * width
    return low, low + width


_steady_ports: set[int] = set()  # handed out by this process: two nodes (or a node's two listeners) never share one


def steady_port() -> int:
    """A free port below Linux's ephemeral range, for a listener that restarts on the same port:
    while it is down, no outgoing connection can be given its number. Never one this process handed
    out before: a node's AMQP and admin ports are both free until it starts (once both were the
    same, and the admin listener could not bind)."""
    import random
    low, high = _port_slice()
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _steady_ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _steady_ports.add(port)
        return port
    with socket.socket() as sock:  # the range is crowded: any port the kernel gives
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- pika ----------------------------------------------------------------------------------------

def pika_connect(port: int, *, vhost: str = "/", user: str = "guest", password: str = "guest",
                 **params) -> pika.BlockingConnection:
    """A pika BlockingConnection to 127.0.0.1:``port``: no heartbeats, a 30 s
    blocked-connection timeout; ``params`` are further (or overriding) ConnectionParameters."""
    params.setdefault("heartbeat", 0)
    params.setdefault("blocked_connection_timeout", 30)
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), **params))


def close_quietly(*conns) -> None:
    """Close pika connections that may be closed or broken already (None is skipped)."""
    for conn in conns:
        try:
            if conn is not None and conn.is_open:
                conn.close()
        except Exception:  # noqa: BLE001 - the broker may be gone already
            pass


# -- a raw AMQP client -----------------------------------------------------------------------------

class RawClient:
    """AMQP 0-9-1 over a plain socket, framed by pamqp: for what pika and aio-pika hide (delivery
    tags, multiple flags, server-named tags, frame sizes) and for misbehaving on purpose.

    ``RawClient(port)`` logs in as guest and opens vhost "/" (keyword arguments go to
    ``handshake``); ``open_channel=n`` opens channel n as well. ``handshake=False`` leaves the
    handshake to the caller, e.g. to look at the broker's answer to a refused login.

    Reading: ``read_frame`` gives (channel, frame) or None once the broker closed the socket;
    ``next`` the same without heartbeats, failing on a closed socket; ``expect(cls)`` reads
    until a frame of ``cls`` (skipping others); ``expect_next(cls)`` asserts that the next frame
    (heartbeats aside) is one. ``timeout`` (seconds, per read) defaults to the client's own.
    """

    def __init__(self, port: int, *, handshake: bool = True, open_channel: int = 0,
                 timeout: float = 10.0, **login) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.sizes: list[tuple[int, int]] = []  # (frame type, whole frame size) of every frame read
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None
        self.opened = None  # the broker's answer to connection.open (see handshake)
        if handshake:
            reply = self.handshake(**login)
            assert isinstance(reply, commands.Connection.OpenOk), f"handshake failed: {reply!r}"
            if open_channel:
                self.send(open_channel, commands.Channel.Open())
                self.expect_next(commands.Channel.OpenOk, channel=open_channel)

    def handshake(self, *, user: str = "guest", password: str = "guest", vhost: str = "/",
                  mechanism: str = "PLAIN", response: str | None = None,
                  client_properties: dict | None = None, channel_max: int = 0, frame_max: int = 0,
                  heartbeat: int = 0, protocol_header: bytes = PROTOCOL_HEADER):
        """Protocol header to connection.open. ``channel_max``/``frame_max`` 0 accept the broker's.

        Returns the broker's answer to connection.open (OpenOk, or a Connection.Close), the
        Connection.Close that came instead of connection.tune (a refused login; ``self.tune``
        stays None), or None when the broker closed the socket."""
        self.sock.sendall(protocol_header)
        self.start = self.expect_next(commands.Connection.Start)
        if client_properties is None:  # as real clients do; else a bad login is just dropped
            client_properties = {"product": "exchange-broker tests",
                                 "capabilities": {"authentication_failure_close": True}}
        self.send(0, commands.Connection.StartOk(
            client_properties=client_properties, mechanism=mechanism,
            response=f"\0{user}\0{password}" if response is None else response))
        tune = self._next_or_none()
        if not isinstance(tune, commands.Connection.Tune):
            self.opened = tune
            return tune
        self.tune = tune
        self.send(0, commands.Connection.TuneOk(channel_max or tune.channel_max,
                                                frame_max or tune.frame_max, heartbeat),
                  commands.Connection.Open(vhost))
        self.opened = self._next_or_none()
        return self.opened

    # -- writing -----------------------------------------------------------------------------------
    def send(self, channel: int, *frames) -> None:
        """Marshal ``frames`` (methods, content headers, bodies) on ``channel``; one write."""
        self.sock.sendall(b"".join(pframe.marshal(f, channel) for f in frames))

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (the broker may already have closed on us: ignored)."""
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: commands.Basic.Properties | None = None) -> None:
        """basic.publish with its content header and the body in one frame."""
        self.send(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
                  pheader.ContentHeader(0, len(body), properties or commands.Basic.Properties()),
                  pbody.ContentBody(body))

    # -- reading -----------------------------------------------------------------------------------
    def read_frame(self, timeout: float | None = None):
        """The next (channel, frame), heartbeats included; None once the broker closed the socket.
        Raises socket.timeout when nothing complete arrives within ``timeout``."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        while True:
            try:
                n, channel, frame = pframe.unmarshal(self.buf)
            except UnmarshalingException:
                try:
                    data = self.sock.recv(65536)
                except ConnectionError:
                    return None
                if not data:
                    return None
                self.buf += data
                continue
            self.sizes.append((self.buf[0], n))
            self.buf = self.buf[n:]
            return channel, frame

    def _next_or_none(self, timeout: float | None = None):
        """The next frame other than a heartbeat, or None once the broker closed the socket."""
        while True:
            got = self.read_frame(timeout)
            if got is None or not isinstance(got[1], pheartbeat.Heartbeat):
                return None if got is None else got[1]

    def next(self, timeout: float | None = None):
        """The next (channel, frame) other than a heartbeat; the socket must still be open."""
        while True:
            got = self.read_frame(timeout)
            assert got is not None, "connection closed by the broker"
            if not isinstance(got[1], pheartbeat.Heartbeat):
                return got

    def expect(self, cls, timeout: float | None = None):
        """Read until a frame of ``cls`` (a class or a tuple of them); others are skipped."""
        while True:
            got = self.read_frame(timeout)
            assert got is not None, f"socket closed while waiting for {_names(cls)}"
            if isinstance(got[1], cls):
                return got[1]

    def expect_next(self, cls, *, channel: int | None = None, timeout: float | None = None):
        """The next frame (heartbeats aside) must be of ``cls`` (and on ``channel``, if given)."""
        got = self.next(timeout)
        assert isinstance(got[1], cls), f"expected {_names(cls)}, got {got}"
        if channel is not None:
            assert got[0] == channel, got
        return got[1]

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes the socket within ``timeout`` (data before EOF is read
        and dropped)."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionError:
                return True
            if not data:
                return True
        return False

    # -- closing -----------------------------------------------------------------------------------
    def close_connection(self) -> None:
        """The polite way out: connection.close, wait for close-ok, close the socket."""
        try:
            self.send(0, commands.Connection.Close(200, "bye", 0, 0))
            self.expect(commands.Connection.CloseOk)
        finally:
            self.close()

    def close(self) -> None:
        """Just close the socket (no connection.close)."""
        try:
            self.sock.close()
        except OSError:
            pass


def _names(cls) -> str:
    classes = cls if isinstance(cls, tuple) else (cls,)
    return " or ".join(c.__name__ for c in classes)


# -- the broker as a subprocess -----------------------------------------------------------------

def subprocess_env(extra: dict | None = None) -> dict[str, str]:
    """Environment for ``python -m exchange_broker ...`` children: this checkout on PYTHONPATH and
    no inherited EXCHANGE_BROKER_* settings (only the command line and ``extra`` decide)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXCHANGE_BROKER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


class SubprocessBroker:
    """``python -m exchange_broker serve`` as a child process on an ephemeral AMQP port, no
    heartbeats and the admin API off; ``args`` (the store, e.g. ``--data-dir D`` or
    ``--database-url U``, and other options) come after those defaults and so override them.
    ``env`` is added to ``subprocess_env()``.

    Every ``start`` writes its own port file and log (the broker's stderr) in ``workdir``;
    ``start`` again after ``kill``/``terminate`` restarts on the same store."""

    _ids = itertools.count(1)  # unique file names across instances sharing a workdir

    def __init__(self, workdir: Path, args: Sequence[str] = (), *, env: dict | None = None) -> None:
        self.workdir = Path(workdir)
        self.args = list(args)
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path: Path | None = None
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self, port_file: Path, *extra: str) -> list[str]:
        store: list[str] = []
        given = {a.split("=", 1)[0] for a in (*self.args, *extra)}
        if not given & {"--data-dir", "--database-url", "--in-memory"}:
            store = ["--data-dir", str(self.workdir / "data")]  # never the user's default store
        return [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1",
                "--port", "0", "--port-file", str(port_file), "--heartbeat", "0",
                "--admin-port", "0",  # never the default 15672 (a real RabbitMQ may be there)
                *store, *self.args, *extra]

    def start(self, *extra: str, timeout: float = 30.0) -> "SubprocessBroker":
        """Start (``extra``: options for this start only) and wait for the port file."""
        assert not self.alive(), "already running"
        n = next(self._ids)
        port_file = self.workdir / f"port-{n}"
        self.log_path = self.workdir / f"broker-{n}.log"
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(port_file, *extra), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, cwd=str(REPO),
                                         env=subprocess_env(self.env), start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode} during start-up:\n"
                                   f"{self.log()[-4000:]}")
            try:
                written = port_file.read_text().strip()
                if written:
                    self.port = int(written)
                    break
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() > t0 + timeout:
                self.kill()
                raise RuntimeError(f"broker did not start within {timeout}s:\n{self.log()[-4000:]}")
            time.sleep(0.02)
        self.startup_seconds = time.monotonic() - t0
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, like a power cut for the process."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

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

    def log(self) -> str:
        """The log of the latest start ("" before the first)."""
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except FileNotFoundError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 10.0) -> bool:
        return bool(wait_until(lambda: needle in self.log(), timeout, interval=0.05))

    def rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS line")


# -- PostgreSQL ---------------------------------------------------------------------------------

PG_ADMIN_URL = os.environ.get("EB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_pg_admin: Engine | None = None
_pg_error: str | None = None


def pg_reachable() -> bool:
    """Whether PostgreSQL answers at PG_ADMIN_URL (tried once per run, then remembered)."""
    global _pg_admin, _pg_error
    if _pg_admin is None and _pg_error is None:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT",
                               connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            _pg_admin = engine
        except Exception as exc:  # noqa: BLE001 - any failure means "no PostgreSQL here"
            engine.dispose()
            _pg_error = f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc.__class__.__name__}: {exc}"
    return _pg_admin is not None


def pg_admin_engine() -> Engine:
    """Autocommit engine on the maintenance database; skips the test if PostgreSQL is unreachable."""
    if not pg_reachable():
        pytest.skip(_pg_error or "PostgreSQL unreachable")
    return _pg_admin


def dispose_pg_admin() -> None:
    global _pg_admin
    if _pg_admin is not None:
        _pg_admin.dispose()
        _pg_admin = None


def create_pg_database(prefix: str = "eb_test") -> tuple[str, str]:
    """A new empty database: (name, SQLAlchemy URL). Skips if PostgreSQL is unreachable."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with pg_admin_engine().connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    return name, make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(name: str) -> None:
    """DROP ... WITH (FORCE): whoever is still connected is thrown out."""
    with pg_admin_engine().connect() as conn:
        # an outage test may have left the database refusing connections
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def table_names(url: str) -> set[str]:
    """The tables of the database at ``url``, without alembic's bookkeeping table."""
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


# -- Node.js -----------------------------------------------------------------------------------------

NODE_DIR = REPO / "tests" / "interop" / "node"


def node_with_amqplib() -> str:
    """The path of ``node``, with amqplib installed in tests/interop/node (see ``node_with``)."""
    return node_with(NODE_DIR, "amqplib", "the amqplib tests")


def node_with(node_dir: Path, package: str, purpose: str) -> str:
    """The path of ``node``, with ``package`` installed in ``node_dir`` (``npm ci`` from its
    package-lock.json on first use). Skips the test when node/npm are missing or npm fails (the
    registry unreachable). An exclusive lock on a file beside node_modules makes test processes
    running side by side (pytest-xdist workers) install it once, one after the other."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"node and npm are needed for {purpose} (not on PATH)")
    with open(node_dir / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not (node_dir / "node_modules" / package / "package.json").exists():
            try:
                proc = subprocess.run([npm, "ci", "--silent", "--no-audit", "--no-fund"], cwd=node_dir,
                                      capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                pytest.skip("`npm ci` timed out (npm registry unreachable?)")
            if proc.returncode != 0:
                pytest.skip(f"`npm ci` failed with exit code {proc.returncode} (npm registry "
                            f"unreachable?): {(proc.stderr or proc.stdout).strip()[-500:]}")
    return node
