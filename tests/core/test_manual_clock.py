"""The core runs without an event loop: a Session fed raw bytes on a broker whose clock a test
advances by hand (core/clock.ManualClock). Output is flushed and timers fire only when the clock
is advanced."""

from __future__ import annotations

from pamqp import commands
from pamqp import frame as pframe
from sansio import frames as framed

from exchange_broker.testing import client_handshake
from exchange_broker.assembly import make_broker
from exchange_broker.connection.session import Session
from exchange_broker.core.clock import ManualClock


def frames(data: bytes) -> list:
    return [f for _channel, f in framed(data)]


HANDSHAKE = client_handshake(1)


def connect(broker):
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    sess.data_received(HANDSHAKE)
    return sess, out


def test_output_waits_for_the_clock_then_comes_in_order():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    sess, out = connect(broker)
    assert out == []  # nothing is written until the loop turn ends
    clock.advance()
    names = [type(f).__name__ for f in frames(b"".join(out))]
    assert names == ["Start", "Tune", "OpenOk", "OpenOk"]
    out.clear()
    sess.data_received(pframe.marshal(commands.Queue.Declare(queue="q1"), 1)
                       + pframe.marshal(commands.Basic.Publish(routing_key="q1"), 1)
                       + pframe.marshal(pframe.header.ContentHeader(0, 3, commands.Basic.Properties()), 1)
                       + pframe.marshal(pframe.body.ContentBody(b"abc"), 1)
                       + pframe.marshal(commands.Basic.Get(queue="q1", no_ack=True), 1))
    clock.advance()
    got = frames(b"".join(out))
    assert [type(f).__name__ for f in got] == ["DeclareOk", "GetOk", "ContentHeader", "ContentBody"]
    assert got[-1].value == b"abc"


def test_queue_expiry_fires_when_the_clock_passes_x_expires():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    sess, out = connect(broker)
    sess.data_received(pframe.marshal(commands.Queue.Declare(queue="short", arguments={"x-expires": 1000}), 1))
    clock.advance()
    assert "short" in broker.vhosts["/"].queues
    clock.advance(0.9)
    assert "short" in broker.vhosts["/"].queues
    clock.advance(0.2)
    assert "short" not in broker.vhosts["/"].queues
