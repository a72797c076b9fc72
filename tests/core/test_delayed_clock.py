"""The delayed-message exchange's rules (core/delayed.py), sans-IO on a ManualClock: each held
message is routed when its x-delay has passed on the clock, in due order, through the bindings
of that moment. Real sockets, the measured lateness and restarts are in
tests/extensions/test_delayed.py."""

from __future__ import annotations

from decimal import Decimal

from sansio import B, CONFIRM, E, Q, SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock

DELAYED = "x-delayed-message"


def setup(kind: str = "direct"):
    clock = ManualClock()
    c = SansIOClient(make_broker(clock=clock), clock)
    assert isinstance(c.call(E.Declare(exchange="dl", exchange_type=DELAYED,
                                       arguments={"x-delayed-type": kind})), E.DeclareOk)
    assert isinstance(c.call(Q.Declare(queue="q")), Q.DeclareOk)
    c.call(Q.Bind(queue="q", exchange="dl", routing_key="k"))
    c.call(B.Consume(queue="q", consumer_tag="c", no_ack=True))
    return clock, c


def arrived(c) -> list[bytes]:
    c.take()
    return [d.body for d in c.deliveries]


def test_held_messages_are_routed_at_their_due_time_in_due_order():
    clock, c = setup()
    for d in (500, 100, 400, 200, 300):
        c.publish("k", str(d).encode(), exchange="dl", headers={"x-delay": d, "keep": "me"})
    # no (valid) x-delay: routed at once and untouched, like the plugin
    for h in (None, {"x-delay": 0}, {"x-delay": -50}, {"x-delay": "soon"}, {"x-delay": 2 ** 32}):
        c.publish("k", b"now", exchange="dl", headers=h)
    assert arrived(c) == [b"now"] * 5
    assert [(d.properties.headers or {}).get("x-delay") for d in c.deliveries] == \
        [None, 0, -50, "soon", 2 ** 32]
    for due in (100, 200, 300, 400, 500):
        clock.advance(due / 1000 - 0.005 - clock.now)
        assert len(arrived(c)) == 5 + due // 100 - 1, f"the {due} ms message came early"
        clock.advance(0.006)
        assert arrived(c)[-1] == str(due).encode(), f"the {due} ms message is late"
    for d in c.deliveries[5:]:  # the plugin negates x-delay on routing
        assert d.properties.headers == {"x-delay": -int(d.body), "keep": "me"}
    assert c.broker.delayed.pending == 0


def test_x_delay_as_a_string_or_a_decimal():
    clock, c = setup("fanout")
    c.publish("", b"str", exchange="dl", headers={"x-delay": "200"})
    c.publish("", b"decimal", exchange="dl", headers={"x-delay": Decimal("150.9")})  # truncated
    clock.advance(0.145)
    assert arrived(c) == []
    clock.advance(0.006)
    assert arrived(c) == [b"decimal"]
    clock.advance(0.048)
    assert arrived(c) == [b"decimal"]
    clock.advance(0.003)
    assert arrived(c) == [b"decimal", b"str"]
    assert [d.properties.headers["x-delay"] for d in c.deliveries] == [-150, -200]


def test_the_bindings_are_those_at_due_time_and_mandatory_is_not_returned():
    clock, c = setup()
    c.call(B.Cancel(consumer_tag="c"))
    c.call(CONFIRM.Select())
    c.publish("late", b"x", exchange="dl", mandatory=True, headers={"x-delay": 300})
    got = c.take()
    assert [type(f).__name__ for _, f in got] == ["Ack"]  # confirmed at once, not returned
    clock.advance(0.1)
    c.call(Q.Bind(queue="q", exchange="dl", routing_key="late"))  # bound after the publish: counts
    clock.advance(0.201)
    assert c.get_all("q") == [b"x"]
    assert not any(type(f).__name__ == "Return" for _, f in c.take())


def test_deleting_the_exchange_drops_what_it_holds():
    clock, c = setup("fanout")
    for _ in range(3):
        c.publish("", b"gone", exchange="dl", headers={"x-delay": 200})
    c.call(E.Delete(exchange="dl"))
    c.call(E.Declare(exchange="dl", exchange_type=DELAYED, arguments={"x-delayed-type": "fanout"}))
    c.call(Q.Bind(queue="q", exchange="dl"))
    c.publish("", b"new", exchange="dl", headers={"x-delay": 300})
    clock.advance(5)
    assert arrived(c) == [b"new"]
    assert c.broker.delayed.pending == 0

