"""The command line every comparison tool shares (latency.py, memory.py, many_connections.py).

Without ``--port`` a tool starts this project's broker (a fresh temporary data directory, an
ephemeral port), measures it, stops it, then measures the RabbitMQ at ``--rabbit-host``/
``--rabbit-port`` (its Erlang VM found with pgrep for /proc readings) and prints both with the
ratio. With ``--port`` it measures that one broker (``--pid`` names its process when the tool
reads /proc) and prints one result; ``compare.py`` runs the tools that way, with ``--json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .brokers import BrokerFailed, OurBroker, port_open
from .client import AMQPError, run_loop
from .procs import find_rabbit_pid
from .report import Metric, print_table, rows_for


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("brokers")
    g.add_argument("--host", default="127.0.0.1", help="with --port: the broker to measure")
    g.add_argument("--port", type=int, default=0,
                   help="measure only the broker at --host:--port (default: start ours, "
                        "then RabbitMQ, and compare)")
    g.add_argument("--pid", type=int, default=0,
                   help="with --port: the broker's process id, for /proc readings "
                        "(default: RabbitMQ's beam.smp when it listens on --port)")
    g.add_argument("--user", default="guest")
    g.add_argument("--password", default="guest")
    g.add_argument("--vhost", default="/")
    g.add_argument("--rabbit-host", default="127.0.0.1")
    g.add_argument("--rabbit-port", type=int, default=5672)
    g.add_argument("--skip-rabbitmq", action="store_true", help="only this project's broker")
    g.add_argument("--skip-ours", action="store_true", help="only RabbitMQ")
    g.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="extra argument of our broker, repeatable "
                        "(e.g. --broker-arg=--database-url --broker-arg=postgresql://...)")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.add_argument("--no-uvloop", action="store_true", help="use asyncio's default loop")


def _measure(measure, host, port, pid, opts) -> dict:
    try:
        return run_loop(measure(host, port, pid, opts), opts.no_uvloop)
    except (AMQPError, OSError, asyncio.TimeoutError, RuntimeError) as exc:
        return {"host": host, "port": port, "error": str(exc) or type(exc).__name__}


def run(opts, measure, metrics: list[Metric], scenario: str, needs_pid: bool = False,
        rabbit=None) -> int:
    """Parse-free driver: ``measure(host, port, pid, opts)`` is the tool's coroutine. ``rabbit``
    (a started ``rabbit_node.PrivateRabbit``) is measured instead of --rabbit-host:--rabbit-port;
    the caller stops it."""
    try:
        return _run(opts, measure, metrics, scenario, needs_pid, rabbit)
    except KeyboardInterrupt:  # our broker is stopped on the way out
        print("interrupted", file=sys.stderr)
        return 130


def _run(opts, measure, metrics, scenario, needs_pid, private=None) -> int:
    if opts.port:
        pid = opts.pid or (find_rabbit_pid(opts.port) if needs_pid else 0)
        if needs_pid and not pid:
            print("error: --pid is needed (the broker's process id)", file=sys.stderr)
            return 2
        result = _measure(measure, opts.host, opts.port, pid, opts)
        if opts.json:
            print(json.dumps(result, separators=(",", ":")))
        else:
            for key, value in result.items():
                print(f"{key:28} {value}")
        return 2 if "error" in result else 0

    ours = rabbit = None
    if not opts.skip_ours:
        broker = OurBroker(opts.broker_arg)
        try:
            broker.start()
            print(f"[ours] {broker.describe()}", file=sys.stderr, flush=True)
            ours = _measure(measure, "127.0.0.1", broker.port, broker.pid, opts)
            if "error" in ours:
                print(f"[ours] error: {ours['error']}\n{broker.log_tail()}", file=sys.stderr)
        except BrokerFailed as exc:
            ours = {"error": str(exc)}
            print(f"[ours] {exc}", file=sys.stderr)
        finally:
            broker.stop()
    if private is not None:
        print(f"[rabbitmq] {private.describe()}", file=sys.stderr, flush=True)
        rabbit = _measure(measure, private.host, private.port, private.pid if needs_pid else 0,
                          opts)
        rabbit["private_node"] = private.node
        if "error" in rabbit:
            print(f"[rabbitmq] error: {rabbit['error']}\n{private.log_tail()}", file=sys.stderr)
    elif not opts.skip_rabbitmq:
        if port_open(opts.rabbit_host, opts.rabbit_port, 1.0):
            pid = find_rabbit_pid(opts.rabbit_port) if needs_pid else 0
            if needs_pid and not pid:
                rabbit = {"error": "RabbitMQ's beam.smp process not found (pgrep -x beam.smp)"}
            else:
                print(f"[rabbitmq] {opts.rabbit_host}:{opts.rabbit_port}"
                      + (f" (beam.smp pid {pid})" if pid else ""), file=sys.stderr, flush=True)
                rabbit = _measure(measure, opts.rabbit_host, opts.rabbit_port, pid, opts)
                if "error" in rabbit:
                    print(f"[rabbitmq] error: {rabbit['error']}", file=sys.stderr)
        else:
            print(f"RabbitMQ not reachable at {opts.rabbit_host}:{opts.rabbit_port}: skipped",
                  file=sys.stderr)
    if opts.json:
        print(json.dumps({"ours": ours, "rabbitmq": rabbit}, separators=(",", ":")))
    else:
        names = [(r or {}).get("server") for r in (ours, rabbit)]
        print_table(rows_for(scenario, metrics, ours, rabbit),
                    names[0] or "exchange-broker", names[1] or "RabbitMQ")
        for label, r in (("exchange-broker", ours), ("RabbitMQ", rabbit)):
            if r and r.get("warning"):
                print(f"warning: {label}: {r['warning']}")
    return 2 if any(r is not None and "error" in r for r in (ours, rabbit)) else 0
