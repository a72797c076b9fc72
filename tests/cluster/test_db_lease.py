"""The rules of a leaders-mode node's hold on the database (``cluster/db_lease.py``), on a
ManualClock: when it may hand out deliveries, when the database counts as lost and regained,
and the eviction and rejoin."""

from __future__ import annotations

from exchange_broker.cluster.db_lease import DbLease
from exchange_broker.core.clock import ManualClock

HEARTBEAT, TIMEOUT = 1.0, 8.0  # the defaults: stale after 7 s


def lease() -> tuple[ManualClock, DbLease]:
    clock = ManualClock(100.0)
    return clock, DbLease(clock.time, HEARTBEAT, TIMEOUT)


def test_good_beats_keep_the_node_delivering():
    clock, hold = lease()
    for _ in range(20):
        clock.advance(HEARTBEAT)
        assert not hold.beat_ok(hold.beat_started())
        assert hold.may_deliver() and hold.state == "held"


def test_failed_beats_keep_it_delivering_until_its_lease_could_have_run_out():
    clock, hold = lease()
    assert hold.beat_failed()          # the first failure is the one "lost" moment
    clock.advance(3)
    assert not hold.beat_failed()      # later ones say nothing
    assert hold.may_deliver()          # 3 s: nobody can have evicted it yet
    clock.advance(4)
    assert hold.may_deliver()          # exactly at the failover timeout minus one beat
    clock.advance(0.01)
    assert not hold.may_deliver()      # past it: another node may lead its queues
    assert hold.seconds_away() > 7


def test_a_beat_that_started_before_the_outage_does_not_renew_the_hold_from_its_answer():
    clock, hold = lease()
    started = hold.beat_started()
    clock.advance(30)                  # the beat hung for 30 s, then got through
    assert hold.overdue() and hold.beat_failed()
    assert hold.beat_ok(started)       # the "regained" moment: its row was still there
    assert not hold.may_deliver()      # but the row was renewed at some time after `started` only
    assert not hold.overdue()          # a beat came back: the database is not away (no second "lost")
    fresh = hold.beat_started()
    clock.advance(0.05)
    assert not hold.beat_ok(fresh) and hold.may_deliver()


def test_an_evicted_node_holds_everything_until_it_rejoined():
    clock, hold = lease()
    hold.beat_failed()
    clock.advance(20)
    hold.evicted()
    assert not hold.may_deliver() and hold.state == "rejoining"
    clock.advance(2)
    assert not hold.may_deliver()      # however long the rejoin takes
    started = hold.beat_started()
    clock.advance(0.1)
    hold.rejoined(started)
    assert hold.may_deliver() and hold.state == "held" and hold.seconds_away() == 0


def test_a_hung_beat_is_noticed_by_the_clock_alone():
    clock, hold = lease()
    clock.advance(6.9)
    assert not hold.overdue()
    clock.advance(0.2)
    assert hold.overdue() and not hold.may_deliver()
    assert hold.beat_failed() and hold.outages == 1
    assert not hold.overdue()          # counted once
