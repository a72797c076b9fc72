"""Back-pressure on one client connection, shared by the AMQP and MQTT sessions: queues whose
congestion pauses reading a publisher (credit flow, ``throttle``/``unthrottle`` of the core's
Connection port) and a transport that asks us to stop writing (``pause_writing``/
``resume_writing``). The session provides ``_update_reading()`` (read only when nothing holds it)
and ``_redispatch()`` (let its consumers' queues deliver again)."""

from __future__ import annotations


class BackPressure:
    throttled_by: set
    paused: bool
    writable: bool

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
