"""``cluster_bench.py --cluster-mode leaders`` runs end to end on throwaway PostgreSQL databases with
tiny settings, reports every figure it claims (never checking speed) and loses no confirmed
message, failover included. (A failover timeout of 3 s, not less: on a busy machine a node that
misses its beats for longer is evicted, as designed, and the run fails.)"""

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
def test_leaders_bench_reports_local_forwarded_cost_and_failover_and_loses_nothing(pg_database, tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "cluster_bench.py"), "--cluster-mode", "leaders",
                          "--pg-url", PG_URL, "--runs", "1", "--nodes", "2", "--queues", "2", "--seconds", "2",
                          "--heartbeat", "0.5", "--failover-timeout", "3", "--failover-rate", "500",
                          "--keep-logs", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + _node_logs(tmp_path)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["2_nodes_local_msg_per_s"] > 0 and report["2_nodes_forwarded_msg_per_s"] > 0
    assert report["local"]["msg_per_s"] > 0 and report["forwarded"]["msg_per_s"] > 0
    assert report["local"]["cpu_s_per_1000_msg"] > 0
    assert report["forwarded"]["other_cpu_s_per_1000_msg"] > 0  # node 2 did the forwarding
    assert 0 < report["failover_seconds_median"] < 60
    (run,) = report["failover_runs"]
    assert run["confirmed"] > run["consumed_before_kill"] > 0  # publishing went on through the survivor
    assert run["missing"] == 0 and report["lost"] == 0 and report["nacked_outside_failover"] == 0
    assert "confirmed but never consumed" in out.stdout  # the table


def _node_logs(kept: Path) -> str:
    """The ends of the node logs of a failed run (``--keep-logs``)."""
    return "".join(f"\n--- {log}:\n{log.read_text(errors='replace')[-2000:]}" for log in sorted(kept.rglob("*.log")))
