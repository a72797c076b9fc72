"""persistence/cluster_leaders.py against a real, throwaway PostgreSQL database: claims, the
eviction of a dead node with its queues spread over the live ones (fewest-led first), fencing of
an evicted node's writes by its own row, transient queues dropped with their node, and a node
cut off from the database in the middle of its own settle (holding the settle lock) still evicted."""

from __future__ import annotations

import contextlib
import socket
import threading

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from eb_support import wait_until
from persistence.cluster_leaders import SETTLE_LOCK, LeadersStore, node_fence
from persistence.cluster_store import ClusterStore, Fenced, session_name
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



@contextlib.contextmanager
def hung_in_its_settle(url, store: ClusterStore, name: str):
    """Node ``name`` (registered through ``store``) as another process whose database connection
    hangs in the middle of its settle: a session with its application_name holding the settle lock
    in a transaction that never ends. Yields that session."""
    host = socket.gethostname()
    with store.transaction() as conn:
        conn.execute(text("UPDATE cluster_nodes SET pid = 999999 WHERE name = :n"), {"n": name})
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    hung = psycopg.connect(conninfo, application_name=session_name(999999, host))
    try:
        hung.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (SETTLE_LOCK,))
        yield hung
    finally:
        hung.close()


def test_a_node_cut_off_in_the_middle_of_its_settle_is_still_evicted(url, made):
    """The others end a dead node's sessions even when they cannot take the settle lock, so the
    next settle evicts it (before, no node could settle again until the server noticed the dead
    connection: with TCP keepalive, hours)."""
    a_store, _a = node(url, made, 1.0)
    b_store, b = node(url, made)
    a_store.register("a", role="leader")
    b_store.register("b", role="leader")
    with hung_in_its_settle(url, a_store, "a") as hung:
        assert wait_until(lambda: b.settle("b")[0] == ["a"], timeout=10, interval=0.2)
        with pytest.raises(psycopg.OperationalError):
            hung.execute("SELECT 1")  # its session was ended
    assert [row["name"] for row in b_store.nodes()] == ["b"]


def test_a_node_starting_while_a_dead_nodes_settle_hangs_joins(url, made):
    """A node (re)starting waits for the settle lock only until the node that holds it in a hung
    transaction is dead: it ends that node's sessions (before, it waited as long as the hang)."""
    a_store, _a = node(url, made, 1.0)
    b_store, b = node(url, made)
    a_store.register("a", role="leader")
    b_store.register("b", role="leader")
    with hung_in_its_settle(url, a_store, "a"):
        resumed = []
        joining = threading.Thread(target=lambda: resumed.append(b.resume("b")), daemon=True)
        joining.start()
        joining.join(15)
        assert resumed == [0]
