"""persistence/cluster_store.py against a real, throwaway PostgreSQL database: membership by the
database's clock, lease epochs that grow on every change of leader, fencing of a stale leader's
writes, and the definitions version with LISTEN/NOTIFY."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from eb_support import wait_until
from persistence.cluster_store import ClusterStore, DefinitionsListener, Fenced, NodeNameInUse


@pytest.fixture
def url(migrated_url) -> str:
    return migrated_url


@pytest.fixture
def stores(url):
    """stores(timeout) -> a ClusterStore with that failover timeout (each one a "node")."""
    made = []

    def make(timeout: float = 10.0) -> ClusterStore:
        s = ClusterStore(url, timeout)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_nodes_register_beat_and_die_by_the_database_clock(stores):
    a, b = stores(2), stores(30)  # 2 s: "alive" below must not race a's timeout on a busy machine
    inc_a = a.register("a", role="active", amqp_address="127.0.0.1:1", admin_address="")
    inc_b = b.register("b", role="standby")
    assert (inc_a, inc_b) == (1, 1)
    view = {n["name"]: n for n in b.nodes()}
    assert view["a"]["alive"] and view["b"]["alive"]
    assert view["a"]["amqp_address"] == "127.0.0.1:1" and view["a"]["role"] == "active"
    # a stops beating: dead once its own failover timeout (2 s) has passed on the server's clock
    assert wait_until(lambda: not {n["name"]: n for n in b.nodes()}["a"]["alive"], timeout=10)
    assert b.heartbeat("b", inc_b)
    assert b.live_nodes() == ["b"]
    # a comes back: a new incarnation; the old one's heartbeats are refused from now on
    assert a.register("a", role="standby") == 2
    assert not a.heartbeat("a", inc_a) and a.heartbeat("a", 2)
    a.deregister("a", 2)
    assert [n["name"] for n in b.nodes()] == ["b"]
    # an evicted process (its row deleted) joins again above its old incarnation, never as it
    assert a.register("a", role="leader", at_least=3) == 3
    assert not a.heartbeat("a", 2) and a.heartbeat("a", 3)


def test_a_live_node_name_is_not_taken_by_another_process(stores, url):
    a = stores()
    a.register("n1", role="active")
    with a.transaction() as conn:  # the row now says: another process on another host
        conn.execute(text("UPDATE cluster_nodes SET pid = 1, host = 'elsewhere' WHERE name = 'n1'"))
    with pytest.raises(NodeNameInUse, match="'n1' is in use by a live node .pid 1 on host elsewhere"):
        stores().register("n1", role="standby")


def test_lease_epochs_grow_with_each_new_leader_and_fence_a_stale_one(stores):
    a, b = stores(2), stores(2)  # the lease must outlast the steps before the "pause" on a busy machine
    first = a.take_lease("/", "q", "a")
    assert first.epoch == 1 and first.leader == "a"
    assert a.take_lease("/", "q", "a").epoch == 1  # renewing our own lease keeps the epoch
    assert b.take_lease("/", "q", "b") is None  # a's lease runs
    assert b.lease_of("/", "q") == first
    # a is "paused": it renews nothing; once the lease ran out b takes it over with epoch 2
    taken = wait_until(lambda: b.take_lease("/", "q", "b"), timeout=10)
    assert taken.epoch == 2 and taken.leader == "b"

    def write(conn):
        conn.execute(text("INSERT INTO cluster_counters (name, value) VALUES ('written-by', :e) "
                          "ON CONFLICT (name) DO UPDATE SET value = excluded.value"), {"e": 0})
        return "written"

    with pytest.raises(Fenced, match="node 'a' no longer leads it with epoch 1"):
        a.write_fenced(first, write)  # a wakes up and tries to write: refused, nothing written
    with a.transaction() as conn:
        assert conn.execute(text("SELECT count(*) FROM cluster_counters WHERE name = 'written-by'")).scalar() == 0
    assert not a.renew_lease(first)
    assert b.write_fenced(taken, write) == "written"
    assert b.renew_lease(taken)
    # a takes it back later: epoch 3, and b's epoch-2 writes are fenced in turn
    assert b.release_lease(taken)
    back = a.take_lease("/", "q", "a")
    assert back.epoch == 3
    with pytest.raises(Fenced):
        b.write_fenced(taken, write)
    assert {n for n in [a.lease_of("/", "q")]} == {back}


def test_racing_nodes_one_wins_a_free_lease(stores):
    nodes = [stores(10) for _ in range(4)]
    won: list = []
    barrier = threading.Barrier(len(nodes))

    def race(i: int) -> None:
        barrier.wait()
        lease = nodes[i].take_lease("v", "contended", f"n{i}")
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(won) == 1 and won[0].epoch == 1


def test_heartbeat_renews_a_nodes_leases(stores):
    a, b = stores(30), stores(30)
    inc = a.register("a", role="active")
    lease = a.take_lease("/", "kept", "a")

    def expiry():
        with b.transaction() as conn:
            return conn.execute(text("SELECT expires_at FROM queue_leases WHERE queue = 'kept'")).scalar_one()

    before = expiry()
    assert wait_until(lambda: a.heartbeat("a", inc) and expiry() > before, timeout=10)  # pushed further out
    assert b.take_lease("/", "kept", "b") is None
    assert [n["queues"] for n in b.nodes() if n["name"] == "a"] == [[{"vhost": "/", "name": "kept", "epoch": 1}]]
    a.deregister("a", inc)  # a clean stop ends its leases at once
    assert b.take_lease("/", "kept", "b").epoch == lease.epoch + 1


def test_definitions_version_notifies_and_a_gap_reloads(stores):
    a, b = stores(), stores()
    seen: list = []
    listener = DefinitionsListener(b, b.definitions_version(), lambda v: seen.append(("changed", v)),
                                   lambda v: seen.append(("reload", v)), poll=0.2).start()
    try:
        assert listener.listening.wait(10)
        assert a.bump_definitions() == 1
        assert wait_until(lambda: ("changed", 1) in seen, timeout=10)
        with a.transaction() as conn:  # a change whose transaction rolls back announces nothing
            a.bump_definitions(conn)
            conn.rollback()
        listener.known = 0  # as if this node had missed version 1 and more
        assert a.bump_definitions() == 2
        assert wait_until(lambda: ("reload", 2) in seen, timeout=10)
        assert seen == [("changed", 1), ("reload", 2)]
    finally:
        listener.stop()


def test_every_write_of_a_fenced_store_fails_and_writes_nothing(stores, url):
    from persistence.cluster_store import STORE_LEASE, fence
    from persistence.sql_store import SqlStore
    a, b = stores(2), stores(2)  # the lease must outlast store.open() and the first write on a busy machine
    lease = a.take_lease(*STORE_LEASE, "a")
    store = SqlStore(url)
    store.open()
    try:
        store.write_fence = lambda conn: fence(conn, lease)
        store.put_vhost("written-while-leading")
        taken = wait_until(lambda: b.take_lease(*STORE_LEASE, "b"), timeout=10)  # a paused past its lease
        assert taken.epoch == lease.epoch + 1
        with pytest.raises(Fenced):
            store.put_vhost("written-after-the-take-over")
        names = {v["name"] for v in store.load_definitions().vhosts}
        assert "written-while-leading" in names and "written-after-the-take-over" not in names
    finally:
        store.close()
