"""Busy waiting: after input, the event loop keeps polling its sockets for a short while before
it goes to sleep in the kernel.

A process asleep in ``epoll_wait`` takes tens of microseconds to wake when the next message
arrives (longer on a virtual machine whose idle CPU was given back to the host). A client that
publishes one message and waits for its confirm pays that on every message. Erlang's schedulers
spin for a while before they sleep (``+sbwt``, on by default, so in RabbitMQ): this is the same
for this broker's one event loop. While it spins, the loop runs a callback that reschedules
itself, so the loop polls with a zero timeout; once ``seconds`` have passed without input it
stops, and an idle broker sleeps as before."""

from __future__ import annotations

import time
from typing import Callable


class BusyWait:
    """Keeps ``loop`` polling for ``seconds`` after the last ``touch()`` (a read)."""

    def __init__(self, loop, seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.loop = loop
        self.seconds = seconds
        self.clock = clock
        self.last = 0.0
        self.spinning = False
        self.turns = 0  # loop turns spent polling (for tests and curiosity)

    def touch(self) -> None:
        """Input arrived: poll again for ``seconds`` from now."""
        self.last = self.clock()
        if not self.spinning:
            self.spinning = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self.clock() - self.last < self.seconds:
            self.turns += 1
            self.loop.call_soon(self._turn)
        else:
            self.spinning = False
