#!/usr/bin/env python3
"""Cluster throughput on this machine: 1, 2 and 3 nodes with clients spread over the nodes, the
cost of a forwarded (or passed-on) message against a local one, and the failover time.

With ``--cluster-mode leaders`` (the default, as the broker's: every node serves, each durable
queue led by the node that declared it) the figures are ``cluster_leaders_bench.py``'s: local and
forwarded throughput for each node count, the cost of a forwarded publish and delivery, and the
failover of a queue's leader.

With ``--cluster-mode active-standby``: for each node count, a throwaway PostgreSQL database gets that many ``serve --cluster`` nodes;
``--queues`` load processes (``amqp_load.py``: one producer and one consumer on a queue of their
own) run at once, the i-th connected to node i mod n, and their consumed rates are summed. Then,
with two nodes, one load process runs against the active node (local) and one against the standby
(passed on to the active node), one after the other, with each node's CPU per message. Last,
``cluster_failover.py``'s run: SIGKILL of the active node to the first delivery on the survivor.
Every figure is the median of ``--runs`` runs.

    python benchmarks/cluster_bench.py --runs 3 --seconds 8 --json
    python benchmarks/cluster_bench.py --cluster-mode active-standby --runs 3 --seconds 8
    python benchmarks/cluster_bench.py --cluster-mode active-standby --nodes 1,3 --scenario transient --skip-failover
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from cluster_failover import cluster_parser, connect_retry, one_run, start_node, throwaway_cluster, wait_port
from loadgen.procs import cpu_seconds

HERE = os.path.dirname(os.path.abspath(__file__))


def start_cluster(url: str, workdir: str, procs: list, count: int, args) -> list[int]:
    """``count`` nodes (the first active); their AMQP ports once every one passes clients on."""
    ports = []
    for i in range(count):
        proc, port_file = start_node(url, f"n{i + 1}", workdir, args.heartbeat, args.failover_timeout)
        procs.append(proc)
        ports.append(wait_port(port_file, 60))
        if i == 0:
            _wait_serving(ports[0])
    for port in ports:
        _wait_serving(port)
    return ports


def _wait_serving(port: int, limit: float = 60.0) -> None:
    connect_retry(port, limit).close()


def load(ports: list[int], args) -> list[dict]:
    """One amqp_load process per port, all at once; their JSON results."""
    cmd = [sys.executable, os.path.join(HERE, "amqp_load.py"), "--scenario", args.scenario, "--seconds",
           str(args.seconds), "--json"]
    procs = [subprocess.Popen(cmd + ["--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for port in ports]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=args.seconds * 4 + 120)
        if p.returncode != 0:
            raise RuntimeError(f"amqp_load failed: {stderr.strip()[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def aggregate(admin_url: str, count: int, args) -> float:
    with throwaway_cluster(admin_url, "eb-cluster-bench-") as (url, workdir, procs):
        ports = start_cluster(url, workdir, procs, count, args)
        spread = [ports[i % count] for i in range(args.queues)]
        return sum(r["consumed_per_s"] for r in load(spread, args))


def local_and_passed_on(admin_url: str, args) -> dict:
    """One load on the active node, then one through the standby: msg/s and CPU µs per message."""
    with throwaway_cluster(admin_url, "eb-cluster-bench-") as (url, workdir, procs):
        active, standby = start_cluster(url, workdir, procs, 2, args)
        pids = [p.pid for p in procs]
        out = {}
        for what, port in (("local", active), ("passed_on", standby)):
            before = [cpu_seconds(pid) for pid in pids]
            result = load([port], args)[0]
            spent = [cpu_seconds(pid) - b for pid, b in zip(pids, before)]
            consumed = result.get("consumed") or result["consumed_per_s"] * args.seconds
            out[what] = {"msg_per_s": result["consumed_per_s"],
                         "active_cpu_us_per_msg": round(spent[0] / consumed * 1e6, 2),
                         "standby_cpu_us_per_msg": round(spent[1] / consumed * 1e6, 2)}
        return out


def main() -> int:
    p = cluster_parser(__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nodes", default="1,2,3", help="node counts to measure, a comma list")
    p.add_argument("--queues", type=int, default=6, help="load processes (one queue each), spread over the nodes")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--scenario", default="persistent",
                   help="amqp_load.py's scenario (default persistent; active-standby only)")
    p.add_argument("--failover-timeout", type=float, default=8.0)
    p.add_argument("--messages", type=int, default=1000, help="messages confirmed before each failover run")
    p.add_argument("--skip-failover", action="store_true")
    p.add_argument("--cluster-mode", choices=("leaders", "active-standby"), default="leaders",
                   help="the nodes' --cluster-mode (default leaders, as the broker's)")
    leaders = p.add_argument_group("--cluster-mode leaders")
    leaders.add_argument("--skip-cost", action="store_true", help="skip the local against forwarded cost")
    leaders.add_argument("--failover-rate", type=float, default=1000.0,
                         help="msg/s the producer publishes during the failover runs")
    leaders.add_argument("--keep-logs", metavar="DIR", help="copy the node logs of a failed run into DIR")
    leaders.add_argument("--json", action="store_true", help="print the report as one JSON line last")
    leaders.add_argument("--node-arg", action="append", default=[], metavar="ARG",
                         help="one more argument for every node's serve, e.g. --node-arg=--no-cluster-connection-handoff")
    args = p.parse_args()
    if args.cluster_mode == "leaders":
        if args.scenario != "persistent":
            p.error("--cluster-mode leaders measures persistent messages with confirms only")
        from cluster_leaders_bench import run_leaders
        return run_leaders(args)
    report: dict = {"scenario": args.scenario, "queues": args.queues, "seconds": args.seconds, "runs": args.runs}
    for count in [int(n) for n in args.nodes.split(",")]:
        rates = [aggregate(args.pg_url, count, args) for _ in range(args.runs)]
        report[f"{count}_nodes_msg_per_s"] = round(statistics.median(rates))
        print(f"{count} node(s): {statistics.median(rates):,.0f} msg/s consumed in all (runs: "
              f"{', '.join(f'{r:,.0f}' for r in rates)})", flush=True)
    pairs = [local_and_passed_on(args.pg_url, args) for _ in range(args.runs)]
    for what in ("local", "passed_on"):
        report[what] = {k: statistics.median(run[what][k] for run in pairs) for k in pairs[0][what]}
    report["passed_on_vs_local_rate"] = round(report["passed_on"]["msg_per_s"] / report["local"]["msg_per_s"], 3)
    print(f"one client on the active node: {report['local']}")
    print(f"one client through a standby:  {report['passed_on']} (rate ratio {report['passed_on_vs_local_rate']})")
    if not args.skip_failover:
        times = [one_run(args.pg_url, args) for _ in range(args.runs)]
        report["failover_seconds_median"] = round(statistics.median(times), 3)
        print(f"failover (SIGKILL to the first delivery on the survivor, timeout {args.failover_timeout} s, "
              f"heartbeat {args.heartbeat} s): {statistics.median(times):.2f} s (runs: "
              f"{', '.join(f'{t:.2f}' for t in times)})")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
