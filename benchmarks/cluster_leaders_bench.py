"""``cluster_bench.py --cluster-mode leaders``: a cluster where every node serves and each durable
queue is led by the node that declared it (``serve --cluster --cluster-mode leaders``).

Every figure is the median of ``--runs`` runs, each on a throwaway PostgreSQL database:

1. aggregate throughput for each node count: ``--queues`` queues, queue i declared on (so led by)
   node i mod n, one ``leaders_load.py`` process per queue (one producer, one consumer:
   persistent messages with confirms, amqp_load's usual settings), all at once, their consumed
   msg/s summed. *local*: the queue's clients connect to its leader (the scale-out case);
   *forwarded*: they connect to the next node, so every publish and delivery crosses a link;
2. the cost of forwarding: one queue led by node 1, one load process on node 1 (local), then one
   on node 2 (forwarded); msg/s and the CPU seconds per 1,000 messages of all node processes;
3. failover (``leaders_failover.py``): with two nodes, a producer and a consumer on node 2 work a
   queue node 1 leads; SIGKILL of node 1 to the first delivery through node 2.

Every load checks that each confirmed message was consumed at least once (``lost`` in the
report); the exit status is 1 when one was not.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import pika

from cluster_failover import connect_retry, start_node, throwaway_cluster, wait_port
from leaders_failover import failover_run
from loadgen.client import run_loop
from loadgen.procs import cpu_seconds

HERE = os.path.dirname(os.path.abspath(__file__))


@contextmanager
def leaders_cluster(args, count: int):
    """(url, AMQP ports, node processes) of ``count`` fresh leaders-mode nodes; with --keep-logs
    DIR, the node logs of a run that failed are copied there."""
    with throwaway_cluster(args.pg_url, "eb-leaders-bench-") as (url, workdir, procs):
        try:
            files = []
            for i in range(count):
                proc, port_file = start_node(url, f"n{i + 1}", workdir, args.heartbeat, args.failover_timeout,
                                             mode="leaders", extra=getattr(args, "node_arg", None) or ())
                procs.append(proc)
                files.append(port_file)
            ports = [wait_port(f, 60) for f in files]
            for port in ports:
                connect_retry(port, 60).close()
            yield url, ports, procs
        except BaseException:
            if args.keep_logs:
                kept = tempfile.mkdtemp(prefix="eb-leaders-logs-", dir=args.keep_logs)
                for name in os.listdir(workdir):
                    if name.endswith(".log"):
                        shutil.copy(os.path.join(workdir, name), kept)
                print(f"node logs of the failed run: {kept}", file=sys.stderr)
            raise


def declare(leader_port: int, client_port: int, queue: str, limit: float = 30.0) -> None:
    """Declare the durable ``queue`` on its leader, then wait until the client's node knows it."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", leader_port))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    if client_port == leader_port:
        return
    deadline = time.monotonic() + limit
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", client_port))
    try:
        while True:
            try:
                conn.channel().queue_declare(queue, durable=True, passive=True)
                return
            except pika.exceptions.ChannelClosedByBroker:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"queue {queue} declared on port {leader_port} is unknown on port "
                                       f"{client_port} after {limit} s") from None
                time.sleep(0.05)
    finally:
        conn.close()


