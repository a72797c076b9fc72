"""The cluster benchmark runs end to end on a throwaway PostgreSQL database with small settings and
reports every figure it claims (never checking speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
PG_URL = os.environ.get("EB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1/test")


@pytest.mark.slow
def test_cluster_bench_reports_each_node_count_the_passed_on_cost_and_failover(pg_database):
    out = subprocess.run([sys.executable, str(BENCH / "cluster_bench.py"), "--cluster-mode", "active-standby",
                          "--pg-url", PG_URL, "--runs", "1",
                          "--nodes", "1,2", "--queues", "2", "--seconds", "2", "--scenario", "transient",
                          "--heartbeat", "0.5", "--failover-timeout", "3", "--messages", "50"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["1_nodes_msg_per_s"] > 0 and report["2_nodes_msg_per_s"] > 0
    assert report["local"]["msg_per_s"] > 0 and report["passed_on"]["msg_per_s"] > 0
    assert report["passed_on"]["standby_cpu_us_per_msg"] > 0  # the standby did the splicing
    assert 0 < report["failover_seconds_median"] < 60
