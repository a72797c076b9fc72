"""Shared pieces of the Spark benchmarks (``spark_drain.py``, ``spark_sink.py``,
``spark_stream_read.py``): start this broker, reach RabbitMQ, publish fast with confirms,
build the SparkSession, time a phase and print a table.

Every benchmark runs the same steps against this project's broker (a subprocess on a free
port) and then against RabbitMQ at ``--rabbitmq-url`` when it is reachable, in one run.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_integration.amqp import Connection, ConnectionParams  # noqa: E402

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def add_common_args(ap, count: int) -> None:
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--broker-url", default=None,
                    help="use this broker instead of starting exchange_broker")
    ap.add_argument("--rabbitmq-url", default=RABBITMQ_URL)
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--json", action="store_true")


ADMIN_URLS: dict[str, str] = {}  # AMQP url of a broker started here -> its admin API's URL


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(tmp: str, durable: bool = False) -> tuple[subprocess.Popen, str]:
    """``python -m exchange_broker serve`` on a free port (in memory, or with a data dir when
    ``durable``: stream queues keep their log there), its admin API on another free port
    (``ADMIN_URLS``)."""
    port_file = os.path.join(tmp, "port")
    store = (["--data-dir", os.path.join(tmp, "data")] if durable else ["--in-memory"])
    admin = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exchange_broker", "serve", *store, "--host", "127.0.0.1",
         "--port", "0", "--port-file", port_file, "--admin-host", "127.0.0.1",
         "--admin-port", str(admin), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("broker did not start")
        time.sleep(0.05)
    port = int(open(port_file).read().strip())
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    ADMIN_URLS[url] = f"http://127.0.0.1:{admin}"
    return proc, url


def stop_broker(proc) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def reachable(url: str) -> bool:
    p = ConnectionParams.from_url(url)
    try:
        socket.create_connection((p.host, p.port), timeout=2).close()
        return True
    except OSError:
        return False


def version(url: str) -> str:
    with Connection.connect(url) as c:
        v = c.server_properties.get("version")
        return v.decode() if isinstance(v, bytes) else str(v or "")


def publish(url: str, queue: str, count: int, size: int, batch: int = 2000,
            window: int = 50000) -> float:
    """Publish ``count`` messages to ``queue`` (default exchange), pipelined with publisher
    confirms; every body starts with its sequence number.  Returns msgs/s."""
    conn = Connection.connect(url)
    conn.confirm_select()
    template = conn.publish_frames("", queue, b"\0" * size)
    body_at = template.rindex(b"\0" * size)
    prefix, suffix = template[:body_at], template[body_at + size:]
    if len(suffix) != 1 or size + 8 > conn.frame_max:
        raise SystemExit("--size must fit in one frame")
    pad = b"x" * max(0, size - 12)
    t0 = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        conn.publish_raw(b"".join(prefix + (b"%012d" % i)[:size] + pad + suffix
                                  for i in range(sent, sent + n)), n)
        sent += n
        conn.wait_for_confirms(300, max_outstanding=window)
    conn.wait_for_confirms(300)
    rate = count / (time.perf_counter() - t0)
    conn.close()
    return rate


def depth(url: str, queue: str) -> int:
    with Connection.connect(url) as c:
        return c.queue_declare(queue, passive=True)[1]


@contextlib.contextmanager
def fresh_queue(url: str, prefix: str, arguments: dict | None = None, durable: bool = False):
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with Connection.connect(url) as c:
        c.queue_declare(name, durable=durable, arguments=arguments)
    try:
        yield name
    finally:
        with Connection.connect(url) as c:
            c.queue_delete(name)


def spark_session(master: str, app: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from spark_integration import register
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@contextlib.contextmanager
def brokers(args, durable: bool = False):
    """Yields (tmp dir, [(name, url), ...]): this broker first, then RabbitMQ if reachable."""
    tmp = tempfile.mkdtemp(prefix="spark-bench-")
    proc = None
    try:
        if args.broker_url:
            ours = args.broker_url
        else:
            proc, ours = start_broker(tmp, durable)
        targets = [("exchange-broker", ours)]
        if not args.no_rabbitmq:
            if reachable(args.rabbitmq_url):
                targets.append(("RabbitMQ", args.rabbitmq_url))
            else:
                print(f"RabbitMQ not reachable at {args.rabbitmq_url}; skipped", file=sys.stderr)
        yield tmp, targets
    finally:
        stop_broker(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def print_table(title: str, results: list[dict], columns: list[tuple[str, str]]) -> None:
    """columns: (key, header); the first column is the broker label."""
    print(f"\n{title}")
    widths = [max(len(h), 12) for _, h in columns]
    head = f"{'broker':<24}" + "".join(f"{h:>{w + 2}}" for (_, h), w in zip(columns, widths))
    print(head)
    print("-" * len(head))
    for r in results:
        label = f"{r['broker']} {r.get('version', '')}".strip()
        cells = []
        for (key, _), w in zip(columns, widths):
            v = r.get(key)
            cells.append(f"{v:>{w + 2},}" if isinstance(v, int) and not isinstance(v, bool)
                         else f"{str(v):>{w + 2}}")
        print(f"{label:<24}" + "".join(cells))
    if len(results) == 2 and all("msgs_per_s" in r for r in results) and results[1]["msgs_per_s"]:
        print(f"ratio exchange-broker / RabbitMQ: "
              f"{results[0]['msgs_per_s'] / results[1]['msgs_per_s']:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared machine)")


def report(args, title: str, results: list[dict], columns: list[tuple[str, str]],
           extra: dict | None = None, footnote: str = "") -> int:
    """Print the results (``--json`` or a table); exit code 0 when every run verified."""
    import json
    if args.json:
        print(json.dumps({"count": args.count, "size": args.size, **(extra or {}),
                          "results": results}, indent=2))
    else:
        print_table(title, results, columns)
        if footnote:
            print(footnote)
    return 0 if all(r["verified"] for r in results) else 1
