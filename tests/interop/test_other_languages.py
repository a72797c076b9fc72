"""Clients in other languages, as Debian packages them, against the broker on a free port: Perl's
AnyEvent::RabbitMQ and Mojo::RabbitMQ::Client, rabbitmq-c's amqp-tools, Ruby's Bunny, PHP's php-amqplib, Go's amqp091-go and
RabbitMQ's Java client, and Mono's RabbitMQ.Client (.NET, over AMQP 0-8 and 0-9). Each script in tests/interop/clients/ connects, declares, publishes (with
confirms where the client has them), consumes and acks, and prints what it saw; the same scripts
print the same against RabbitMQ 3.10. Skipped, with the reason, when the language or the client
package is missing (.ci/run installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from eb_support import uniq

CLIENTS = Path(__file__).parent / "clients"


def _run(cmd: list[str], timeout: float = 120, cwd: Path | None = None, env: dict | None = None) -> list[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return lines


def _need(tool: str, what: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is needed for the {what} test (not on PATH)")
    return path


def _need_library(interpreter: str, check: list[str], what: str, package: str) -> str:
    """The interpreter's path, once ``interpreter *check`` shows the client library loads."""
    path = _need(interpreter, what)
    if subprocess.run([path, *check], capture_output=True).returncode:
        pytest.skip(f"{what} is not installed (Debian: {package})")
    return path


def _expect_roundtrip(lines: list[str], queue: str, word: str) -> None:
    """What every client script prints: connected, declared, confirmed, three deliveries, deleted."""
    assert lines[0] == "connected exchange-broker"
    assert lines[1] == f"declared {queue} 0 0"
    assert lines[2] in ("confirmed 3", "confirmed true")
    assert lines[3:6] == [f"got {word} {i} text/plain n={i}" for i in (1, 2, 3)]
    assert lines[6:] == ["deleted 0", "ok"]


def test_perl_anyevent_rabbitmq(broker):
    # Net::AMQP opens with AMQP 0-9's protocol header (tests/compat/test_protocol_0_9.py)
    perl = _need_library("perl", ["-MAnyEvent::RabbitMQ", "-e1"], "AnyEvent::RabbitMQ", "libanyevent-rabbitmq-perl")
    queue = uniq("perl")
    lines = _run([perl, str(CLIENTS / "anyevent_rabbitmq.pl"), "127.0.0.1", str(broker.port), queue])
    assert lines[:2] == ["connected exchange-broker", f"declared {queue}"]
    assert lines[-2:] == ["deleted", "ok"]
    # confirms and deliveries interleave as they arrive; each kind in its own order
    assert [x for x in lines if x.startswith("confirmed")] == [f"confirmed {i}" for i in (1, 2, 3)]
    assert [x for x in lines if x.startswith("got")] == [f"got perl {i} text/plain n={i}" for i in (1, 2, 3)]
    assert len(lines) == 10


def test_perl_mojo_rabbitmq_client(broker):
    # Net::AMQP again (AMQP 0-9's header); this client has no publisher confirms
    perl = _need_library("perl", ["-MMojo::RabbitMQ::Client", "-e1"], "Mojo::RabbitMQ::Client",
                         "libmojo-rabbitmq-client-perl")
    queue = uniq("mojo")
    lines = _run([perl, str(CLIENTS / "mojo_rabbitmq.pl"), "127.0.0.1", str(broker.port), queue])
    assert lines == ["connected", f"declared {queue}"] + [f"published {i}" for i in (1, 2, 3)] + \
        [f"got mojo {i} text/plain n={i}" for i in (1, 2, 3)] + ["deleted", "ok"]


def test_c_amqp_tools(broker):
    # rabbitmq-c's command-line tools (Debian: amqp-tools)
    _need("amqp-publish", "amqp-tools (rabbitmq-c)")
    url = ["--url", f"amqp://guest:guest@127.0.0.1:{broker.port}"]
    queue = uniq("tools")
    assert _run(["amqp-declare-queue", *url, "-q", queue, "-d"]) == [queue]
    for i in (1, 2, 3):
        _run(["amqp-publish", *url, "-r", queue, "-p", "-C", "text/plain", "-H", f"n: {i}", "-b", f"c {i}"])
    assert _run(["amqp-get", *url, "-q", queue]) == ["c 1"]
    # amqp-consume runs the command per message and acks it when the command succeeds
    assert _run(["amqp-consume", *url, "-q", queue, "-c", "2", "-p", "1", "cat"]) == ["c 2c 3"]
    assert _run(["amqp-delete-queue", *url, "-q", queue]) == ["0"]


