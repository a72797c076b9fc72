"""Back-pressure on one client connection, shared by the AMQP and MQTT sessions: queues whose
congestion pauses reading a publisher (credit flow: a queue answers a publish with the action
``Block``, which the session applies with ``apply_actions``, and releases it later with the
``unthrottle`` event of the core's Connection port) and a transport that asks us to stop writing
(``pause_writing``/``resume_writing``). The session provides ``_update_reading()`` (read only
when nothing holds it) and ``_redispatch()`` (let its consumers' queues deliver again)."""

from __future__ import annotations

from exchange_broker.core.actions import Block


class BackPressure:
    throttled_by: set
    paused: bool
    writable: bool

    def apply_actions(self, result):
        """Apply the actions in a queue's answer to a publish from this connection (a ``Block``:
        stop reading it until the queue releases it); returns the rest, the durability waiter."""
        while result.__class__ is Block:
            if not result.paced or self.may_pace():
                self.throttle(result.queue)
            result = result.then
        return result

    def may_pace(self) -> bool:
        """A queue whose consumers are fast but behind may pause this publisher (a paced Block)."""
        return False

    def throttle(self, q) -> None:
        if q not in self.throttled_by:
            self.throttled_by.add(q)
            q.flow_blocked.add(self)
            self._update_reading()

    def unthrottle(self, q) -> None:
        self.throttled_by.discard(q)
        self._update_reading()

    def pause_writing(self) -> None:
        self.paused = True
        self.writable = False
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.writable = True
        self._update_reading()
        self._redispatch()

    def _update_reading(self) -> None:
        raise NotImplementedError

    def _redispatch(self) -> None:
        raise NotImplementedError
