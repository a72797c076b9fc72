"""Publisher confirms (confirm.select, then basic.ack/nack per publish), a part of :class:`Channel`.

A publish is confirmed once every queue it reached has it stored (its durability waiter fired);
confirms go out in order, acks coalesced into one ``multiple`` ack per flush, a nack at once.
``unconfirmed`` holds runs of consecutive publishes in one state: ``[first seq, last seq,
state]`` (0 pending, 1 ack, 2 nack); the publishes waiting on one store batch extend one run.

With ``serve --database-outage-nack-after SECONDS`` (``Broker.confirm_nack_after``), the publishes
of a store batch that has not committed after that long (the database is away or hung) are nacked
(``nack_overdue``, from the broker's tick); if the batch commits later, nothing more is sent for
them (the messages are stored then: a nack means "not confirmed", not "discarded").
"""

from __future__ import annotations

from collections import deque

from pamqp import commands

from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError


class ConfirmMethods:
    """Mixed into Channel: uses its ``session``, ``number``, ``closed``, ``tx`` and ``reply``."""

    confirm = False
    confirm_queued = False  # waiting in the session's confirm flush
    _confirm_group = None   # (waiter, entries): the publishes waiting on the latest store batch

    def _confirm_init(self) -> None:
        self.publish_seq = 0
        self.unconfirmed: deque[list] = deque()   # runs [first, last, state]: 0 pending, 1 ack, 2 nack
        self.ack_upto = 0                          # confirmed contiguously, not yet sent
        # (started, group) of the store batches waited on, oldest first (with a nack bound only)
        self.waiting_groups: deque[tuple[float, tuple]] = deque()

    def _confirm_select(self, m) -> None:
        if self.tx:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10,
                            hard=False)
        self.confirm = True
        if not m.nowait:
            self.reply(commands.Confirm.SelectOk())

    def _confirm_enqueue(self, seq: int, state: int) -> None:
        if not self.unconfirmed and state == 1:
            self.ack_upto = seq
            self.session.want_confirm_flush(self)
        else:
            self.unconfirmed.append([seq, seq, state])
            self._drain_confirms()

    def _await_store(self, seq: int, waiter) -> None:
        """Publish ``seq`` is confirmed once ``waiter`` (its store batch) fires. The publishes of
        one batch wait as one group: one callback, one drain, and, when nothing came between
        them, one run of ``unconfirmed``, however many they are."""
        if waiter.done:  # decided already (a cluster placeholder with no leader nacks at once)
            self._confirm_enqueue(seq, 1 if waiter.ok else 2)
            return
        unconfirmed = self.unconfirmed
        group = self._confirm_group
        if group is not None and group[0] is waiter and not waiter.done:
            runs = group[1]
            last = runs[-1]
            if last[1] == seq - 1 and unconfirmed and unconfirmed[-1] is last:
                last[1] = seq
                return
            entry = [seq, seq, 0]
            runs.append(entry)
        else:
            entry = [seq, seq, 0]
            group = self._confirm_group = (waiter, [entry])
            waiter.add(self._confirmed, group)
            broker = self.session.broker
            if broker.confirm_nack_after:
                self.waiting_groups.append((broker.clock.time(), group))
        unconfirmed.append(entry)

    def _confirmed(self, group: tuple, ok: bool) -> None:
        state = 1 if ok else 2
        for entry in group[1]:
            if not entry[2]:  # (nacked already by ``nack_overdue``: it stays nacked)
                entry[2] = state
        if self._confirm_group is group:
            self._confirm_group = None
        self._drain_confirms()

    def nack_overdue(self, now: float, bound: float) -> int:
        """Nack the publishes whose store batch started waiting ``bound`` seconds or more before
        ``now`` and has not committed; returns how many runs were nacked."""
        waiting = self.waiting_groups
        nacked = 0
        while waiting and (waiting[0][1][0].done or now - waiting[0][0] >= bound):
            _started, group = waiting.popleft()
            if group[0].done:
                continue
            for entry in group[1]:
                if not entry[2]:
                    entry[2] = 2
                    nacked += 1
            if self._confirm_group is group:
                self._confirm_group = None  # later publishes of that batch wait in a group of their own
        if nacked and not self.closed:
            self._drain_confirms()
        return nacked

    def unconfirmed_count(self) -> int:
        return sum(last - first + 1 for first, last, _state in self.unconfirmed)

    def _drain_confirms(self) -> None:
        unconfirmed = self.unconfirmed
        conn = self.session.conn
        while unconfirmed and unconfirmed[0][2]:
            first, last, state = unconfirmed.popleft()
            if state == 1:
                self.ack_upto = last
            else:
                self.flush_confirms()
                for seq in range(first, last + 1):
                    conn.send_raw(codec.nack_frame(self.number, seq, False))
        if self.ack_upto:
            self.session.want_confirm_flush(self)
        self.session.mark_dirty()

    def flush_confirms(self) -> None:
        if self.ack_upto and not self.closed:
            self.session.conn.send_raw(codec.ack_frame(self.number, self.ack_upto, True))
            self.session.mark_dirty()
        self.ack_upto = 0
