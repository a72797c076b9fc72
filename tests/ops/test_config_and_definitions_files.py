"""`serve --config FILE` (TOML or RabbitMQ's rabbitmq.conf keys) and `serve --load-definitions FILE`
(RabbitMQ's load_definitions): a real broker process started from files, reached with pika; bad
files: one line on stderr, exit 1."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from eb_support import free_port, subprocess_env, wait_until
from exchange_broker.config_file import ConfigFileError, load
from test_startup_errors import serve, the_error

DEFINITIONS = {
    "users": [{"name": "app", "password": "s3cret", "tags": ""}],
    "vhosts": [{"name": "orders"}],
    "permissions": [{"user": "app", "vhost": "orders", "configure": ".*", "write": ".*", "read": ".*"}],
    "exchanges": [{"name": "ring", "vhost": "orders", "type": "x-consistent-hash", "durable": True,
                   "auto_delete": False, "internal": False, "arguments": {}}],
    "queues": [{"name": "work", "vhost": "orders", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "quorum"}}],
    "bindings": [{"source": "ring", "vhost": "orders", "destination": "work", "destination_type": "queue",
                  "routing_key": "10", "arguments": {}}],
}


def start(cwd: Path, *args: str) -> tuple[subprocess.Popen, Path, int]:
    """`serve` with ``args`` (the port comes from them or from the config file) and a port file."""
    port_file = cwd / "port"
    log = cwd / "broker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "exchange_broker", "serve", "--port-file", str(port_file),
                                 "--data-dir", str(cwd / "data"), *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=fh, env=subprocess_env(), cwd=str(cwd),
                                start_new_session=True)
    assert wait_until(lambda: proc.poll() is not None or (port_file.exists() and port_file.read_text()), 30), \
        log.read_text()
    assert proc.poll() is None, log.read_text()
    return proc, log, int(port_file.read_text())


@pytest.fixture
def broker_files(tmp_path):
    procs = []

    def _start(*args):
        proc, log, port = start(tmp_path, *args)
        procs.append(proc)
        return log, port

    yield _start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def tuned(port: int, **params) -> tuple[pika.BlockingConnection, dict]:
    """A pika connection and what the broker offered in connection.tune (heartbeat, frame_max)."""
    offered = {}

    def heartbeat(conn, server_value):
        offered["heartbeat"] = server_value
        return server_value

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=heartbeat, **params))
    offered["frame_max"] = conn._impl.params.frame_max
    return conn, offered


def test_rabbitmq_conf_with_load_definitions(tmp_path, broker_files):
    port = free_port()
    (tmp_path / "defs.json").write_text(json.dumps(DEFINITIONS))
    (tmp_path / "rabbitmq.conf").write_text(
        "# as a container ships it\n"
        f"listeners.tcp.default = 127.0.0.1:{port}\n"
        "default_user = boss\ndefault_pass = b0ss\n"
        "heartbeat = 17\n"
        "frame_max = 65536\n"
        "management.tcp.port = 0\n"
        "vm_memory_high_watermark.relative = 0.6\n"
        "disk_free_limit.absolute = 1MB\n"
        f"load_definitions = {tmp_path / 'defs.json'}\n"
        "cluster_formation.peer_discovery_backend = classic_config\n")
    log, bound = broker_files("--config", str(tmp_path / "rabbitmq.conf"))
    assert bound == port
    assert wait_until(lambda: "exchange-broker ready" in log.read_text(), 20)
    text = log.read_text()
    assert "'cluster_formation.peer_discovery_backend' is not a setting of exchange-broker; ignored" in text
    # the definitions were in place before the listener took anyone
    assert text.index("definitions imported from") < text.index("exchange-broker ready")
    conn, offered = tuned(port, virtual_host="orders", credentials=pika.PlainCredentials("app", "s3cret"))
    try:
        assert offered == {"heartbeat": 17, "frame_max": 65536}
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("ring", "any-key", b"hello")
        assert wait_until(lambda: ch.queue_declare("work", durable=True, passive=True,
                                                   arguments={"x-queue-type": "quorum"}).method.message_count == 1)
    finally:
        conn.close()
    boss = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, "/",
                                                             pika.PlainCredentials("boss", "b0ss")))
    boss.close()


def test_toml_config_and_flags_win(tmp_path, broker_files):
    (tmp_path / "broker.toml").write_text(
        'host = "127.0.0.1"\nport = 0\nheartbeat = 45\nframe-max = 32768\nadmin_port = 0\n')
    _, port = broker_files("--config", str(tmp_path / "broker.toml"), "--heartbeat", "9")
    conn, offered = tuned(port)
    try:
        assert offered["heartbeat"] == 9          # the flag beats the file
        assert offered["frame_max"] == 32768      # the file beats the default
    finally:
        conn.close()


@pytest.mark.parametrize("name, text, expected", [
    ("b.toml", "port = 0\nheartbeats = 3\n", "unknown setting 'heartbeats'"),
    ("b.toml", "port = 0\nheartbeat = \"often\"\n", "bad value for 'heartbeat'"),
    ("b.toml", "port = [\n", "not valid TOML"),
    ("b.conf", "heartbeat = 10\nthis line has no equals sign\n", "line 2: expected 'key = value'"),
    ("b.conf", "frame_max = big\n", "line 1: bad value for 'frame_max'"),
    ("b.conf", "ssl_options.verify = maybe\n", "bad value for 'ssl_options.verify'"),
])
def test_bad_config_file_is_one_line(tmp_path, name, text, expected):
    (tmp_path / name).write_text(text)
    line = the_error(serve("--config", str(tmp_path / name), cwd=tmp_path))
    assert line.startswith("exchange-broker serve: error: --config ") and expected in line


def test_out_of_range_value_from_a_file_names_the_setting(tmp_path):
    (tmp_path / "r.conf").write_text("channel_max = 70000\n")
    line = the_error(serve("--port", "0", "--config", str(tmp_path / "r.conf"), cwd=tmp_path))
    assert "--channel-max must be a whole number" in line


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not valid JSON"),
    (json.dumps({"queues": [{"name": "q", "vhost": "nowhere", "durable": True, "auto_delete": False,
                             "arguments": {}}]}), "no_such_vhost"),
    (json.dumps({"queues": [{"name": "q", "vhost": "/", "durable": True, "auto_delete": False,
                             "arguments": {"x-max-length": "lots"}}]}), "x-max-length"),
])
def test_bad_definitions_file_stops_the_start(tmp_path, content, expected):
    (tmp_path / "defs.json").write_text(content)
    line = the_error(serve("--port", "0", "--data-dir", str(tmp_path / "d"), "--load-definitions",
                           str(tmp_path / "defs.json"), cwd=tmp_path), alone=False)
    assert line.startswith("exchange-broker: cannot start: --load-definitions ") and expected in line


def test_missing_definitions_file(tmp_path):
    line = the_error(serve("--port", "0", "--in-memory", "--load-definitions", str(tmp_path / "none.json"),
                           cwd=tmp_path), alone=False)
    assert "No such file or directory" in line


def test_rabbitmq_conf_mapping_sans_io(tmp_path):
    path = tmp_path / "rabbitmq.conf"
    path.write_text("listeners.tcp.default = [::1]:5673\nssl_options.verify = verify_peer\n"
                    "ssl_options.fail_if_no_peer_cert = true\nhandshake_timeout = 2500\n"
                    "connection_max = infinity\nlog.console.level = warning  # quiet\n"
                    "vm_memory_high_watermark.absolute = 2GB\nloopback_users.guest = false\n")
    values, ignored = load(str(path))
    assert values == {"host": "::1", "port": 5673, "tls_verify_peer": True, "tls_fail_if_no_peer_cert": True,
                      "handshake_timeout": 2.5, "max_connections": 0, "log_level": "WARNING",
                      "memory_high_watermark": "2GB"}
    assert ignored == ["loopback_users.guest"]
    with pytest.raises(ConfigFileError, match="bad value for 'port'"):
        (tmp_path / "c.toml").write_text("port = 1.5\n")
        load(str(tmp_path / "c.toml"))
