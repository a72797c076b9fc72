"""The order of a connection's output: held places for replies that are not ready yet.

A reply the broker cannot send at once (a declare-ok waiting for the store to commit the
definition) takes a place in its channel's output with :meth:`Output.hold`; whatever that channel
sends afterwards (later replies, deliveries, its close-ok) waits behind the place until it is
filled, so the client sees the replies in the order of its requests. A capturing place takes
the channel's output into itself until it is sealed or filled (a closing channel's last confirms
go there, ahead of its close-ok, while a new channel of the same number queues behind). The
connection's close-ok waits until no channel has anything held. Channels with nothing held pay
one dict lookup.
"""

from __future__ import annotations

from collections import deque


class Outbox:
    """A mixin of both connection ends: ``_out`` holds frames ready to write, in order;
    ``data_to_send`` takes them all."""

    _out: list[bytes]

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    @property
    def has_output(self) -> bool:
        return bool(self._out)


class Slot:
    """A place in one channel's output, filled later (with bytes, or with nothing)."""

    __slots__ = ("channel", "parts", "filled", "live", "capturing")

    def __init__(self, channel: int, capturing: bool = False) -> None:
        self.channel = channel
        self.parts: list[bytes] = []
        self.filled = False
        self.live = True   # False once dropped (the connection closed with an error)
        self.capturing = capturing  # the channel's output goes into this place for now


class Output:
    """Frames ready to write (``ready``) and, per channel, what waits behind a held place."""

    __slots__ = ("ready", "held", "final")

    def __init__(self) -> None:
        self.ready: list[bytes] = []
        self.held: dict[int, deque] = {}     # channel -> deque of bytes and Slots
        self.final: list[bytes] = []         # waits until nothing is held (connection close-ok)

    def add(self, channel: int, data: bytes) -> None:
        queue = self.held.get(channel) if self.held else None
        if queue is None:
            self.ready.append(data)
            return
        last = queue[-1]
        if type(last) is Slot and last.capturing:
            last.parts.append(data)
        else:
            queue.append(data)

    def extend(self, channel: int, parts: list) -> None:
        if not self.held or channel not in self.held:
            self.ready.extend(parts)
        else:
            self.add(channel, b"".join(parts))

    def hold(self, channel: int, capturing: bool = False) -> Slot:
        queue = self.held.get(channel)
        if queue is None:
            queue = self.held[channel] = deque()
        else:
            self.seal(queue[-1])
        slot = Slot(channel, capturing)
        queue.append(slot)
        return slot

    def seal(self, slot) -> None:
        """What the channel sends from now on goes behind ``slot``, no longer into it."""
        if type(slot) is Slot:
            slot.capturing = False

    def put(self, slot: Slot, data: bytes) -> None:
        """Add to a held place that is not filled yet (sealed or not)."""
        if slot.live and not slot.filled:
            slot.parts.append(data)

    def fill(self, slot: Slot, data: bytes = b"") -> None:
        if not slot.live or slot.filled:
            return
        if data:
            slot.parts.append(data)
        slot.filled, slot.capturing = True, False
        queue = self.held.get(slot.channel)
        if queue is None:
            return
        ready = self.ready
        while queue:
            item = queue[0]
            if type(item) is Slot:
                if not item.filled:
                    return
                ready.extend(item.parts)
            else:
                ready.append(item)
            queue.popleft()
        del self.held[slot.channel]
        if not self.held and self.final:
            ready.extend(self.final)
            self.final.clear()

    def add_final(self, data: bytes) -> None:
        """Send once every held place is filled (at once when none is)."""
        if self.held:
            self.final.append(data)
        else:
            self.ready.append(data)

    def drop_held(self) -> None:
        """The connection is closed with an error: what waits is never sent."""
        for queue in self.held.values():
            for item in queue:
                if type(item) is Slot:
                    item.live = False
        self.held.clear()
        self.final.clear()

    @property
    def waiting(self) -> bool:
        return bool(self.held or self.final)
