"""A real PostgreSQL primary with a streaming standby, made for one test: ``initdb`` and
``pg_basebackup -R`` as the ``postgres`` user (``runuser -u postgres --``) in a temp dir, on free
ports; ``close()`` stops both (``pg_ctl stop -m immediate``) and removes the dir. Replication is synchronous.

``url`` is the libpq multi-host URL a Patroni setup hands out, standby first
(``postgresql://postgres@127.0.0.1:<standby>,127.0.0.1:<primary>/broker?target_session_attrs=read-write``):
libpq skips the standby and, after :meth:`promote`, the old primary that is down."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from eb_support import steady_port, wait_until

DATABASE = "broker"


def pg_bindir() -> str | None:
    """The directory of initdb, pg_ctl and pg_basebackup of one PostgreSQL version (None: none here)."""
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(versions[-1]) if versions else None


class PgPair:
    def __init__(self) -> None:
        self.bindir = pg_bindir()
        if self.bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("needs PostgreSQL's server binaries and root (to run them as the postgres user)")
        self.dir = Path(tempfile.mkdtemp(prefix="eb-pg-pair-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.ports = {"primary": steady_port(), "standby": steady_port()}
        self.running: set[str] = set()

    # -- as the postgres user ---------------------------------------------------------------------------
    def run(self, tool: str, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bindir, tool), *args],
                              capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc.stdout

    def data(self, which: str) -> str:
        return str(self.dir / which)

    def start(self, which: str) -> None:
        self.run("pg_ctl", "-D", self.data(which), "-l", str(self.dir / f"{which}.log"), "-w", "-t", "60", "start")
        self.running.add(which)

    def stop(self, which: str, mode: str = "immediate") -> None:
        self.run("pg_ctl", "-D", self.data(which), "-m", mode, "-w", "stop")
        self.running.discard(which)

    def psql(self, which: str, sql: str) -> str:
        return self.run("psql", "-h", "127.0.0.1", "-p", str(self.ports[which]), "-U", "postgres", "-d",
                        "postgres", "-Atc", sql, timeout=30).strip()

    # -- the pair ---------------------------------------------------------------------------------------
    def setup(self) -> "PgPair":
        primary = self.data("primary")
        self.run("initdb", "-D", primary, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(os.path.join(primary, "postgresql.conf"), "a") as conf:
            conf.write(f"\nport = {self.ports['primary']}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.dir}'\nwal_level = replica\nmax_wal_senders = 5\n"
                       "hot_standby = on\nfsync = off\nsynchronous_commit = on\nshared_buffers = 32MB\n"
                       "max_connections = 200\nwal_keep_size = 64MB\n")
        self.start("primary")
        self.psql("primary", f"CREATE DATABASE {DATABASE}")
        standby = self.data("standby")
        self.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.ports["primary"]), "-U", "postgres",
                 "-D", standby, "-R", "-X", "stream", "-c", "fast")
        with open(os.path.join(standby, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"\nport = {self.ports['standby']}\n")
        self.start("standby")
        assert wait_until(lambda: self.psql("standby", "SELECT pg_is_in_recovery()") == "t", 30)
        # synchronous replication (Patroni's synchronous_mode): a commit, so a confirm, waits until
        # the standby has it, so a promotion loses no confirmed message
        self.psql("primary", "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.psql("primary", "SELECT pg_reload_conf()")
        assert wait_until(lambda: self.psql("primary", "SELECT sync_state FROM pg_stat_replication") == "sync", 30)
        return self

    def host(self, which: str) -> str:
        return f"127.0.0.1:{self.ports[which]}"

    @property
    def url(self) -> str:
        """Both servers, standby first: libpq connects to whichever is the primary."""
        return (f"postgresql://postgres@{self.host('standby')},{self.host('primary')}/{DATABASE}"
                f"?target_session_attrs=read-write")

    def url_through(self, hosts: list[str]) -> str:
        """The same URL through other ``host:port`` (proxies), in the same order."""
        return f"postgresql://postgres@{','.join(hosts)}/{DATABASE}?target_session_attrs=read-write"

    def promote(self) -> None:
        """The standby becomes the primary (as Patroni does after the primary's death)."""
        self.run("pg_ctl", "-D", self.data("standby"), "-w", "promote")

    def close(self) -> None:
        for which in list(self.running):
            try:
                self.stop(which)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
