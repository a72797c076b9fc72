"""compare.py's scenarios: which tool measures each, with which arguments, and which of its
result fields make the rows of the table."""
from __future__ import annotations

from dataclasses import dataclass

from .report import Metric

CONSUMED = Metric("consumed_per_s", "consumed msg/s")
CONFIRMED = Metric("confirmed_per_s", "confirmed msg/s")

LATENCY = (
    Metric("publish_rate", "steady publish msg/s (target --rate)", ratio=False),
    Metric("confirm_p50_ms", "publish->confirm p50 ms", False, ".3f"),
    Metric("confirm_p99_ms", "publish->confirm p99 ms", False, ".3f"),
    Metric("deliver_p50_ms", "publish->deliver p50 ms", False, ".3f"),
    Metric("deliver_p99_ms", "publish->deliver p99 ms", False, ".3f"),
    Metric("all_delivered", "steady: all delivered once", ratio=False),
    Metric("sync_per_s", "sync confirm msg/s"),
    Metric("sync_p50_ms", "sync confirm round trip p50 ms", False, ".3f"),
    Metric("sync_p99_ms", "sync confirm round trip p99 ms", False, ".3f"),
)
MEMORY = (
    Metric("queued", "messages queued (confirmed, counted)", ratio=False),
    Metric("rss_before_mib", "broker RSS before, MiB", False, ",.1f", ratio=False),
    Metric("rss_after_mib", "broker RSS with the queue, MiB", False, ",.1f", ratio=False),
    Metric("bytes_per_message", "RSS growth per queued message, bytes", False),
    Metric("publish_per_s", "publish msg/s (confirmed)", ratio=False),
)
CONNECTIONS = (
    Metric("connections_open", "connections open", ratio=False),
    Metric("delivered_per_s", "delivered msg/s in the window", ratio=False),
    Metric("cpu_per_1000", "broker CPU s per 1,000 msgs", False, ".4f"),
    Metric("cpu_share", "broker CPU, share of one core", False, ".2f", ratio=False),
    Metric("all_delivered", "all delivered", ratio=False),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    tool: str                       # script in benchmarks/
    args: tuple[str, ...]           # fixed arguments
    metrics: tuple[Metric, ...]
    label: str = ""
    options: tuple[str, ...] = ()   # compare.py options passed on: ("seconds", "size", ...)
    needs_pid: bool = False         # reads the broker process from /proc
    store: str = ""                 # "postgres": our broker on the throwaway database


def _amqp(name: str, scenario: str, metrics, label: str, store: str = "") -> Scenario:
    return Scenario(name, "amqp_load.py", ("--scenario", scenario), tuple(metrics), label,
                    ("seconds", "warmup", "size", "vhost", "load_args"), store=store)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    _amqp("transient", "transient", [CONSUMED], "(a) transient, auto-ack"),
    _amqp("transient-confirms", "transient-confirms", [CONSUMED, CONFIRMED],
          "(b) transient, confirms <=500, ack multiple/50, prefetch 200"),
    _amqp("persistent", "persistent", [CONSUMED, CONFIRMED],
          "(c) persistent, durable queue, confirms + acks"),
    _amqp("persistent-pg", "persistent", [CONSUMED, CONFIRMED],
          "(c) the same", store="postgres"),
    _amqp("fanout", "fanout", [Metric("consumed_per_s", "deliveries/s (4 queues)")],
          "(d) fanout to 4 queues, auto-ack"),
    Scenario("stream", "stream_bench.py", (), (
        Metric("published_per_s", "publish msg/s (confirms, 10,000 in flight)"),
        Metric("read_per_s", "read msg/s (2 consumers)")), "(e) stream",
        ("stream_count", "size")),
    Scenario("latency", "latency.py", (), LATENCY, "latency at a steady rate",
             ("seconds", "warmup", "size", "vhost", "rate", "sync_seconds")),
    Scenario("memory", "memory.py", (), MEMORY,
             "1 KiB persistent, no consumer; VmRSS from /proc of our broker / of beam.smp",
             ("messages", "vhost"), needs_pid=True),
    Scenario("connections", "many_connections.py", (), CONNECTIONS,
             "10 msg/s per connection; utime+stime from /proc of our broker / of "
             "beam.smp", ("connections", "seconds", "vhost"),
             needs_pid=True),
)}
ALIASES = {"confirms": "persistent"}
ALL = ("transient", "transient-confirms", "persistent", "fanout", "stream", "latency", "memory",
       "connections")


def tool_args(sc: Scenario, opts) -> list[str]:
    """The tool's command-line arguments for the options compare.py passes on."""
    out = list(sc.args)
    for name in sc.options:
        if name == "load_args":
            out += list(opts.load_arg)
            continue
        value = getattr(opts, name)
        if value is None:
            continue
        flag = "--count" if name == "stream_count" else "--" + name.replace("_", "-")
        out += [flag, str(value)]
    return out
