"""`exchange-broker serve` that cannot start says why in ONE line on stderr, exit code 1, never a
traceback: a bad database URL, a database that does not exist or cannot be reached, a data
directory it cannot use, a port out of range, a port (AMQP or admin) already in use."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from eb_support import free_port, pg_admin_engine, subprocess_env

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO ")  # progress logged before the failure


def serve(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1",
                           "--heartbeat", "0", "--admin-port", "0", *args],
                          cwd=str(cwd), env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def the_error(proc: subprocess.CompletedProcess, *, alone: bool = True) -> str:
    """The one error line (``alone``: and nothing else on stderr)."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if not LOG_LINE.match(line)]
    assert len(errors) == 1, proc.stderr
    if alone:
        assert len(lines) == 1, proc.stderr
    assert proc.stdout == ""
    return errors[0]


@pytest.mark.parametrize("url, expected", [
    ("notaurl", "--database-url is not a database URL (expected postgresql://"),
    ("postgresql://postgres@127.0.0.1:notaport/db", "--database-url is not a database URL"),
    ("mysql://root@127.0.0.1/broker", "--database-url: unsupported database 'mysql'"),
    ("postgresql+psycopg2://postgres@127.0.0.1/broker", "the PostgreSQL driver 'psycopg2' is not supported"),
    ("sqlite+aiosqlite:////tmp/x.db", "the SQLite driver 'aiosqlite' is not supported"),
])
def test_bad_or_unsupported_database_url(tmp_path, url, expected):
    line = the_error(serve("--port", "0", "--database-url", url, cwd=tmp_path))
    assert line.startswith("exchange-broker serve: error: ") and expected in line


def test_a_password_in_a_bad_url_is_not_printed(tmp_path):
    line = the_error(serve("--port", "0", "--database-url", "oracle://scott:tiger-secret@db/x", cwd=tmp_path))
    assert "tiger-secret" not in line and "unsupported database 'oracle'" in line


def test_postgres_database_that_does_not_exist(tmp_path):
    pg_admin_engine()  # skips without PostgreSQL
    url = "postgres://postgres@127.0.0.1:5432/eb_no_such_database_here"
    line = the_error(serve("--port", "0", "--database-url", url, cwd=tmp_path))
    assert line.startswith("exchange-broker: cannot start: cannot open the store postgresql+psycopg://")
    assert 'database "eb_no_such_database_here" does not exist' in line


def test_postgres_server_that_cannot_be_reached(tmp_path):
    port = free_port()  # nothing listens there
    line = the_error(serve("--port", "0", "--database-url", f"postgresql://u:secret@127.0.0.1:{port}/db",
                           cwd=tmp_path))
    assert line.startswith(f"exchange-broker: cannot start: cannot open the store "
                           f"postgresql+psycopg://u:***@127.0.0.1:{port}/db: ")
    assert "refused" in line.lower() and "secret" not in line


def test_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("not a directory")
    line = the_error(serve("--port", "0", "--data-dir", str(tmp_path / "taken"), cwd=tmp_path))
    assert line == f"exchange-broker: cannot start: the data directory {tmp_path / 'taken'} is not a directory"
    line = the_error(serve("--port", "0", "--data-dir", str(tmp_path / "taken" / "sub"), cwd=tmp_path))
    assert line == (f"exchange-broker: cannot start: cannot create the data directory "
                    f"{tmp_path / 'taken' / 'sub'}: Not a directory")


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory this process cannot create files in: mode 0555, or (as root, whom modes do not
    stop) the immutable attribute."""
    d = tmp_path / "readonly"
    d.mkdir()
    undo = None
    if os.geteuid() != 0:
        d.chmod(0o555)
        undo = lambda: d.chmod(0o755)  # noqa: E731
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0:
        undo = lambda: subprocess.run(["chattr", "-i", str(d)], check=True)  # noqa: E731
    try:
        try:
            (d / "probe").write_text("")
        except OSError:
            pass
        else:
            pytest.skip("cannot make a directory unwritable here")
        yield d
    finally:
        if undo is not None:
            undo()


def test_data_dir_that_is_not_writable(tmp_path, unwritable_dir):
    line = the_error(serve("--port", "0", "--data-dir", str(unwritable_dir), cwd=tmp_path))
    assert line.startswith(f"exchange-broker: cannot start: the data directory {unwritable_dir} is not writable: ")
    line = the_error(serve("--port", "0", "--data-dir", str(unwritable_dir / "sub"), cwd=tmp_path))
    assert line.startswith(f"exchange-broker: cannot start: cannot create the data directory "
                           f"{unwritable_dir / 'sub'}: ")


@pytest.mark.parametrize("flag, value", [("--port", "70000"), ("--port", "-1"), ("--admin-port", "65536"),
                                         ("--tls-port", "100000")])
def test_port_out_of_range(tmp_path, flag, value):
    line = the_error(serve("--in-memory", "--port", "0", flag, value, cwd=tmp_path))
    assert line == f"exchange-broker serve: error: {flag} must be a port number (0-65535), not {value}"


def test_an_option_that_is_not_a_number_is_one_line_too(tmp_path):
    proc = serve("--in-memory", "--port", "abc", cwd=tmp_path)
    assert proc.returncode == 2  # a usage error, as argparse has it
    assert proc.stderr.strip().splitlines() == [
        "exchange-broker serve: error: argument --port: invalid int value: 'abc' (see exchange-broker serve --help)"]


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_amqp_port_in_use_is_said_once(tmp_path, busy_port):
    line = the_error(serve("--in-memory", "--port", str(busy_port), cwd=tmp_path))
    assert line == f"exchange-broker: cannot start: cannot listen on 127.0.0.1:{busy_port} for AMQP: address already in use"
    # with a store opened first: progress lines, then the error printed once (not logged as well)
    proc = serve("--data-dir", str(tmp_path / "data"), "--port", str(busy_port), cwd=tmp_path)
    the_error(proc, alone=False)
    assert proc.stderr.count("address already in use") == 1
    assert (tmp_path / "data" / "broker.db.lock").read_text() == ""  # the store was closed and unlocked


def test_admin_port_in_use_fails_the_start(tmp_path, busy_port):
    data = tmp_path / "data"
    proc = serve("--data-dir", str(data), "--port", "0", "--admin-host", "127.0.0.1",
                 "--admin-port", str(busy_port), cwd=tmp_path)
    line = the_error(proc, alone=False)
    assert line == (f"exchange-broker: cannot start: cannot listen on 127.0.0.1:{busy_port} for the admin API: "
                    f"address already in use")
    assert proc.stderr.count("address already in use") == 1
    # what was opened before was closed: the store's lock was released, the store opens again
    assert (data / "broker.db.lock").read_text() == ""
    again = serve("--data-dir", str(data), "--port", "0", "--admin-port", str(busy_port), cwd=tmp_path)
    assert "for the admin API" in the_error(again, alone=False)


def test_a_listen_address_that_does_not_resolve(tmp_path):
    line = the_error(serve("--in-memory", "--port", "0", "--host", "no-such-host.invalid", cwd=tmp_path))
    assert line.startswith("exchange-broker: cannot start: cannot listen on no-such-host.invalid:0 for AMQP: ")
    proc = serve("--in-memory", "--port", "0", "--admin-host", "no-such-host.invalid",
                 "--admin-port", str(free_port()), cwd=tmp_path)
    assert the_error(proc, alone=False).startswith(
        "exchange-broker: cannot start: cannot listen on no-such-host.invalid:")
    assert "for the admin API: " in proc.stderr and "while attempting" not in proc.stderr
