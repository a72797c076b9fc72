"""A queue type answers a publish with actions that the publishing channel applies
(``core/actions.py``, as RabbitMQ's ``rabbit_queue_type``): ``Block`` stops reading the publishing
connection, the queue never calls up into it; the queue releases it later (``unthrottle``).

Rules on a ManualClock: real Sessions fed raw frames (``tests/sansio.py``; an MQTT session fed
packets), a store whose commits the test decides (classic queues: publisher pacing,
``queue_types/pacing.py``; streams: appends awaiting their commit)."""

from __future__ import annotations

import pytest
from pamqp import commands
from sansio import B, CONFIRM, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.actions import Block, joined
from exchange_broker.core.clock import ManualClock
from exchange_broker.core.message import from_wire
from exchange_broker.core.ports import NullDurability, Waiter
from exchange_broker.mqtt import codec as mqtt_codec
from exchange_broker.mqtt import packets as mqtt
from exchange_broker.mqtt.hub import MQTTHub, MQTTSettings
from exchange_broker.mqtt.session import MQTTSession
from exchange_broker.queue_types import pacing as flow
from exchange_broker.queue_types import stream as stream_mod

E = commands.Exchange
PERSISTENT = 2
NO_PROPERTIES = b"\x00\x00"  # encoded basic properties: no flags


class HeldStore(NullDurability):
    """Every append (a queue's row, a stream's log entry) joins the open batch until ``commit``."""

    enabled = True

    def __init__(self) -> None:
        self.batch = Waiter()
        self.next_id = 1
        self.on_commit: list = []

    def queue_declared(self, q) -> None:
        if q.durable:
            q.store_id, self.next_id = self.next_id, self.next_id + 1

    def append(self, q, msg):
        return self.batch

    def append_log(self, q, msg):
        return self.batch

    def commit(self) -> None:
        batch, self.batch = self.batch, Waiter()
        batch.fire(True)
        for fn in list(self.on_commit):
            fn()


@pytest.fixture
def low(monkeypatch):
    """Pacing thresholds small enough for a few hundred publishes."""
    monkeypatch.setattr(flow, "HIGH", 200)
    monkeypatch.setattr(flow, "LOW", 50)


def setup(*queues: str, durable: tuple[str, ...] = (), fanout: bool = False):
    """A consumer connection (no-ack, on every queue) whose transport is full, so that the
    queues back up (``congested``), and a publishing connection."""
    clock = ManualClock()
    store = HeldStore()
    broker = make_broker(clock=clock, durability=store)
    cons, pub = SansIOClient(broker, clock), SansIOClient(broker, clock)
    if fanout:
        cons.call(E.Declare(exchange="fx", exchange_type="fanout"))
    for name in queues:
        cons.call(Q.Declare(queue=name, durable=name in durable))
        if fanout:
            cons.call(Q.Bind(queue=name, exchange="fx"))
        cons.call(B.Consume(queue=name, consumer_tag=name, no_ack=True))
    cons.session.pause_writing()
    return clock, store, broker, cons, pub


def confirms(got) -> list:
    return [(type(f).__name__, f.delivery_tag, f.multiple) for _ch, f in got
            if isinstance(f, (B.Ack, B.Nack))]


def test_enqueue_answers_block_and_never_touches_the_publisher(low):
    clock, _store, broker, cons, pub = setup("q")
    q = broker.vhosts["/"].queues["q"]
    for i in range(flow.CHECK_MASK * 4 + 3):  # seq 1..255: past HIGH, no look yet
        pub.publish("q", b"%d" % i)
    pub.take()
    assert len(q.ready) == 255 and pub.session.reading
    answer = q.enqueue(from_wire("", "q", NO_PROPERTIES, b"255"), pub.session, None)  # seq 256
    assert answer.__class__ is Block and answer.queue is q and answer.then is None
    # the queue only answered: the publishing connection is as it was
    assert pub.session.reading and not pub.session.throttled_by and not q.flow_blocked
    assert pub.session.apply_actions(answer) is None  # the caller applies it: no waiter
    assert not pub.session.reading
    assert pub.session.throttled_by == {q} and q.flow_blocked == {pub.session}
    cons.session.resume_writing()  # the consumer takes the backlog: below LOW, read again
    assert len(q.ready) == 0
    assert pub.session.reading and not pub.session.throttled_by and not q.flow_blocked
    cons.take()
    assert [d.body for d in cons.deliveries] == [b"%d" % i for i in range(256)]


def test_a_paced_publish_is_confirmed_and_the_pause_ends_after_max_hold(low):
    clock, _store, broker, cons, pub = setup("q")
    q = broker.vhosts["/"].queues["q"]
    pub.call(CONFIRM.Select())
    for i in range(flow.CHECK_MASK * 4 + 4):
        pub.publish("q", b"%d" % i)
        assert pub.session.reading is (i < 255)  # the 256th publish's look pauses it
    assert confirms(pub.take()) == [("Ack", 256, True)]  # confirmed as usual
    assert pub.session.throttled_by == {q}
    clock.advance(flow.MAX_HOLD - 0.01)
    assert not pub.session.reading
    clock.advance(0.02)  # still congested, but a pause lasts MAX_HOLD at most
    assert pub.session.reading and not q.flow_blocked


