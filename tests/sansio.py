"""A sans-IO AMQP client for rule tests: a real ``Session`` fed raw frames on a broker whose
``ManualClock`` the test advances (no socket, no event loop, no sleeping). Output is flushed and
timers fire only when the clock moves, exactly as on the loop.

    clock = ManualClock(); broker = make_broker(clock=clock)
    c = SansIOClient(broker, clock)
    c.call(Q.Declare(queue="q", arguments={"x-message-ttl": 100}))
    c.publish("q", b"x"); clock.advance(0.2); assert c.get("q") is None
"""

from __future__ import annotations

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.connection.session import Session
from exchange_broker.core.clock import ManualClock
from exchange_broker.testing import client_handshake

B, Q, C, E = commands.Basic, commands.Queue, commands.Channel, commands.Exchange
CONFIRM = commands.Confirm


def frames(data: bytes) -> list:
    """Raw server output -> [(channel, pamqp frame)] (the protocol header skipped)."""
    out = []
    while data:
        if data.startswith(b"AMQP"):
            data = data[8:]
            continue
        n, channel, f = pframe.unmarshal(data)
        data = data[n:]
        out.append((channel, f))
    return out


class Delivery:
    """A basic.deliver / basic.get-ok / basic.return with its properties and body."""

    def __init__(self, channel: int, method) -> None:
        self.channel = channel
        self.method = method
        self.properties = None
        self.body = b""

    def __repr__(self) -> str:
        return f"Delivery({type(self.method).__name__}, {self.body!r})"


class SansIOClient:
    """One connection (logged in as guest) with channels opened on demand."""

    def __init__(self, broker, clock: ManualClock, *, channels: tuple[int, ...] = (1,)) -> None:
        self.broker = broker
        self.clock = clock
        self.out: list[bytes] = []
        self.closed_transport = False
        self.session = Session(broker, self.out.append, self._close, ("127.0.0.1", 1))
        self.session.data_received(client_handshake(*channels))
        self.open = set(channels)
        self.closes: list = []    # every channel.close received
        self.deliveries: list[Delivery] = []  # basic.deliver, in arrival order
        self.take()

    def _close(self) -> None:
        self.closed_transport = True

    # -- input ---------------------------------------------------------------------------------
    def send(self, *methods, channel: int = 1) -> None:
        """Frames or methods to the broker (handled now; the replies come out with ``take``)."""
        if channel not in self.open and channel:
            self.session.data_received(pframe.marshal(C.Open(), channel))
            self.open.add(channel)
        self.session.data_received(b"".join(pframe.marshal(m, channel) for m in methods))

    def publish(self, routing_key: str, body: bytes = b"", exchange: str = "", channel: int = 1,
                mandatory: bool = False, **properties) -> None:
        props = commands.Basic.Properties(**properties)
        self.send(B.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
                  pheader.ContentHeader(0, len(body), props), pbody.ContentBody(body), channel=channel)

    # -- output --------------------------------------------------------------------------------
    def take(self) -> list:
        """End the event-loop turn (``clock.advance()``) and return what the broker sent since
        the last ``take``: [(channel, method)], a message's method merged with its content into a
        :class:`Delivery` (basic.deliver ones are also collected in ``deliveries``). A channel the
        broker closes is closed (close-ok) and may be opened again by the next ``send``."""
        self.clock.advance()
        got = []
        current = None
        for channel, f in frames(b"".join(self.out)):
            if isinstance(f, pheader.ContentHeader):
                current.properties = f.properties
                continue
            if isinstance(f, pbody.ContentBody):
                current.body += f.value
                continue
            if isinstance(f, (B.Deliver, B.GetOk, B.Return)):
                f = current = Delivery(channel, f)
                if isinstance(f.method, B.Deliver):
                    self.deliveries.append(f)
            elif isinstance(f, C.Close):
                self.open.discard(channel)
                self.closes.append(f)
                self.session.data_received(pframe.marshal(C.CloseOk(), channel))
            got.append((channel, f))
        self.out.clear()
        return got

    def call(self, method, channel: int = 1):
        """Send one synchronous method; its reply (or the channel.close refusing it)."""
        self.send(method, channel=channel)
        return next((f for ch, f in self.take() if ch == channel and
                     not isinstance(f, (Delivery, C.OpenOk))), None)

    def close_channel(self, channel: int) -> None:
        """channel.close from the client (its unacked messages go back to their queues)."""
        self.call(C.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), channel)
        self.open.discard(channel)

    def get(self, queue: str, no_ack: bool = True, channel: int = 1) -> Delivery | None:
        """basic.get: the message, None on get-empty (AssertionError if the channel is closed)."""
        self.send(B.Get(queue=queue, no_ack=no_ack), channel=channel)
        for ch, f in self.take():
            if ch == channel and isinstance(f, Delivery) and isinstance(f.method, B.GetOk):
                return f
            if ch == channel and isinstance(f, C.Close):
                raise AssertionError(f"channel closed: {f.reply_code} {f.reply_text}")
        return None

    def get_all(self, queue: str, channel: int = 1) -> list[bytes]:
        """basic.get (no-ack) until empty: the bodies."""
        bodies = []
        while (d := self.get(queue, channel=channel)) is not None:
            bodies.append(d.body)
        return bodies

    def exists(self, queue: str) -> bool:
        """A passive queue.declare on a channel of its own (it counts as use, as in RabbitMQ)."""
        reply = self.call(Q.Declare(queue=queue, passive=True), channel=99)
        return isinstance(reply, Q.DeclareOk)
