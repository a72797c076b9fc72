"""The session's side of a connection hand-off (connection/handoff.py), sans-IO on a ManualClock:
the input from the first queue-bound request on comes back exactly as the client sent it (so
another broker can be given it), a connection holding anything a client could miss is not
offered, and a declined hand-off loses nothing."""

from __future__ import annotations

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

B = commands.Basic


def publish_bytes(queue: str, body: bytes, channel: int = 1) -> bytes:
    props = B.Properties(delivery_mode=2, content_type="text/plain")
    return b"".join((pframe.marshal(B.Publish(exchange="", routing_key=queue), channel),
                     pframe.marshal(pheader.ContentHeader(0, len(body), props), channel),
                     pframe.marshal(pbody.ContentBody(body), channel)))


class Recorder:
    """``broker.handoff`` that takes a connection offered for a queue named in ``remote`` while it
    holds nothing, and keeps what the session gives back; with ``decline``, it gives the input
    back at once."""

    def __init__(self, remote=("q",), decline: bool = False) -> None:
        self.remote = set(remote)
        self.offers: list = []
        self.given: list[bytes] = []
        self.decline = decline

    def __call__(self, session, event, exchange: str, name: str) -> bool:
        self.offers.append((exchange, name))
        if exchange or name not in self.remote or not session.holds_nothing():
            return False
        data = session.suspend(event)
        self.given.append(data)
        if self.decline:
            session.resume(data)
        return True


def plug(client, recorder: Recorder) -> Recorder:
    """The hand-off plugged in (after the session was made) and a login it could replay."""
    client.broker.handoff = recorder
    client.session.handoff_open = True
    client.session.login_response = ("PLAIN", b"\x00guest\x00guest")
    return recorder


def test_the_input_from_the_first_publish_on_comes_back_as_sent(client):
    rec = plug(client, Recorder())
    client.call(commands.Queue.Declare(queue="q", durable=True))
    client.call(commands.Confirm.Select())
    # more publishes than one event holds, a second channel's publishes, a consume: one read
    first = b"".join(publish_bytes("q", b"m%d" % i) for i in range(700))
    second = b"".join(publish_bytes("q", b"n%d" % i, channel=2) for i in range(3))
    consume = pframe.marshal(B.Consume(queue="q"), 1)
    client.session.data_received(pframe.marshal(commands.Channel.Open(), 2) + first + second + consume)
    assert rec.offers == [("", "q")]
    assert rec.given == [first + second + consume]
    # what came before the publish was answered, and went out before the hand-off: nothing after
    assert [(ch, type(f)) for ch, f in client.take()] == [(2, commands.Channel.OpenOk)]
    assert client.broker.vhosts["/"].queues["q"].message_count == 0
    client.session.data_received(b"later")  # held, never parsed
    assert client.take() == [] and not client.closed_transport


def test_a_batch_ended_by_another_channels_publish_is_cut_where_that_publish_starts(client):
    rec = plug(client, Recorder())
    client.call(commands.Queue.Declare(queue="q"))
    client.session.data_received(pframe.marshal(commands.Channel.Open(), 2))
    client.take()
    data = publish_bytes("q", b"a") + publish_bytes("q", b"b") + publish_bytes("q", b"c", channel=2)
    client.session.data_received(data)
    assert rec.given == [data]


def test_only_the_first_queue_bound_request_is_offered(client):
    rec = plug(client, Recorder())
    client.call(commands.Queue.Declare(queue="local"))
    client.call(commands.Queue.Declare(queue="q"))
    client.call(B.Consume(queue="local"), channel=2)  # the first queue-bound request: offered, kept here
    assert rec.offers == [("", "local")] and rec.given == []
    client.publish("q", b"x")  # only the first request is offered
    assert rec.offers == [("", "local")]
    assert client.get_all("q") == [b"x"]


def test_a_consumer_or_a_transaction_is_something_held(client):
    plug(client, Recorder(remote=()))
    client.call(commands.Queue.Declare(queue="q"))
    assert client.session.holds_nothing()
    client.call(B.Consume(queue="q", consumer_tag="c"), channel=2)
    assert not client.session.holds_nothing()
    client.call(B.Cancel(consumer_tag="c"), channel=2)
    assert client.session.holds_nothing()
    client.call(commands.Tx.Select(), channel=3)
    assert not client.session.holds_nothing()


def test_a_delivery_even_acked_or_a_confirmed_publish_is_something_held(client):
    plug(client, Recorder(remote=()))
    client.call(commands.Queue.Declare(queue="q"))
    client.call(commands.Confirm.Select(), channel=2)
    client.publish("q", b"x", channel=2)
    client.take()
    assert not client.session.holds_nothing()  # the client counts its publishes from 1 on
    client.close_channel(2)
    assert client.get("q", no_ack=False) is not None
    client.send(B.Ack(delivery_tag=1))
    client.take()
    assert not client.session.holds_nothing()  # delivery tags were given out on channel 1


def test_a_declined_hand_off_handles_the_input_here_with_nothing_lost(client):
    rec = plug(client, Recorder(decline=True))
    client.call(commands.Queue.Declare(queue="q"))
    client.call(commands.Confirm.Select())
    client.session.data_received(b"".join(publish_bytes("q", b"m%d" % i) for i in range(600)))
    got = client.take()
    acks = [f for _ch, f in got if isinstance(f, B.Ack)]
    assert acks and acks[-1].delivery_tag == 600 and all(a.multiple for a in acks)
    assert client.get_all("q") == [b"m%d" % i for i in range(600)]
    assert len(rec.given) == 1