def test_a_paced_block_pauses_only_a_connection_that_consumes_nothing(low, monkeypatch):
    """Consumers fast but behind (their sockets take everything): the queue answers a *paced*
    Block without looking at the publisher; a connection pauses itself only if it may be paced."""
    monkeypatch.setattr(flow.Pacer, "fast_enough", lambda self, ready: True)  # they count as fast
    clock = ManualClock()
    broker = make_broker(clock=clock)
    cons, pub, other = (SansIOClient(broker, clock) for _ in range(3))
    cons.call(Q.Declare(queue="q"))
    cons.call(B.Qos(prefetch_count=10))
    cons.call(B.Consume(queue="q", consumer_tag="c"))  # takes 10, acks nothing yet
    other.call(Q.Declare(queue="mine"))
    other.call(B.Consume(queue="mine", consumer_tag="m"))  # pausing it could hold back its acks
    q = broker.vhosts["/"].queues["q"]
    for i in range(flow.CHECK_MASK * 4 + 3):  # seq 1..255, no look yet
        pub.publish("q", b"%d" % i)
    pub.take()
    assert len(q.ready) == 245 and pub.session.reading
    answer = q.enqueue(from_wire("", "q", NO_PROPERTIES, b"x"), pub.session, None)  # seq 256 looks
    assert answer.__class__ is Block and answer.paced and not q.congested()
    assert pub.session.may_pace() and not other.session.may_pace()
    other.session.apply_actions(answer)
    assert other.session.reading and not other.session.throttled_by
    pub.session.apply_actions(answer)
    assert not pub.session.reading and pub.session.throttled_by == {q}


def test_a_publish_blocked_by_two_queues_of_a_fanout_waits_for_its_store(low):
    """``Broker.enqueue`` hands every queue's Block (and the store's waiter) to the channel."""
    clock, store, broker, cons, pub = setup("a", "b", durable=("a",), fanout=True)
    a, b = broker.vhosts["/"].queues["a"], broker.vhosts["/"].queues["b"]
    pub.call(CONFIRM.Select())
    for i in range(flow.CHECK_MASK * 4 + 4):
        pub.publish("q", b"%d" % i, exchange="fx", delivery_mode=PERSISTENT)
    assert pub.session.throttled_by == {a, b} and not pub.session.reading
    assert a.flow_blocked == {pub.session} == b.flow_blocked
    assert confirms(pub.take()) == []  # queue a's rows wait for the store
    store.commit()
    assert confirms(pub.take()) == [("Ack", 256, True)]
    cons.session.resume_writing()
    assert pub.session.reading and not pub.session.throttled_by


def held_stream(monkeypatch):
    """A broker on a store that commits when told, with a stream "s" that blocks its publishers
    past 10 uncommitted appends, and an AMQP client: (clock, store, broker, client, stream)."""
    monkeypatch.setattr(stream_mod, "UNCOMMITTED_HIGH", 10)
    clock = ManualClock()
    store = HeldStore()
    broker = make_broker(clock=clock, durability=store)
    client = SansIOClient(broker, clock)
    client.call(Q.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"}))
    return clock, store, broker, client, broker.vhosts["/"].queues["s"]


def test_a_stream_blocks_its_publisher_while_appends_await_their_commit(monkeypatch):
    clock, store, broker, pub, s = held_stream(monkeypatch)
    pub.call(CONFIRM.Select())
    for i in range(12):
        pub.publish("s", b"%d" % i)
        assert pub.session.reading is (i < 11)  # 11 appends past the first uncommitted one
    assert pub.session.throttled_by == {s}
    # blocked once: later appends do not answer Block again while the publisher is held
    answer = s.enqueue(from_wire("", "s", NO_PROPERTIES, b"12"), pub.session, None)
    assert answer is store.batch
    assert confirms(pub.take()) == []
    store.commit()
    assert pub.session.reading and not s.flow_blocked
    assert confirms(pub.take()) == [("Ack", 12, True)]


def test_an_mqtt_publisher_is_blocked_by_the_same_action(monkeypatch):
    """The MQTT session applies a queue's Block as the AMQP channel does."""
    clock, store, broker, amqp, s = held_stream(monkeypatch)
    amqp.call(Q.Bind(queue="s", exchange="amq.topic", routing_key="t.#"))
    got: list = []
    parser = mqtt_codec.Parser(version=mqtt.V311, server=False)
    session = MQTTSession(MQTTHub(broker, MQTTSettings()), lambda data: got.extend(parser.feed(data)),
                          lambda: None, ("127.0.0.1", 40000))

    def send(packet) -> None:
        session.data_received(mqtt_codec.encode(packet, mqtt.V311))
        clock.advance(0)
    send(mqtt.Connect(mqtt.V311, "m1", True, 0, "guest", b"guest", None, {}))
    assert isinstance(got.pop(0), mqtt.ConnAck)
    for i in range(12):
        send(mqtt.Publish("t/x", b"%d" % i, 1, packet_id=i + 1))
        assert session.reading is (i < 11)
    assert session.throttled_by == {s} and s.flow_blocked == {session}
    assert got == []  # the PUBACKs wait for the store
    store.commit()
    clock.advance(0)
    assert session.reading and not s.flow_blocked
    assert [a.packet_id for a in got] == list(range(1, 13))


def test_two_queues_answers_join_into_one():
    """``joined``: every Block of both answers, then one waiter that fires once both have."""
    def parts(answer):
        queues = []
        while answer.__class__ is Block:
            queues.append(answer.queue)
            answer = answer.then
        return queues, answer
    w1, w2 = Waiter(), Waiter()
    assert parts(joined(Block("a"), Block("b"))) == (["a", "b"], None)
    assert parts(joined(Block("a", w1), w1)) == (["a"], w1)  # the same store batch: once
    assert parts(joined(w1, Block("b"))) == (["b"], w1)
    queues, both = parts(joined(Block("a", w1), Block("b", w2)))
    assert queues == ["a", "b"] and both not in (w1, w2, None)
    fired = []
    both.add(lambda _arg, ok: fired.append(ok), None)
    w1.fire(True)
    assert fired == []
    w2.fire(True)
    assert fired == [True]
    plain = joined(Waiter(), Waiter())
    assert plain.__class__ is Waiter
