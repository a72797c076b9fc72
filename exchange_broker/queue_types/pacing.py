"""Publisher pacing: flow control for a queue whose consumers are fast but fall behind.

RabbitMQ's credit flow bounds how far a publishing connection may run ahead of the queue process
it feeds: the queue hands credit back only as it gets through its mailbox, in which publishes and
its consumers' acks wait in arrival order. A busy queue thus splits its time between taking
messages and delivering them, and the publisher's reader shows the connection state ``flow``.

This broker is one thread: a publisher that writes as fast as it can takes most turns of the
event loop, a consumer's acks wait behind its input, each prefetch window (say 200 messages) takes
a whole crowded turn to come round, and the queue grows while its consumer starves. So a classic
queue has the connections that publish into it stop *reading* (its ``enqueue`` answers with the
action ``Block``, which the publishing channel applies: the same switch as RabbitMQ's,
``Session.throttle``; the admin API shows ``flow``) when

* its ready backlog is past :data:`HIGH` messages, and
* it has consumers that drain it fast: at the rate its consumers took messages over the last
  :data:`RATE_WINDOW` s or so, the backlog above :data:`LOW` would be gone within
  :data:`MAX_DRAIN` s, and
* the publishing connection consumes nothing itself (no consumer, no unacknowledged delivery on
  any of its channels): pausing it never holds back acks a queue waits for, so pausing cannot
  deadlock (a connection that publishes into the queue it consumes, two connections that feed
  each other's queues), and
* pacing is on (``--no-publisher-pacing`` turns it off: ``Config.publisher_pacing``).

The last two only the connection knows: the queue answers a *paced* ``Block`` and the connection
applies it only if it may be paced (``Session.may_pace``); the queue never looks into the
publisher. A full consumer socket (``congested``) pauses any publisher.

It reads them again once the queue is below :data:`LOW`, its consumers are gone, the queue is
deleted or, at the latest, after :data:`MAX_HOLD` s (consumers that slowed down meanwhile do not
keep a publisher waiting: the next look measures their new rate).

An ordinary backlog is never paced: no consumers, or consumers that take messages slowly (a slow
worker at its prefetch limit), make the drain time long. Nor are confirms delayed: what was
published before the pause is confirmed as usual, and transactions commit as usual.
"""

from __future__ import annotations

HIGH = 8000          # ready messages before a publisher may be paced (and before a consumer's full
LOW = 2000           # socket pauses it, see ClassicQueue.congested); read again below LOW
RATE_WINDOW = 0.1    # s: the consumers' rate is measured over at least this long
STALE = 1.0          # s: a measurement this old says nothing about the current rate
MAX_DRAIN = 0.5      # s: paced only if the consumers take the backlog down to LOW within this
MAX_HOLD = 1.0       # s: the longest one pause lasts
CHECK_MASK = 63      # look once every 64 publishes (the pause takes effect after the input slice)


class Pacer:
    """One queue's delivery rate, measured from its ``stats_delivered`` when publishes look."""

    __slots__ = ("queue", "t0", "d0", "rate", "timer")

    def __init__(self, queue) -> None:
        self.queue = queue
        self.t0 = -STALE - 1.0
        self.d0 = 0
        self.rate = 0.0
        self.timer = None

    def sample(self) -> float:
        q = self.queue
        now = q.broker.clock.time()
        dt = now - self.t0
        if dt >= RATE_WINDOW and dt > 0.0:
            self.rate = (q.stats_delivered - self.d0) / dt if dt <= STALE else 0.0
            self.t0, self.d0 = now, q.stats_delivered
        return self.rate

    def fast_enough(self, ready: int) -> bool:
        rate = self.rate
        return rate > 0.0 and (ready - LOW) <= rate * MAX_DRAIN

    def hold(self) -> None:
        """A publisher is paused (by the caller, told so): it is read again in MAX_HOLD s at the latest."""
        if self.timer is None:
            self.timer = self.queue.broker.clock.call_later(MAX_HOLD, self._expire)

    def _expire(self) -> None:
        self.timer = None
        q = self.queue
        if q.flow_blocked:
            q.release_publishers()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


CONGESTED, PACED = 1, 2  # what ``look`` may answer besides 0 (nothing to do)


def look(queue, publisher, ready: int) -> int:
    """After a publish into ``queue`` (``ready`` messages now ready): CONGESTED when a consumer's
    socket is full (the publisher is paused, as RabbitMQ's flow would), PACED when its consumers
    are fast but behind (the publisher is paused if its connection may be paced: it consumes
    nothing and pacing is on, which only the connection knows), else 0. The queue's ``enqueue``
    answers ``Block`` (paced or not); ``publisher`` is only compared with the ones it holds."""
    pacer = queue.pacer
    if pacer is None:
        pacer = queue.pacer = Pacer(queue)
    pacer.sample()
    if ready <= HIGH or publisher in queue.flow_blocked or not queue.consumers:
        return 0
    verdict = CONGESTED if queue.congested() else PACED if pacer.fast_enough(ready) else 0
    if verdict:
        pacer.hold()
    return verdict
