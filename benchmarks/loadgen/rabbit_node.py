"""A private, throwaway RabbitMQ node for the yardstick (``--rabbit-private``).

The machine's RabbitMQ service may run with a low open-files limit (``ulimit -n 1024``), which
caps how many connections a benchmark can open to it. Instead of reconfiguring the service, this
starts the installed ``rabbitmq-server`` script directly, as the current user, with:

* ``RLIMIT_NOFILE`` raised to ``nofile`` (default 8192) in the child before it runs;
* its own node name (``ebbench-<pid>-<random>@localhost``) and free ports for AMQP and for Erlang
  distribution (never 5672, 15672 or 25672), both on 127.0.0.1 only;
* its own temporary directory holding everything it writes: the Mnesia base, the logs, an empty
  ``enabled_plugins`` list, its ``rabbitmq.conf`` (one listener), an empty ``rabbitmq-env.conf``
  (so /etc/rabbitmq's is not read) and ``HOME`` (a fresh Erlang cookie: the service's node, which
  shares the machine's epmd, cannot be reached with it and is never touched);
* its own session and process group, so Ctrl-C in the terminal does not reach it and ``stop()``
  can end every process it started (the script, beam.smp, erl_child_setup, inet_gethost).

``start()`` returns once the AMQP port accepts a guest login (guest may log in from loopback)
and the node's Erlang VM (beam.smp, a child of the script) is known, for /proc readings.
``stop()`` sends SIGTERM to the group (the node shuts down cleanly), SIGKILL after a grace
period, and removes the directory; it is called on every exit path (use ``with``).

epmd is shared: when none runs, the node starts one (``epmd -daemon``), which outlives it, as it
would for any Erlang node.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

from .brokers import free_port, port_open, tail
from .client import AMQPError, Connection

DEFAULT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
DEFAULT_NOFILE = 8192
RESERVED_PORTS = {4369, 5672, 15672, 25672, 35672}  # epmd, the service's AMQP/HTTP/dist, CLI


class RabbitNodeFailed(RuntimeError):
    pass


def find_server(path: str | None = None) -> str | None:
    """The rabbitmq-server script to run: ``path``, else the Debian package's, else PATH's."""
    for candidate in ([path] if path else [DEFAULT_SERVER, shutil.which("rabbitmq-server")]):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def add_args(g: argparse._ActionsContainer) -> None:
    """The command-line options of a private node (many_connections.py, compare.py)."""
    g.add_argument("--rabbit-private", action="store_true",
                   help="measure a private, throwaway RabbitMQ node started for this run "
                        "(the installed rabbitmq-server, its own node name, free ports, temp "
                        "dirs, open-files limit --rabbit-private-nofile) instead of the one at "
                        "--rabbit-host:--rabbit-port; stopped and removed at the end")
    g.add_argument("--rabbit-private-nofile", type=int, default=DEFAULT_NOFILE, metavar="N",
                   help=f"the private node's open-files limit (default {DEFAULT_NOFILE})")
    g.add_argument("--rabbit-server", default=None, metavar="PATH",
                   help=f"the rabbitmq-server script for --rabbit-private (default "
                        f"{DEFAULT_SERVER}, else rabbitmq-server on PATH)")
    g.add_argument("--rabbit-private-timeout", type=float, default=120.0, metavar="S",
                   help="seconds the private node may take to accept a login (default 120)")


def from_opts(opts) -> "PrivateRabbit":
    return PrivateRabbit(server=opts.rabbit_server, nofile=opts.rabbit_private_nofile,
                         startup_timeout=opts.rabbit_private_timeout,
                         user=getattr(opts, "rabbit_user", None) or opts.user,
                         password=getattr(opts, "rabbit_password", None) or opts.password)


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def find_beam(root: int) -> int | None:
    """The beam.smp process among ``root`` and its descendants (breadth first)."""
    todo, seen = [root], set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        if _comm(pid) == "beam.smp":
            return pid
        todo += _children(pid)
    return None


def _free_port() -> int:
    for _ in range(50):
        port = free_port("127.0.0.1")
        if port not in RESERVED_PORTS:
            return port
    raise RabbitNodeFailed("no free port found")


async def _try_login(host: str, port: int, user: str, password: str, timeout: float) -> dict:
    conn = Connection("private-rabbit-probe")
    try:
        await conn.open(host, port, user, password, "/", 0, timeout)
        props = dict(conn.server_properties)
        await conn.close(timeout)
        return props
    finally:
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.close()


class PrivateRabbit:
    """One throwaway RabbitMQ node; ``host``, ``port`` and ``pid`` (its beam.smp) after start."""

    def __init__(self, server: str | None = None, nofile: int = DEFAULT_NOFILE,
                 startup_timeout: float = 120.0, user: str = "guest",
                 password: str = "guest") -> None:
        self.server = find_server(server)
        self.server_asked = server
        self.nofile = nofile
        self.startup_timeout = startup_timeout
        self.user, self.password = user, password
        self.host = "127.0.0.1"
        self.port = self.dist_port = 0
        self.pid: int | None = None  # beam.smp
        self.proc: subprocess.Popen | None = None
        self.tmpdir: str | None = None
        self.node = f"ebbench-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost"
        self.version = ""
        self.epmd_was_running = True

    # ------------------------------------------------------------------ files
    def _write_files(self) -> dict[str, str]:
        d = self.tmpdir
        for sub in ("mnesia", "log", "home"):
            os.makedirs(os.path.join(d, sub))
        files = {"conf": os.path.join(d, "rabbitmq.conf"),
                 "env": os.path.join(d, "rabbitmq-env.conf"),
                 "plugins": os.path.join(d, "enabled_plugins")}
        with open(files["conf"], "w") as fh:
            fh.write(f"listeners.tcp.1 = {self.host}:{self.port}\n"
                     "loopback_users.guest = true\n"
                     "log.console = false\n")
        with open(files["env"], "w") as fh:
            fh.write("# empty: this node does not read /etc/rabbitmq/rabbitmq-env.conf\n")
        with open(files["plugins"], "w") as fh:
            fh.write("[].\n")
        return files

    def _env(self, files: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_")) and k not in ("HOME", "NOTIFY_SOCKET")}
        d = self.tmpdir
        env.update({
            "HOME": os.path.join(d, "home"),  # a fresh .erlang.cookie
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": files["env"],
            "RABBITMQ_CONFIG_FILE": files["conf"],
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(d, "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": files["plugins"],
            "RABBITMQ_MNESIA_BASE": os.path.join(d, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(d, "log"),
            "RABBITMQ_PID_FILE": os.path.join(d, "node.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        })
        return env

    def _limits(self) -> tuple[int, int]:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard >= self.nofile:
            return self.nofile, hard
        if os.geteuid() == 0:
            return self.nofile, self.nofile
        raise RabbitNodeFailed(f"--rabbit-private-nofile {self.nofile} is above this user's "
                               f"hard open-files limit {hard}")

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "PrivateRabbit":
        if not self.server:
            raise RabbitNodeFailed(
                f"rabbitmq-server not found: {self.server_asked} is not an executable file"
                if self.server_asked else
                f"rabbitmq-server not found (looked for {DEFAULT_SERVER} and on PATH)")
        limits = self._limits()
        self.tmpdir = tempfile.mkdtemp(prefix="eb-bench-rabbit-")
        try:
            self.port, self.dist_port = _free_port(), _free_port()
            while self.dist_port == self.port:
                self.dist_port = _free_port()
            files = self._write_files()
            self.epmd_was_running = port_open("127.0.0.1", 4369, 1.0)
            with open(self.log_path, "wb") as out:
                self.proc = subprocess.Popen(
                    [self.server], env=self._env(files), cwd=self.tmpdir,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limits))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def log_path(self) -> str:
        return os.path.join(self.tmpdir or "", "node.out")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while True:
            if self.proc.poll() is not None:
                raise RabbitNodeFailed(f"the private RabbitMQ node exited with "
                                       f"{self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RabbitNodeFailed(f"the private RabbitMQ node did not accept a login on "
                                       f"{self.host}:{self.port} within "
                                       f"{self.startup_timeout:g} s ({last}):\n{self.log_tail()}")
            if port_open(self.host, self.port, 0.5):
                try:
                    props = asyncio.run(_try_login(self.host, self.port, self.user,
                                                   self.password, 5.0))
                except (AMQPError, OSError, asyncio.TimeoutError) as exc:
                    last = str(exc) or type(exc).__name__
                else:
                    v = props.get("version", b"")
                    self.version = v.decode() if isinstance(v, bytes) else str(v)
                    self.pid = find_beam(self.proc.pid)
                    if self.pid:
                        return
                    last = "logged in, but no beam.smp under the script"
            time.sleep(0.25)

    def stop(self, grace: float = 30.0) -> None:
        """End every process of the node's group (SIGTERM, then SIGKILL) and remove its files.
        Safe to call more than once and on a node that never started."""
        proc, self.proc = self.proc, None
        if proc is not None:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C: finish this
            try:
                self._end_group(proc, grace)
            finally:
                signal.signal(signal.SIGINT, previous)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def _end_group(self, proc: subprocess.Popen, grace: float) -> None:
        beam = self.pid or find_beam(proc.pid)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if proc.poll() is not None and not (beam and alive(beam)) \
                        and not _group_alive(proc.pid):
                    return
                time.sleep(0.1)
        proc.poll()

    def open_files_limit(self) -> int | None:
        from .procs import open_files_limit
        return open_files_limit(self.pid) if self.pid else None

    def describe(self) -> str:
        return (f"private RabbitMQ {self.version} node {self.node} on {self.host}:{self.port} "
                f"(dist port {self.dist_port}, beam.smp pid {self.pid}, open files "
                f"{self.open_files_limit()}, dir {self.tmpdir})")

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines) if self.tmpdir else "(no log)"

    def __enter__(self) -> "PrivateRabbit":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group ``pgid``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
