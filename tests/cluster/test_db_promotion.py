"""A cluster with per-queue leaders on a real PostgreSQL primary with a synchronous streaming
standby (``pg_pair.py``), through the libpq multi-host URL an HA setup hands out: the primary dies
(``pg_ctl stop -m immediate``) and the standby is promoted (``pg_ctl promote``) under confirming
publishers and acking consumers on every node. No node exits, confirms resume within 30 s of the
promotion, every confirmed message is consumed."""

from __future__ import annotations

import time

import pytest
from cluster_load import finish_load, run_load
from test_db_outage import flowing, new_twice

from eb_support import pika_connect

LEADERS = ("--cluster-mode", "leaders")

pytestmark = pytest.mark.slow


def test_the_cluster_rides_through_a_promotion_of_its_standby(nodes, pg_pair):
    started = nodes.together(*[(name, *LEADERS) for name in ("n1", "n2", "n3")], urls=[pg_pair.url] * 3)  # peers
    conn = pika_connect(started[0].port)
    conn.channel().queue_declare("promoted", durable=True)
    conn.close()
    publishers, consumers = run_load([n.port for n in started], "promoted")
    try:
        assert flowing(publishers, consumers)
        pg_pair.stop("primary")  # -m immediate: a crash
        time.sleep(1)
        pg_pair.promote()
        promoted = time.monotonic()
        assert flowing(publishers, consumers, more=10, timeout=30)
        every = time.monotonic() - promoted
        first = min(t for p in publishers for t in p.confirm_times if t > promoted) - promoted
        print(f"first confirm {first:.1f} s after the promotion; every client flowing after {every:.1f} s")
        assert first < 30 and every < 30
    finally:
        finish_load(publishers, consumers)
    assert new_twice(publishers, consumers) == []
    for node in started:
        assert node.proc.poll() is None, f"node {node.name} exited"
