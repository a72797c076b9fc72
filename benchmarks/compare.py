#!/usr/bin/env python3
"""This project's broker against RabbitMQ, same run, same client: every scenario of issue 14.

For each scenario and each of ``--runs`` runs:

1. start ``python -m exchange_broker serve`` (or ``--broker-cmd``) on an ephemeral port with a
   fresh temporary ``--data-dir`` (SQLite, synchronous FULL by default), in its own process
   group, plus any ``--broker-arg`` / arguments after ``--``;
2. run the scenario's tool against it as a separate process (``--port P --pid PID --json``),
   then stop the broker;
3. run the same tool against RabbitMQ at ``--rabbit-host:--rabbit-port`` (skipped with a
   message when unreachable; its Erlang VM, beam.smp, is found with pgrep for /proc readings),
   or with ``--rabbit-private`` against a throwaway RabbitMQ node started for this command
   (``loadgen/rabbit_node.py``: own node name, free ports, temp dirs, open-files limit
   ``--rabbit-private-nofile``, 8192), stopped and removed at the end.

Then it prints one table: each scenario's figures for both brokers (medians over the runs) and
the ratio, which reads the same way in every row: >= 1.00 means this broker is as good as
RabbitMQ or better (ours / RabbitMQ for rates; RabbitMQ / ours for latency, memory and CPU).

Scenarios (``all`` = every one but persistent-pg, which ``--postgres`` adds):

  transient           (a) 1 producer, 1 auto-ack consumer, transient 100 B     amqp_load.py
  transient-confirms  (b) the same with confirms (<=500 in flight), manual ack
                      multiple every 50, prefetch 200                          amqp_load.py
  persistent          (c) delivery_mode 2 on a durable queue, same confirms and
                      acks; ours on SQLite synchronous FULL (alias: confirms)   amqp_load.py
  persistent-pg       (c) again, ours on a throwaway PostgreSQL database        amqp_load.py
  fanout              (d) fanout to 4 queues, 4 auto-ack consumers, deliveries/s amqp_load.py
  stream              (e) stream: publish with confirms (10,000 in flight), read
                      by 2 consumers                                           stream_bench.py
  latency             publish->confirm and publish->deliver p50/p99 at a steady
                      10,000 msg/s, synchronous confirm round trip             latency.py
  memory              RSS per queued 1 KiB persistent message (1,000,000)      memory.py
  connections         1,000 connections x 10 msg/s: broker CPU per 1,000 msgs many_connections.py

Examples::

    python benchmarks/compare.py --scenario all                       # the issue's table
    python benchmarks/compare.py --scenario all --seconds 3 --runs 1 --stream-count 100000 \\
        --messages 50000 --connections 200                           # a quick pass
    python benchmarks/compare.py --scenario persistent --postgres    # + the same on PostgreSQL
    python benchmarks/compare.py --scenario transient,fanout --load-arg=--verify
    python benchmarks/compare.py --scenario persistent -- --sqlite-synchronous NORMAL
    python benchmarks/compare.py --scenario connections --rabbit-private   # 1,000 on both
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loadgen.brokers import (PG_ADMIN_URL, STORE_FLAGS, BrokerFailed, OurBroker,  # noqa: E402
                             ThrowawayDatabase, port_open)
from loadgen import rabbit_node  # noqa: E402
from loadgen.procs import find_rabbit_pid, safe_connections  # noqa: E402
from loadgen.report import Metric, median_result, print_table, rows_for  # noqa: E402
from loadgen.rows import ALIASES, ALL, SCENARIOS, Scenario, tool_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VERIFY = Metric("verify_ok", "--verify: every message once, in order", ratio=False)


def run_tool(sc: Scenario, host: str, port: int, pid: int, opts, user: str,
             password: str) -> dict:
    """One run of the scenario's tool against one broker; its JSON result (or an error)."""
    cmd = [sys.executable, os.path.join(HERE, sc.tool), "--host", host, "--port", str(port),
           "--user", user, "--password", password, "--json", *tool_args(sc, opts)]
    if pid and sc.tool != "amqp_load.py":
        cmd += ["--pid", str(pid)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        stdout, _ = proc.communicate(timeout=_timeout(sc, opts))
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        _interrupt(proc)  # SIGINT first: the tool deletes its queues on the way out
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"error": f"{sc.tool} timed out after {exc.timeout:.0f} s"}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"{sc.tool} exited {proc.returncode} without a result"}
    result = json.loads(lines[-1])
    result["exit_code"] = proc.returncode
    return result


