"""When an active/standby cluster's standby may end the active node (sans-IO: ``now`` is a clock's
``time``, a ManualClock's in the tests).

A standby ends the database sessions of an active node whose store lease ran out (``node.py``,
``_end_expired_holder``) so that it can take over. That is right when the active node alone was
paused or cut off, but wrong when the database itself was away for everyone: then every lease ran
out at once, and the first node to get through again would end a live active node that merely
had not beaten yet. So a standby judges only once it has itself reached the database for a whole
failover timeout without a gap: a live active node renews its lease within a heartbeat of the
database coming back, a dead or cut-off one does not.

``answered()`` is called after every call of the standby that the database answered; a gap of
more than a lease between two answers (the calls failed or hung) means it was away too.
"""

from __future__ import annotations

from typing import Callable


class StandbyPatience:
    def __init__(self, now: Callable[[], float], heartbeat: float, failover_timeout: float) -> None:
        self.now = now
        self.failover_timeout = failover_timeout
        self.gap = max(failover_timeout - heartbeat, heartbeat)  # the active node's lease, as it counts it
        self.last_answer: float | None = None
        self.back_since: float | None = None  # None: it has never been away (a fresh standby judges at once)

    def answered(self) -> bool:
        """The database answered a call now: True when this ends a gap (it was away itself)."""
        now = self.now()
        away = self.last_answer is not None and now - self.last_answer > self.gap
        if away:
            self.back_since = now
        self.last_answer = now
        return away

    def may_end_holder(self) -> bool:
        """Whether a stale active node may be ended now: the database answers this standby, and has
        for a whole failover timeout if it was away for it too."""
        now = self.now()
        if self.last_answer is None or now - self.last_answer > self.gap:
            return False
        return self.back_since is None or now - self.back_since >= self.failover_timeout
