"""An active/standby cluster rides through its database going away (``cluster/node.py``,
``db_lease.py``, ``standby_patience.py``): two real node processes, each reaching PostgreSQL
through its own TCP proxy (``tcp_proxy.py``), under four publishers with confirms and two acking
consumers. Every node's database connections hang for longer than the lease: no node exits, the
active node holds its clients' output meanwhile and serves on after the heal (the standby does not
take over from a live active node), and every confirmed message is consumed."""

from __future__ import annotations

import time

import pytest
from cluster_load import finish_load, run_load
from cluster_support import FAILOVER_TIMEOUT

from eb_support import wait_until
from persistence.database_url import parse

OUTAGE = float(FAILOVER_TIMEOUT) * 3  # well past the active node's lease

pytestmark = pytest.mark.slow


def more_flowing(publishers, consumers, more: int = 30, timeout: float = 60) -> bool:
    confirmed = {id(p): len(p.confirmed) for p in publishers}
    got = {id(c): len(c.got) for c in consumers}
    return bool(wait_until(lambda: all(len(p.confirmed) > confirmed[id(p)] + more for p in publishers) and
                           all(len(c.got) > got[id(c)] + more for c in consumers), timeout=timeout))


def test_the_active_node_rides_through_every_nodes_database_connections_hanging(nodes, cluster_url, tcp_proxy):
    db = parse(cluster_url)
    host, port = db.hosts[0].rsplit(":", 1)
    started = []
    for name in ("s1", "s2"):
        proxy = tcp_proxy(host, int(port))
        url = f"postgresql://{db.param('user')}@{proxy.address}/{db.param('dbname')}"
        started.append((nodes(name, url=url), proxy))
    (active, _), (standby, _) = started
    assert active.is_active() and not standby.is_active()
    publishers, consumers = run_load([active.port, standby.port], "standby-hang")  # the standby passes them on
    try:
        assert more_flowing(publishers, consumers)
        for _, proxy in started:
            proxy.hang()
        time.sleep(OUTAGE)
        for _, proxy in started:
            proxy.heal()
        healed = time.monotonic()
        assert more_flowing(publishers, consumers, timeout=90)
        print(f"confirms flowing again {time.monotonic() - healed:.1f} s after the heal")
    finally:
        finish_load(publishers, consumers)  # every confirmed message consumed
    for node, _ in started:
        assert node.proc.poll() is None, f"node {node.name} exited ({node.proc.returncode})"
        assert "stops serving" not in node.log()
    assert active.wait_for_log("cannot reach the database", 5)
    assert active.wait_for_log("reaches the database again and still holds the store's lease", 5)
    assert not standby.is_active()  # the live active node was not replaced
