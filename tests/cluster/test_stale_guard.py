"""The stale-node guard of an active/standby node (``ClusterNode.guard``, ``cluster/db_lease.py``):
a node whose last confirmed heartbeat is older than its lease allows holds every client's output
(it may have been replaced) instead of answering, and does not stop for that alone; a node that
lost its role holds everything. And when a standby may end a stale active node
(``cluster/standby_patience.py``): not until the database has answered it for a whole failover
timeout, if it was away for the standby too. Pure: the node is built but never joins (no
database is reached); the rules run on a ManualClock."""

from __future__ import annotations

from exchange_broker.cluster.db_lease import DbLease
from exchange_broker.cluster.node import ClusterNode
from exchange_broker.cluster.standby_patience import StandbyPatience
from exchange_broker.core.clock import ManualClock

HEARTBEAT, TIMEOUT = 1.0, 5.0


def test_an_active_node_holds_its_output_once_its_last_beat_is_older_than_its_lease():
    # the store's engine is made but never connects (nothing here touches the database)
    node = ClusterNode("postgresql+psycopg://127.0.0.1:5432/never_used", "n1", heartbeat=HEARTBEAT,
                       failover_timeout=TIMEOUT)
    clock = ManualClock(100.0)
    node.lease = DbLease(clock.time, HEARTBEAT, TIMEOUT)  # the node's rules, on the test's clock
    lost: list[str] = []
    node.on_lost = lost.append
    assert node.stale_after == 4.0  # the failover timeout less one beat
    node.role = "active"
    clock.advance(3.5)
    assert node.guard() is True
    clock.advance(60)
    assert node.guard() is False                      # may have been replaced: nothing goes out
    assert node.role == "active" and lost == []       # but it does not stop for that
    assert node.lease.state == "away"                 # the one "lost" moment was noted
    node.role = "standby"                             # not serving: nothing to guard
    assert node.guard() is True
    node.role = "active"
    started = node.lease.beat_started()               # a beat renews the store's lease
    clock.advance(0.1)
    assert node.lease.beat_ok(started) and node.guard() is True
    node.role = "lost"                                # replaced: it stops, nothing more goes out
    assert node.guard() is False
    node.store.engine.dispose()


def patience() -> tuple[ManualClock, StandbyPatience]:
    clock = ManualClock(100.0)
    return clock, StandbyPatience(clock.time, HEARTBEAT, TIMEOUT)


def test_a_standby_that_always_reached_the_database_may_end_a_stale_active_node_at_once():
    clock, rule = patience()
    assert not rule.may_end_holder()   # no answer yet: it knows nothing
    for _ in range(10):
        assert not rule.answered()
        assert rule.may_end_holder()
        clock.advance(HEARTBEAT)


def test_a_standby_that_was_away_too_gives_the_active_node_a_failover_timeout():
    clock, rule = patience()
    rule.answered()
    clock.advance(12)                   # its calls hung (or failed) for longer than a lease
    assert not rule.may_end_holder()    # no answer for that long: it is away itself
    assert rule.answered()              # the gap ends: it was away too
    for _ in range(4):
        clock.advance(HEARTBEAT)
        rule.answered()
        assert not rule.may_end_holder()  # the active node may renew its lease meanwhile
    clock.advance(HEARTBEAT)
    rule.answered()
    assert rule.may_end_holder()        # back for a whole failover timeout: a stale node is dead


def test_short_gaps_are_not_an_outage():
    clock, rule = patience()
    rule.answered()
    clock.advance(3.9)                  # a slow call, within the lease
    assert not rule.answered() and rule.may_end_holder()