def _interrupt(proc: subprocess.Popen, grace: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _timeout(sc: Scenario, opts) -> float:
    if "--verify" in opts.load_arg:
        return 900
    return {"stream_bench.py": 300 + opts.stream_count / 2000,
            "memory.py": 300 + opts.messages / 500,
            "latency.py": 180 + opts.seconds + opts.sync_seconds,
            "many_connections.py": 300 + opts.seconds}.get(sc.tool, 120 + opts.seconds)


def _summary(r: dict, sc: Scenario) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    parts = []
    for m in sc.metrics:
        if r.get(m.key) is not None:
            v = r[m.key]
            parts.append(f"{m.label} {v if isinstance(v, bool) else format(v, m.fmt)}")
    if "verify_ok" in r:
        parts.append("verify " + ("OK" if r["verify_ok"] else "FAILED"))
    if r.get("warning"):
        parts.append("warning: " + r["warning"])
    return "; ".join(parts)


def our_broker_args(sc: Scenario, opts, passthrough: list[str], pg_url: str | None) -> list[str]:
    extra = list(opts.broker_arg) + passthrough
    if opts.database_url:
        extra += ["--database-url", opts.database_url]
    if sc.store == "postgres":
        extra = [a for a in extra if a.split("=", 1)[0] not in STORE_FLAGS] \
            + ["--database-url", pg_url]
    return extra


def store_label(sc: Scenario, extra: list[str]) -> str:
    if sc.store == "postgres":
        return "PostgreSQL"
    flags = [a.split("=", 1)[0] for a in extra]
    if "--in-memory" in flags:
        return "in-memory"
    if "--database-url" in flags:
        url = extra[flags.index("--database-url") + 1] if "=" not in extra[flags.index(
            "--database-url")] else extra[flags.index("--database-url")].split("=", 1)[1]
        return "PostgreSQL" if url.startswith("postgres") else "database-url"
    sync = "FULL"
    if "--sqlite-synchronous" in flags:
        i = flags.index("--sqlite-synchronous")
        sync = extra[i].split("=", 1)[1] if "=" in extra[i] else extra[i + 1]
    return f"SQLite {sync}"


def measure_scenario(sc: Scenario, opts, passthrough, pg_url, rabbit_pid, rabbit_up):
    ours_runs, rabbit_runs = [], []
    extra = our_broker_args(sc, opts, passthrough, pg_url)
    for i in range(opts.runs):
        if not opts.skip_ours:
            broker = OurBroker(extra, cmd=shlex.split(opts.broker_cmd) if opts.broker_cmd else None,
                               admin_port=not opts.no_admin_port,
                               temp_data_dir=not opts.no_temp_data_dir, log_path=opts.broker_log)
            try:
                broker.start(opts.startup_timeout)
                r = run_tool(sc, "127.0.0.1", broker.port, broker.pid, opts, opts.user,
                             opts.password)
                if "error" in r or (broker.proc and broker.proc.poll() is not None):
                    r.setdefault("error", "broker exited during the run")
                    print(f"--- broker log tail ---\n{broker.log_tail()}", file=sys.stderr)
            finally:  # a BrokerFailed (it did not start) ends the whole run in main()
                broker.stop()
            ours_runs.append(r)
            print(f"[ours] {sc.name} run {i + 1}/{opts.runs}: {_summary(r, sc)}",
                  file=sys.stderr, flush=True)
        if rabbit_up:
            r = run_tool(sc, opts.rabbit_host, opts.rabbit_port, rabbit_pid, opts,
                         opts.rabbit_user or opts.user, opts.rabbit_password or opts.password)
            rabbit_runs.append(r)
            print(f"[rabbitmq] {sc.name} run {i + 1}/{opts.runs}: {_summary(r, sc)}",
                  file=sys.stderr, flush=True)
    ours = median_result(ours_runs) if ours_runs else None
    rabbit = median_result(rabbit_runs) if rabbit_runs else None
    return ours, rabbit, store_label(sc, extra)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Every scenario of issue 14: this project's broker against RabbitMQ, "
                    "same run, same client, with the ratio.",
        epilog="Arguments after a bare '--' are appended to our broker's command line. "
               "Ratio >= 1.00: ours is as good or better.")
    p.add_argument("--scenario", default="transient",
                   help="a scenario, a comma list, or all: " + ", ".join(
                       [*SCENARIOS, *ALIASES]) + " (default transient)")
    p.add_argument("--seconds", type=float, default=8.0,
                   help="length of each timed run incl. warm-up (default 8)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    p.add_argument("--runs", type=int, default=2,
                   help="runs per scenario and broker; medians are reported (default 2)")
    p.add_argument("--stream-count", type=int, default=1_000_000,
                   help="stream: messages published then read (default 1,000,000)")
    p.add_argument("--rate", type=float, default=10000.0,
                   help="latency: steady publish rate (default 10,000 msg/s)")
    p.add_argument("--sync-seconds", type=float, default=5.0,
                   help="latency: length of the synchronous-confirm phase (default 5)")
    p.add_argument("--messages", type=int, default=1_000_000,
                   help="memory: 1 KiB persistent messages queued (default 1,000,000)")
    p.add_argument("--connections", type=int, default=1000,
                   help="connections: connections, 10 msg/s each (default 1,000; capped within "
                        "RabbitMQ's open-files limit, the same for both brokers)")
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--vhost", default="/")
    g = p.add_argument_group("our broker")
    g.add_argument("--broker-cmd", default=None,
                   help="broker command (shell-quoted; default 'python -m exchange_broker "
                        "serve'); one containing {port} is a complete template")
    g.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="extra broker argument, repeatable; {tmpdir}, {host}, {port} are "
                        "substituted (use the = form: --broker-arg=--queue-window)")
    g.add_argument("--database-url", default=None,
                   help="our broker's store for every scenario (passed through)")
    g.add_argument("--postgres", action="store_true",
                   help="also run persistent with our broker on a throwaway PostgreSQL "
                        "database bench_<random> (created, then dropped)")
    g.add_argument("--postgres-admin-url", default=PG_ADMIN_URL,
                   help=f"where to create it (default {PG_ADMIN_URL}; env EB_BENCH_PG_URL)")
    g.add_argument("--no-temp-data-dir", action="store_true",
                   help="don't add --data-dir <tmpdir>/data")
    g.add_argument("--no-admin-port", action="store_true", help="don't pass --admin-port 0")
    g.add_argument("--broker-log", default=None, help="append the broker's output to this file")
    g.add_argument("--startup-timeout", type=float, default=60.0)
    g.add_argument("--skip-ours", action="store_true")
    g = p.add_argument_group("RabbitMQ")
    g.add_argument("--rabbit-host", default="127.0.0.1")
    g.add_argument("--rabbit-port", type=int, default=5672)
    g.add_argument("--rabbit-user", default=None, help="default: --user")
    g.add_argument("--rabbit-password", default=None, help="default: --password")
    g.add_argument("--skip-rabbitmq", action="store_true")
    rabbit_node.add_args(g)
    p.add_argument("--load-arg", action="append", default=[], metavar="ARG",
                   help="extra amqp_load.py argument, repeatable (e.g. --load-arg=--verify)")
    p.add_argument("--json", action="store_true", help="also print every result as JSON")
    return p


