"""persistence/cluster_leaders.py against a real, throwaway PostgreSQL database: claims, the
eviction of a dead node with its queues spread over the live ones (fewest-led first), fencing of
an evicted node's writes by its own row, and transient queues dropped with their node."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from eb_support import wait_until
from persistence.cluster_leaders import LeadersStore, node_fence
from persistence.cluster_store import ClusterStore, Fenced
from persistence.sql_store import SqlStore


@pytest.fixture
def url(migrated_url) -> str:
    return migrated_url


@pytest.fixture
def made(url):
    opened = []
    yield opened
    for thing in opened:
        thing.close()


def node(url, made, timeout: float = 30.0) -> tuple[ClusterStore, LeadersStore]:
    store = ClusterStore(url, timeout)
    made.append(store)
    return store, LeadersStore(store)


def queue_row(sql: SqlStore, name: str, queue_id: int, durable: bool = True) -> None:
    sql.put_queue("/", name, durable, False, False, b"", queue_id=queue_id)


def test_a_dead_nodes_queues_are_spread_and_its_writes_fenced(url, made):
    sql = SqlStore(url)
    sql.open(migrate_schema=False)
    made.append(sql)
    sql.put_vhost("/")
    a_store, a = node(url, made, 3.0)  # a's claims below must not race its timeout on a busy machine
    b_store, b = node(url, made)
    c_store, c = node(url, made)
    inc_a = a_store.register("a", role="leader")
    b_store.register("b", role="leader")
    c_store.register("c", role="leader")
    for i in range(4):
        queue_row(sql, f"q{i}", 100 + i)
        leader, elsewhere = a.claim("/", f"q{i}", "a", 100 + i)
        assert (leader.node, elsewhere) == ("a", False)
    queue_row(sql, "temp", 200, durable=False)
    a.claim("/", "temp", "a", 200)
    # a second claim of a's queue by b: a is alive, so a keeps it
    leader, elsewhere = b.claim("/", "q0", "b", 999)
    assert (leader.node, elsewhere) == ("a", True)
    # a's writes pass its fence while it is registered
    sql.write_fence = lambda conn: node_fence(conn, "a", inc_a)
    sql.put_queue("/", "fenced-check", True, False, False, b"", queue_id=300)
    # a stops beating; b evicts it and spreads its durable queues, the transient one goes
    assert wait_until(lambda: b.settle("b")[0] == ["a"], timeout=10, interval=0.2)
    leaders = b.leaders()
    assert sorted(leader.node for key, leader in leaders.items() if key[1].startswith("q")) == ["b", "b", "c", "c"]
    assert all(leader.epoch == 2 for key, leader in leaders.items() if key[1].startswith("q"))
    assert ("/", "temp") not in leaders
    with sql._engine.connect() as conn:  # noqa: SLF001
        assert conn.execute(text("SELECT count(*) FROM queues WHERE name = 'temp'")).scalar() == 0
    # the evicted node's next write fails: its row is gone
    with pytest.raises(Fenced):
        sql.put_queue("/", "after-eviction", True, False, False, b"", queue_id=301)
    with sql._engine.connect() as conn:  # noqa: SLF001
        assert conn.execute(text("SELECT count(*) FROM queues WHERE name = 'after-eviction'")).scalar() == 0
    # nothing more to do at the next settle
    assert b.settle("b") == ([], 0)
