"""Publishes in a row go up as one run (``ev.Publishes``) and are routed together; what comes
after them, and errors in the middle of a run, behave exactly as with one publish at a time.

Sans-IO: a Session fed raw bytes on a broker driven by a ManualClock."""

from __future__ import annotations

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.testing import client_handshake
from exchange_broker.assembly import make_broker
from exchange_broker.connection.session import Session
from exchange_broker.core.clock import ManualClock
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.connection import ServerConnection

HANDSHAKE = client_handshake()


def publish(body: bytes, routing_key: str = "q", exchange: str = "", channel: int = 1) -> bytes:
    return (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
            + pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), channel)
            + pframe.marshal(pbody.ContentBody(body), channel))


def frames(data: bytes) -> list:
    out = []
    while data:
        n, channel, f = pframe.unmarshal(data)
        data = data[n:]
        out.append((channel, f))
    return out


def opened_conn() -> ServerConnection:
    conn = ServerConnection(lambda mech, resp: "guest", lambda user, vhost: None, {})
    conn.receive_data(HANDSHAKE + pframe.marshal(commands.Channel.Open(), 1)
                      + pframe.marshal(commands.Channel.Open(), 2))
    conn.data_to_send()
    return conn


def test_publishes_in_a_row_on_one_channel_come_as_one_run_in_order():
    conn = opened_conn()
    got = conn.receive_data(b"".join(publish(b"m%d" % i) for i in range(5)))
    assert [type(e) for e in got] == [ev.Publishes]
    assert [p.body for p in got[0].items] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_runs_break_at_a_change_of_channel_and_at_any_other_frame():
    conn = opened_conn()
    data = (publish(b"a1") + publish(b"a2", channel=1) + publish(b"b1", channel=2)
            + pframe.marshal(commands.Basic.Qos(prefetch_count=5), 1) + publish(b"a3"))
    got = conn.receive_data(data)
    shape = [(type(e).__name__, e.channel) for e in got]
    assert shape == [("Publishes", 1), ("Publish", 2), ("Method", 1), ("Publish", 1)]
    assert [p.body for p in got[0].items] == [b"a1", b"a2"]


def test_a_run_cut_by_the_end_of_the_input_continues_in_the_next_read():
    conn = opened_conn()
    data = publish(b"x1") + publish(b"x2") + publish(b"x3")
    cut = len(publish(b"x1")) * 2 + 10  # inside the third message
    first = conn.receive_data(data[:cut])
    second = conn.receive_data(data[cut:])
    assert [p.body for p in first[0].items] == [b"x1", b"x2"]
    assert [type(e) for e in second] == [ev.Publish] and second[0].body == b"x3"


def test_publishes_before_a_bad_frame_are_still_handed_up_first():
    conn = opened_conn()
    bad = b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\x00"  # frame end byte missing
    got = conn.receive_data(publish(b"ok1") + publish(b"ok2") + bad)
    assert type(got[0]) is ev.Publishes and [p.body for p in got[0].items] == [b"ok1", b"ok2"]
    assert type(got[1]) is ev.Closing and got[1].code == 501


def session():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    sess.data_received(HANDSHAKE + pframe.marshal(commands.Channel.Open(), 1)
                       + pframe.marshal(commands.Queue.Declare(queue="q"), 1)
                       + pframe.marshal(commands.Confirm.Select(), 1))
    clock.advance()
    out.clear()
    return broker, sess, clock, out


def test_an_error_inside_a_run_keeps_what_came_before_and_drops_what_came_after():
    broker, sess, clock, out = session()
    sess.data_received(publish(b"one") + publish(b"two", exchange="missing") + publish(b"three"))
    clock.advance()
    q = broker.vhosts["/"].queues["q"]
    assert [m.body for m in q.ready] == [b"one"]
    replies = [f for _, f in frames(b"".join(out))]
    assert [type(f).__name__ for f in replies] == ["Ack", "Close"]
    assert replies[0].delivery_tag == 1
    assert replies[1].reply_code == 404 and "missing" in replies[1].reply_text


def test_a_run_is_delivered_to_a_consumer_in_order_with_one_tag_each():
    broker, sess, clock, out = session()
    sess.data_received(pframe.marshal(commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True), 1))
    clock.advance()
    out.clear()
    sess.data_received(b"".join(publish(b"n%d" % i) for i in range(300)))
    clock.advance()
    got = frames(b"".join(out))
    delivers = [f for _, f in got if type(f).__name__ == "Deliver"]
    bodies = [f.value for _, f in got if type(f).__name__ == "ContentBody"]
    assert [d.delivery_tag for d in delivers] == list(range(1, 301))
    assert bodies == [b"n%d" % i for i in range(300)]
    acks = [f for _, f in got if type(f).__name__ == "Ack"]
    assert acks and acks[-1].delivery_tag == 300 and acks[-1].multiple


def test_a_big_read_is_handled_in_slices_with_reading_paused_in_between():
    from exchange_broker.connection.session import INPUT_SLICE
    clock = ManualClock()
    broker = make_broker(clock=clock)
    reading: list[bool] = []
    sess = Session(broker, lambda data: None, lambda: None, ("127.0.0.1", 1), set_reading=reading.append)
    sess.data_received(HANDSHAKE + pframe.marshal(commands.Channel.Open(), 1)
                       + pframe.marshal(commands.Queue.Declare(queue="q"), 1))
    clock.advance()
    q = broker.vhosts["/"].queues["q"]
    n = INPUT_SLICE * 3 + 17
    sess.data_received(b"".join(publish(b"s%d" % i) for i in range(n)))
    assert 0 < len(q.ready) < n          # one slice now, the rest on later loop turns
    assert reading == [False]            # and the client is not read meanwhile
    sess.data_received(publish(b"late"))  # what a transport still hands over waits its turn
    clock.advance()
    assert [m.body for m in q.ready] == [b"s%d" % i for i in range(n)] + [b"late"]
    assert reading == [False, True]


def test_input_still_being_handled_when_the_client_hangs_up_is_not_lost():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    sess = Session(broker, lambda data: None, lambda: None, ("127.0.0.1", 1))
    sess.data_received(HANDSHAKE + pframe.marshal(commands.Channel.Open(), 1)
                       + pframe.marshal(commands.Queue.Declare(queue="q", durable=True), 1))
    clock.advance()
    sess.data_received(b"".join(publish(b"h%d" % i) for i in range(2000)))
    sess.connection_lost()
    assert len(broker.vhosts["/"].queues["q"].ready) == 2000