def pick_scenarios(text: str, postgres: bool) -> list[str]:
    names = list(ALL) if text == "all" else \
        [ALIASES.get(s.strip(), s.strip()) for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SCENARIOS]
    if bad or not names:
        raise ValueError(f"unknown scenario(s) {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join([*SCENARIOS, *ALIASES])} or all")
    if postgres and "persistent-pg" not in names:
        names.insert(names.index("persistent") + 1 if "persistent" in names else len(names),
                     "persistent-pg")
    return names


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    opts = build_parser().parse_args(argv)
    try:
        names = pick_scenarios(opts.scenario, opts.postgres)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if opts.runs < 1:
        print("--runs must be >= 1", file=sys.stderr)
        return 2

    def _on_term(signum, frame):  # SIGTERM: leave through the finally blocks (brokers, db)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _on_term)

    if opts.rabbit_private and opts.skip_rabbitmq:
        print("--rabbit-private and --skip-rabbitmq contradict each other", file=sys.stderr)
        return 2
    node = rabbit_node.from_opts(opts) if opts.rabbit_private else None
    rows, results, warnings, labels, rc = [], {}, [], [], 0
    db = None
    try:
        if node is not None:
            print("RabbitMQ: starting a private node ...", file=sys.stderr, flush=True)
            node.start()
            print(f"RabbitMQ: {node.describe()}", file=sys.stderr, flush=True)
            opts.rabbit_host, opts.rabbit_port = node.host, node.port
            warnings.append(f"RabbitMQ: a private node for this run ({node.node}, open files "
                            f"{node.open_files_limit()}), not the one at 127.0.0.1:5672")
        rabbit_up = not opts.skip_rabbitmq and port_open(opts.rabbit_host, opts.rabbit_port, 1.0)
        if not opts.skip_rabbitmq and not rabbit_up:
            print(f"RabbitMQ: not reachable at {opts.rabbit_host}:{opts.rabbit_port}, skipped",
                  file=sys.stderr)
        rabbit_pid = (node.pid if node else find_rabbit_pid(opts.rabbit_port)) \
            if rabbit_up else None
        if "persistent-pg" in names and not opts.skip_ours:
            try:
                db = ThrowawayDatabase(opts.postgres_admin_url)
            except Exception as exc:  # noqa: BLE001 - any driver error: one line, no traceback
                print(f"error: cannot create a database on PostgreSQL at "
                      f"{opts.postgres_admin_url}: {str(exc).strip().splitlines()[0]}",
                      file=sys.stderr)
                return 2
            print(f"PostgreSQL: throwaway database {db.name}", file=sys.stderr)
        for name in names:
            sc = SCENARIOS[name]
            if sc.needs_pid and rabbit_up and not rabbit_pid:
                warnings.append(f"{name}: RabbitMQ's beam.smp not found: RabbitMQ skipped")
            if name == "connections" and rabbit_pid:
                n, note = safe_connections(rabbit_pid, opts.connections)
                if note:
                    warnings.append(f"connections: RabbitMQ {note}; both brokers got {n}")
                    opts.connections = n
            ours, rabbit, store = measure_scenario(
                sc, opts, passthrough, db.url if db else None, rabbit_pid or 0,
                rabbit_up and (rabbit_pid or not sc.needs_pid))
            labels.append(f"{name:<19} {sc.label}"
                          + (f" (ours: {store})" if name.startswith("persistent") else ""))
            metrics = list(sc.metrics)
            if "--verify" in opts.load_arg and sc.tool == "amqp_load.py":
                metrics.append(VERIFY)
            rows += rows_for(name, metrics, ours, rabbit)
            results[name] = {"ours": ours, "rabbitmq": rabbit}
            for who, r in (("ours", ours), ("RabbitMQ", rabbit)):
                if r and r.get("warning"):
                    warnings.append(f"{name}: {who}: {r['warning']}")
                if r and ("error" in r or r.get("verify_ok") is False
                          or r.get("all_delivered") is False):
                    rc = 1
        print()
        names_ = [next((r[k]["server"] for r in results.values()
                        if r[k] and r[k].get("server")), None) for k in ("ours", "rabbitmq")]
        print_table(rows, names_[0] or "exchange-broker", names_[1] or "RabbitMQ")
        print(f"medians of {opts.runs} run(s); {opts.seconds:g} s per timed run "
              f"({opts.warmup:g} s warm-up); {opts.size} B messages unless the row says")
        for line in labels:
            print("  " + line)
        for w in warnings:
            print(f"warning: {w}")
        if opts.json:
            print(json.dumps(results, separators=(",", ":")))
    except BrokerFailed as exc:
        print(f"error: our broker did not start: {exc}", file=sys.stderr)
        rc = 2
    except rabbit_node.RabbitNodeFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # don't interrupt the cleanup
        if db is not None:
            db.drop()
        if node is not None:
            node.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return rc


if __name__ == "__main__":
    sys.exit(main())
