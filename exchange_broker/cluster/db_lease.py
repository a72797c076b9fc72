"""A leaders-mode node's hold on the database, as rules of time (sans-IO: ``now`` is a clock's
``time``, a ManualClock's in the tests).

A node may act as the leader of its queues while its last confirmed heartbeat (the time the beat
*started*: the database renewed the row at some point after it) is younger than ``stale_after``
(failover timeout - one heartbeat): until then no other node can have evicted it. Past that, its
lease *could* have run out and other nodes may lead its queues: it must not hand anything out
(``may_deliver`` False: the durable queues it leads hand out nothing, ``core.queue.delivery_guard``,
and the other nodes' links are cut; transient queues, which nobody takes over, deliver on) until
a beat tells it which it is:

* ``beat_ok``: the row was still there: it had not been evicted, the hold is back (``regained``);
* ``evicted``: the row was gone: the node drops what it led and rejoins (a new incarnation),
  ``rejoined`` then.

It never ends the process. ``lost`` and ``regained`` are the two moments worth one log line each:
the first failed (or hung) beat and the first good one after.
"""

from __future__ import annotations

from typing import Callable

HELD, AWAY, REJOINING = "held", "away", "rejoining"


class DbLease:
    def __init__(self, now: Callable[[], float], heartbeat: float, failover_timeout: float) -> None:
        self.now = now
        self.stale_after = max(failover_timeout - heartbeat, heartbeat)
        self.last_ok = self.last_answer = now()
        self.state = HELD
        self.away_since: float | None = None
        self.outages = 0  # how many times the database went away (for tests and logs)

    # -- what a beat says -----------------------------------------------------------------------------
    def beat_started(self) -> float:
        return self.now()

    def beat_ok(self, started: float) -> bool:
        """A beat that started at ``started`` was committed with this node's row: True when the
        database had been away (the ``regained`` moment)."""
        self.last_ok = max(self.last_ok, started)
        self.last_answer = self.now()
        if self.state == HELD:
            return False
        was_away = self.state == AWAY
        self.state = HELD
        self.away_since = None
        return was_away

    def beat_failed(self) -> bool:
        """A beat failed (the database unreachable): True at the first failure (the ``lost`` moment)."""
        if self.state != HELD:
            return False
        self.state = AWAY
        self.away_since = self.now()
        self.outages += 1
        return True

    def overdue(self) -> bool:
        """No beat has come back for longer than the lease allows (a hung connection): the
        database counts as away."""
        return self.state == HELD and self.now() - self.last_answer > self.stale_after

    def evicted(self) -> None:
        """The database is back and this node's row is gone: it holds nothing until it rejoined."""
        self.state = REJOINING
        self.away_since = self.away_since if self.away_since is not None else self.now()

    def rejoined(self, started: float) -> None:
        """Registered again (a new incarnation) at ``started``: a fresh hold, leading nothing yet."""
        self.state = HELD
        self.away_since = None
        self.last_ok = started
        self.last_answer = self.now()

    # -- what the node may do -----------------------------------------------------------------------
    def may_deliver(self) -> bool:
        """Whether this node may hand out deliveries of the queues it leads now: its lease surely
        runs (and it is not between an eviction and its rejoin)."""
        return self.state != REJOINING and self.now() - self.last_ok <= self.stale_after

    def seconds_away(self) -> float:
        return 0.0 if self.away_since is None else self.now() - self.away_since