def load(pairs: list[tuple[int, str]], args) -> list[dict]:
    """One leaders_load.py process per (port, queue), all at once; their JSON results."""
    cmd = [sys.executable, os.path.join(HERE, "leaders_load.py"), "--seconds", str(args.seconds)]
    procs = [subprocess.Popen(cmd + ["--port", str(port), "--queue", queue], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for port, queue in pairs]
    out, errors = [], []
    for p in procs:
        stdout, stderr = p.communicate(timeout=args.seconds * 4 + 180)
        if p.returncode != 0:
            errors.append(stderr.strip()[-2000:])
        else:
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    if errors:
        raise RuntimeError("leaders_load failed: " + " | ".join(errors))
    return out


def aggregate(args, count: int, forwarded: bool) -> dict:
    with leaders_cluster(args, count) as (_url, ports, _procs):
        pairs = []
        for i in range(args.queues):
            leader = i % count
            client = (leader + 1) % count if forwarded else leader
            queue = f"bench-{i}"
            declare(ports[leader], ports[client], queue)
            pairs.append((ports[client], queue))
        results = load(pairs, args)
    return {"msg_per_s": sum(r["consumed_per_s"] for r in results), "lost": sum(r["missing"] for r in results),
            "nacked": sum(r["nacked"] for r in results), "confirmed": sum(r["confirmed"] for r in results)}


def local_and_forwarded(args) -> dict:
    """One queue led by node 1: one load on node 1, then one on node 2; msg/s and CPU."""
    with leaders_cluster(args, 2) as (_url, ports, procs):
        declare(ports[0], ports[1], "cost")
        pids = [p.pid for p in procs]
        out = {}
        for what, port in (("local", ports[0]), ("forwarded", ports[1])):
            before = [cpu_seconds(pid) for pid in pids]
            result = load([(port, "cost")], args)[0]
            spent = [cpu_seconds(pid) - b for pid, b in zip(pids, before)]
            per_k = 1000 / max(1, result["consumed"])
            out[what] = {"msg_per_s": result["consumed_per_s"],
                         "cpu_s_per_1000_msg": round(sum(spent) * per_k, 4),
                         "leader_cpu_s_per_1000_msg": round(spent[0] * per_k, 4),
                         "other_cpu_s_per_1000_msg": round(spent[1] * per_k, 4),
                         "lost": result["missing"], "nacked": result["nacked"]}
        return out


def failover(args) -> dict:
    with leaders_cluster(args, 2) as (_url, ports, procs):
        declare(ports[0], ports[1], "failover")
        return run_loop(failover_run(ports[1], "failover", lambda: os.kill(procs[0].pid, signal.SIGKILL),
                                     rate=args.failover_rate, warm=2.0,
                                     limit=args.failover_timeout * 3 + 30, stall=30.0))


def _runs(values: list[float], fmt: str = ",.0f") -> str:
    return ", ".join(format(v, fmt) for v in values)


def run_leaders(args) -> int:
    counts = [int(n) for n in args.nodes.split(",")]
    report: dict = {"cluster_mode": "leaders", "scenario": "persistent", "queues": args.queues,
                    "seconds": args.seconds, "runs": args.runs, "heartbeat": args.heartbeat,
                    "failover_timeout": args.failover_timeout}
    rows: list[tuple[str, str, str]] = []
    lost = nacked = 0
    for count in counts:
        for forwarded in (False, True) if count > 1 else (False,):
            what = "forwarded" if forwarded else "local"
            runs = [aggregate(args, count, forwarded) for _ in range(args.runs)]
            rates = [r["msg_per_s"] for r in runs]
            lost += sum(r["lost"] for r in runs)
            nacked += sum(r["nacked"] for r in runs)
            report[f"{count}_nodes_{what}_msg_per_s"] = round(statistics.median(rates))
            rows.append((f"{count} node(s), {args.queues} queues, {what}", f"{statistics.median(rates):,.0f} msg/s",
                         _runs(rates)))
            print(f"{rows[-1][0]}: {rows[-1][1]} (runs: {rows[-1][2]})", file=sys.stderr, flush=True)
    if not args.skip_cost:
        pairs = [local_and_forwarded(args) for _ in range(args.runs)]
        for what in ("local", "forwarded"):
            report[what] = {k: statistics.median(run[what][k] for run in pairs) for k in pairs[0][what]
                            if k not in ("lost", "nacked")}
            lost += sum(run[what]["lost"] for run in pairs)
            nacked += sum(run[what]["nacked"] for run in pairs)
            rows.append((f"1 queue on node 1, client on node {1 if what == 'local' else 2} ({what})",
                         f"{report[what]['msg_per_s']:,.0f} msg/s, {report[what]['cpu_s_per_1000_msg']:.3f} "
                         f"CPU s/1000 msg", _runs([run[what]["msg_per_s"] for run in pairs])))
        report["forwarded_vs_local_rate"] = round(report["forwarded"]["msg_per_s"] / report["local"]["msg_per_s"], 3)
        report["forwarded_vs_local_cpu"] = round(report["forwarded"]["cpu_s_per_1000_msg"]
                                                 / report["local"]["cpu_s_per_1000_msg"], 3)
        rows.append(("forwarded / local", f"rate x{report['forwarded_vs_local_rate']}, CPU per message "
                     f"x{report['forwarded_vs_local_cpu']}", ""))
    if not args.skip_failover:
        runs = [failover(args) for _ in range(args.runs)]
        times = [r["failover_s"] for r in runs]
        lost += sum(r["missing"] for r in runs)
        report["failover_seconds_median"] = round(statistics.median(times), 3)
        report["failover_runs"] = runs
        rows.append((f"failover (SIGKILL of the leader to the first delivery on node 2, timeout "
                     f"{args.failover_timeout} s)", f"{statistics.median(times):.2f} s", _runs(times, ".2f")))
    report["lost"] = lost
    report["nacked_outside_failover"] = nacked
    rows.append(("confirmed but never consumed", str(lost), "nacked outside the failover: " + str(nacked)))
    _print_table(rows)
    if args.json:
        print(json.dumps(report))
    return 1 if lost else 0


def _print_table(rows: list[tuple[str, str, str]]) -> None:
    head = ("leaders mode", "median", "runs")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    for n, row in enumerate((head, *rows)):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
