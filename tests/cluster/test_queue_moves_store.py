"""persistence/queue_moves.py and persistence/delayed_lease.py against a real, throwaway
PostgreSQL database: the rebalance plan (fewest-led first, counts within one), drain and revive,
the hand-over (epoch + 1, fenced by the old leader's row, refused for a drained or dead target),
and the delayed lease (taken over only from an evicted node)."""

from __future__ import annotations

import pytest

from eb_support import wait_until
from persistence.cluster_leaders import LeadersStore
from persistence.cluster_store import ClusterStore, Fenced
from persistence.delayed_lease import DelayedLease
from persistence.queue_moves import QueueMoves
from persistence.sql_store import SqlStore


@pytest.fixture
def made():
    opened = []
    yield opened
    for thing in opened:
        thing.close()


def store(url, made, timeout: float = 30.0) -> ClusterStore:
    s = ClusterStore(url, timeout)
    made.append(s)
    return s


def test_rebalance_drain_revive_and_hand_over(migrated_url, made):
    sql = SqlStore(migrated_url)
    sql.open(migrate_schema=False)
    made.append(sql)
    sql.put_vhost("/")
    a, b, c = (store(migrated_url, made) for _ in range(3))
    incs = {n: s.register(n, role="leader") for n, s in (("a", a), ("b", b), ("c", c))}
    leaders = LeadersStore(a)
    for i in range(5):
        sql.put_queue("/", f"q{i}", True, False, False, b"", queue_id=100 + i)
        leaders.claim("/", f"q{i}", "a", 100 + i)
    moves = QueueMoves(b)
    planned = moves.rebalance()
    assert sorted((old, new) for _v, _q, old, new in planned) == [("a", "b"), ("a", "b"), ("a", "c")]
    assert moves.rebalance() == []  # asked already: nothing more to move
    assert moves.pending() == 3
    assert sorted(q for _v, q, _to in moves.requested("a")) == sorted(q for _v, q, _o, _n in planned)
    for vhost, queue, old, new in planned:  # each leader hands its queue over itself
        assert moves.handed_over(vhost, queue, old, incs[old], new)
    assert moves.pending() == 0
    led = leaders.leaders()
    assert sorted(leader.node for leader in led.values()) == ["a", "a", "b", "b", "c"]
    assert {leader.epoch for key, leader in led.items() if leader.node != "a"} == {2}
    # drain a: its two queues go to the others, fewest-led first; a is left out of the members
    drained = moves.drain("a")
    assert sorted(new for *_x, new in drained) == ["b", "c"]
    assert "a" not in leaders.members() and moves.draining() == {"a"}
    for vhost, queue, old, new in drained:
        assert moves.handed_over(vhost, queue, old, incs[old], new)
    assert sorted(leader.node for leader in leaders.leaders().values()) == ["b", "b", "b", "c", "c"]
    assert moves.rebalance() == []  # a drained node gets nothing
    # a hand-over to a drained node is refused and the request dropped
    sql.put_queue("/", "late", True, False, False, b"", queue_id=200)
    leaders.claim("/", "late", "b", 200)
    assert not moves.handed_over("/", "late", "b", incs["b"], "a")
    assert leaders.leaders()[("/", "late")].node == "b"
    moves.revive("a")
    assert "a" in leaders.members() and moves.draining() == set()
    assert len(moves.rebalance()) == 2  # a gets its share again: (b 4, c 2, a 0) -> (3, 2, 1) -> (2, 2, 2)
    with pytest.raises(LookupError):
        moves.drain("nobody")
    # a node whose row is gone (evicted) hands nothing over: fenced
    with pytest.raises(Fenced):
        moves.handed_over("/", "q0", "a", incs["a"] + 1, "b")


def test_the_delayed_lease_moves_only_once_its_node_is_evicted(migrated_url, made):
    a = store(migrated_url, made, 0.5)
    b = store(migrated_url, made)
    inc_a, inc_b = a.register("a", role="leader"), b.register("b", role="leader")
    assert DelayedLease(a).claim("a", inc_a).node == "a"
    lease_b = DelayedLease(b)
    assert lease_b.claim("b", inc_b).node == "a"  # a is alive: b forwards to it
    # a stops beating: while its row is there it may still be firing, so b waits...
    assert wait_until(lambda: lease_b.claim("b", inc_b) is None, timeout=10, interval=0.1)
    # ...until a is evicted: then b takes the lease (epoch + 1)
    assert wait_until(lambda: LeadersStore(b).settle("b")[0] == ["a"], timeout=10, interval=0.2)
    taken = lease_b.claim("b", inc_b)
    assert (taken.node, taken.epoch) == ("b", 2)
    with pytest.raises(Fenced):  # the evicted node cannot take it back
        DelayedLease(a).claim("a", inc_a)