def test_ruby_bunny(broker):
    ruby = _need_library("ruby", ["-e", "require 'bunny'"], "Bunny", "ruby-bunny")
    queue = uniq("ruby")
    lines = _run([ruby, str(CLIENTS / "bunny.rb"), "127.0.0.1", str(broker.port), queue])
    assert lines == ["connected exchange-broker", f"declared {queue}", "confirmed true"] + \
        [f"got ruby {i} text/plain n={i} redelivered=false" for i in (1, 2, 3)] + ["left 0", "ok"]


def test_php_amqplib(broker):
    php = _need_library("php", ["-r", "require 'PhpAmqpLib/autoload.php';"], "php-amqplib", "php-amqplib")
    queue = uniq("php")
    _expect_roundtrip(_run([php, str(CLIENTS / "amqplib.php"), "127.0.0.1", str(broker.port), queue]), queue, "php")


GOPATH = Path("/usr/share/gocode")  # where Debian's golang-*-dev packages put their sources


def test_go_amqp091(broker, tmp_path):
    go = _need("go", "amqp091-go")
    if not (GOPATH / "src/github.com/rabbitmq/amqp091-go").is_dir():
        pytest.skip("amqp091-go is not installed (Debian: golang-github-rabbitmq-amqp091-go-dev)")
    env = {"GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(tmp_path / "cache")}
    binary = tmp_path / "client"
    _run([go, "build", "-o", str(binary), "main.go"], timeout=300, cwd=CLIENTS / "go", env=env)
    queue = uniq("go")
    _expect_roundtrip(_run([str(binary), f"amqp://guest:guest@127.0.0.1:{broker.port}/", queue]), queue, "go")


JARS = [Path("/usr/share/java") / name for name in ("amqp-client.jar", "slf4j-api.jar", "slf4j-nop.jar")]


def test_java_amqp_client(broker, tmp_path):
    javac, java = _need("javac", "RabbitMQ Java client"), _need("java", "RabbitMQ Java client")
    missing = [str(jar) for jar in JARS if not jar.exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian: librabbitmq-client-java, libslf4j-java)")
    _run([javac, "-cp", str(JARS[0]), "-d", str(tmp_path), str(CLIENTS / "java" / "JavaClient.java")], timeout=300)
    classpath = os.pathsep.join([str(tmp_path), *map(str, JARS)])
    queue = uniq("java")
    _expect_roundtrip(_run([java, "-cp", classpath, "JavaClient", "127.0.0.1", str(broker.port), queue]), queue, "java")


MONO_CLIENT = Path("/usr/lib/mono/4.5/RabbitMQ.Client.dll")


@pytest.mark.parametrize("protocol", [None, "AMQP_0_9"], ids=["amqp-0-8", "amqp-0-9"])
def test_mono_rabbitmq_client(broker, tmp_path, protocol):
    # the .NET client as Debian ships it: it opens with AMQP 0-8 unless told otherwise
    mcs, mono = _need("mcs", "Mono RabbitMQ.Client"), _need("mono", "Mono RabbitMQ.Client")
    if not MONO_CLIENT.exists():
        pytest.skip(f"{MONO_CLIENT} missing (Debian: libmono-rabbitmq4.0-cil)")
    exe = tmp_path / "MonoClient.exe"
    _run([mcs, f"-r:{MONO_CLIENT}", f"-out:{exe}", str(CLIENTS / "mono" / "MonoClient.cs")], timeout=300)
    queue = uniq("mono")
    lines = _run([mono, str(exe), "127.0.0.1", str(broker.port), queue, *([protocol] if protocol else [])])
    assert lines == [f"connected exchange-broker {'0-9' if protocol else '0-8'}", f"declared {queue}", "committed 3"] + \
        [f"got mono {i} text/plain n={i} key=n.{i}" for i in (1, 2, 3)] + \
        ["get empty", "again again redelivered=True", "purged 0", "deleted 0", "ok"]
