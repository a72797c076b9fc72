"""The stale-node guard of an active/standby node (cluster/node.guard_stale): a node whose last
confirmed heartbeat is older than its lease allows stops before it answers a client. Pure: the
node is built but never joins (no database is reached). A node of a cluster with per-queue
leaders holds its output instead of stopping: cluster/db_lease.py, tests/cluster/test_db_lease.py."""

from __future__ import annotations

import time

import pytest

from exchange_broker.cluster.node import ClusterNode


@pytest.mark.parametrize("kind, serving, then", [
    (ClusterNode, "active", "another node may serve now"),
])
def test_a_node_stops_once_its_last_beat_is_older_than_its_lease(kind, serving, then):
    # the store's engine is made but never connects (nothing here touches the database)
    node = kind("postgresql+psycopg://127.0.0.1:5432/never_used", "n1", heartbeat=1.0,
                failover_timeout=5.0)
    lost: list[str] = []
    node.on_lost = lost.append
    assert node.stale_after == 4.0  # the failover timeout less one beat
    node.role = serving
    node.last_beat_ok = time.monotonic() - 3.5
    node.guard()
    assert lost == [] and node.role == serving
    node.role = "standby"  # not serving: nothing to guard
    node.last_beat_ok = time.monotonic() - 60
    node.guard()
    assert lost == []
    node.role = serving
    node.guard()
    assert node.role == "lost" and len(lost) == 1
    assert lost[0].startswith("its last heartbeat was 60.0 s ago, longer than its lease allows (4.0 s): ")
    assert lost[0].endswith(then)
    node.store.engine.dispose()
