"""Fixtures for the Spark integration tests.

* ``spark``: ONE SparkSession for the whole run (local[2], UI off, shuffle partitions 1),
  created lazily, so the JVM-free tests never start a JVM.
* ``amqp_url``: a real broker: this project's broker in-process on an ephemeral port
  (ThreadedBroker).  Set SPARK_AMQP_TEST_URL to point the suite at another broker by hand
  (e.g. RabbitMQ, to check the stream tests against its stream queues).
* ``stream_support``: skips a test when the broker has no stream queues.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import uuid

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

EXTERNAL_URL = os.environ.get("SPARK_AMQP_TEST_URL")


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pyspark.sql import SparkSession

    from spark_integration import register

    # the JVM's temporary files (native libraries it unpacks, its artifacts-* directory) in a
    # directory of the run's own, removed at the end: java.io.tmpdir would leave them in /tmp
    scratch = tempfile.mkdtemp(prefix="eb-spark-")
    session = (SparkSession.builder
               .master("local[2]")
               # C1 only and one GC thread: the JVM's own start and its short jobs take less CPU
               # (several JVMs share 2 cores in a run; peak compiled speed is never reached here)
               .config("spark.driver.extraJavaOptions",
                       f"-Djava.io.tmpdir={scratch} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.local.dir", f"{scratch}/local")
               .appName("spark-integration-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def tmp_path():
    """Like pytest's tmp_path, but removed right after the test (Spark outputs and
    checkpoints are not kept around)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="spark-amqp-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def session_broker():
    """One in-process broker for the JVM tests (Spark workers connect to it over TCP)."""
    if EXTERNAL_URL:
        yield None
        return
    from exchange_broker.testing import ThreadedBroker
    with ThreadedBroker() as tb:
        yield tb


@pytest.fixture
def amqp_url(session_broker) -> str:
    return EXTERNAL_URL or session_broker.url


@pytest.fixture
def queue_name(request) -> str:
    return f"spark-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


@pytest.fixture
def classic_queue(amqp_url, queue_name):
    """A fresh classic queue, deleted afterwards."""
    from spark_integration.amqp import Connection
    with Connection.connect(amqp_url) as c:
        c.queue_declare(queue_name, durable=False)
    yield queue_name
    with Connection.connect(amqp_url) as c:
        c.queue_delete(queue_name)


def _has_streams(url: str) -> bool:
    from spark_integration.amqp import AMQPError, Connection
    name = f"spark-stream-probe-{uuid.uuid4().hex[:8]}"
    try:
        with Connection.connect(url) as c:
            c.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            try:
                c.confirm_select()
                c.publish("", name, b"probe")
                c.wait_for_confirms(10)
                c.basic_qos(10)
                c.basic_consume(name, {"x-stream-offset": "first"})
                got = c.take(1, 5)
                return bool(got) and "x-stream-offset" in (got[0].properties.headers or {})
            finally:
                with Connection.connect(url) as c2:
                    c2.queue_delete(name)
    except AMQPError:
        return False


_STREAMS: dict[str, bool] = {}


@pytest.fixture
def stream_support(amqp_url):
    if amqp_url not in _STREAMS:
        _STREAMS[amqp_url] = _has_streams(amqp_url)
    if not _STREAMS[amqp_url]:
        pytest.skip("broker has no stream queues yet")


@pytest.fixture
def stream_queue(amqp_url, queue_name, stream_support):
    from spark_integration.amqp import Connection
    with Connection.connect(amqp_url) as c:
        c.queue_declare(queue_name, durable=True, arguments={"x-queue-type": "stream"})
    yield queue_name
    with Connection.connect(amqp_url) as c:
        c.queue_delete(queue_name)


class AmqpHelper:
    """Test-side publishing/inspection over this package's own client."""

    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self):
        from spark_integration.amqp import Connection
        return Connection.connect(self.url)

    def publish(self, queue: str, bodies, properties=None) -> None:
        """Publish with confirms (the messages are in the queue when this returns)."""
        with self.connect() as c:
            c.confirm_select()
            for i, body in enumerate(bodies):
                props = properties(i) if callable(properties) else properties
                c.publish("", queue, body, props)
                if i % 500 == 499:
                    c.wait_for_confirms(30, max_outstanding=200)
            c.wait_for_confirms(30)

    def depth(self, queue: str) -> int:
        with self.connect() as c:
            return c.queue_declare(queue, passive=True)[1]

    def take_all(self, queue: str, n: int, timeout: float = 5.0):
        """Consume and ack up to n messages; returns the deliveries."""
        if n == 0:
            return []
        with self.connect() as c:
            c.consume_limited(queue, min(n, 65535))
            out = []
            while len(out) < n:
                got = c.take(n - len(out), timeout)
                if not got:
                    break
                out.extend(got)
                c.basic_ack(got[-1].delivery_tag, multiple=True)
            c.sync(queue)
            return out


@pytest.fixture
def amqp(amqp_url) -> AmqpHelper:
    return AmqpHelper(amqp_url)


class Proxy:
    """A TCP forwarder standing in for a cluster node that can die (``kill``)."""

    def __init__(self, target):
        import socket
        import threading
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks = []
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while self.alive:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def kill(self):
        import socket
        self.alive = False
        self.server.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@pytest.fixture
def node_proxy():
    """Factory of TCP forwarders to a (host, port): a cluster node that the test can kill.
    Every proxy is killed at teardown."""
    made = []

    def make(target):
        made.append(Proxy(target))
        return made[-1]
    yield make
    for p in made:
        p.kill()
