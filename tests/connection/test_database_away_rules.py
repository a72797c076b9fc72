"""What a client sees while a cluster node cannot reach its database, as rules on a ManualClock
(a real Session fed raw frames, ``tests/sansio.py``; no socket, no sleeping):

* ``Broker.confirm_nack_after`` (``serve --database-outage-nack-after``): the persistent publishes
  whose store batch has not committed after that long are nacked at the broker's tick, in order;
  a batch that commits later sends nothing more for them;
* ``Broker.delivery_guard`` (``LeaderNode.guard`` on a ``DbLease``): once the lease may have run
  out, the durable queues (another node could take them over) hand out nothing, by basic.deliver
  or basic.get, while transient queues keep delivering; when the lease runs again
  (``dispatch_guarded``) what waited goes out;
* ``Broker.definitions_unavailable``: a definition change is refused with a channel error 541 at
  once, a passive or equivalent declare is answered, and the connection stays usable.
"""

from __future__ import annotations

import pytest
from pamqp import commands
from sansio import B, CONFIRM, Q, SansIOClient

from exchange_broker import config_file
from exchange_broker.assembly import make_broker
from exchange_broker.config import Config
from exchange_broker.cluster.db_lease import DbLease
from exchange_broker.core.clock import ManualClock
from exchange_broker.core.ports import NullDurability, Waiter
from exchange_broker.core.queue import dispatch_guarded

E = commands.Exchange
PERSISTENT = 2


class HungStore(NullDurability):
    """A store whose commits the test decides: every append joins the open batch (one Waiter)
    until ``commit`` fires it."""

    enabled = True

    def __init__(self) -> None:
        self.batch = Waiter()
        self.appended = 0
        self.next_id = 1

    def queue_declared(self, q) -> None:
        if q.durable:
            q.store_id, self.next_id = self.next_id, self.next_id + 1

    def append(self, q, msg):
        self.appended += 1
        return self.batch

    def commit(self, ok: bool = True) -> None:
        batch, self.batch = self.batch, Waiter()
        batch.fire(ok)


def confirming(bound: float):
    clock = ManualClock(1000.0)
    store = HungStore()
    broker = make_broker(clock=clock, durability=store)
    broker.confirm_nack_after = bound
    c = SansIOClient(broker, clock)
    c.call(Q.Declare(queue="jobs", durable=True))
    c.call(CONFIRM.Select())
    return clock, store, broker, c


def confirms(got) -> list[tuple[str, int, bool]]:
    return [(type(f).__name__, f.delivery_tag, f.multiple) for _ch, f in got if isinstance(f, (B.Ack, B.Nack))]


def test_publishes_waiting_longer_than_the_bound_are_nacked_at_the_tick():
    clock, store, broker, c = confirming(5.0)
    for body in (b"a", b"b"):
        c.publish("jobs", body, delivery_mode=PERSISTENT)
    assert confirms(c.take()) == []           # the store hangs: no confirm yet
    clock.advance(4.0)
    broker.tick()
    assert confirms(c.take()) == []           # 4 s: within the bound
    c.publish("jobs", b"c", delivery_mode=PERSISTENT)  # joins the same (hung) batch, 1 s later
    clock.advance(1.0)
    broker.tick()
    assert confirms(c.take()) == [("Nack", 1, False), ("Nack", 2, False), ("Nack", 3, False)]
    store.commit()                            # the write lands after all: nothing more is sent
    assert confirms(c.take()) == []
    c.publish("jobs", b"d", delivery_mode=PERSISTENT)  # a new batch is confirmed as usual
    store.commit()
    assert confirms(c.take()) == [("Ack", 4, True)]
    assert c.closes == [] and not c.closed_transport


def test_a_batch_that_commits_within_the_bound_is_acked_and_a_later_one_still_nacked():
    clock, store, broker, c = confirming(2.0)
    c.publish("jobs", b"a", delivery_mode=PERSISTENT)
    clock.advance(1.5)
    store.commit()
    assert confirms(c.take()) == [("Ack", 1, True)]
    c.publish("jobs", b"b", delivery_mode=PERSISTENT)
    c.publish("jobs", b"t")                   # transient: confirmed at once, but after 2 in order
    clock.advance(1.0)
    broker.tick()
    assert confirms(c.take()) == []
    clock.advance(1.0)
    broker.tick()
    assert confirms(c.take()) == [("Nack", 2, False), ("Ack", 3, True)]


def test_without_a_bound_publishes_wait_for_the_store_however_long():
    clock, store, broker, c = confirming(0.0)
    c.publish("jobs", b"a", delivery_mode=PERSISTENT)
    for _ in range(10):
        clock.advance(60.0)
        broker.tick()
    assert confirms(c.take()) == []
    store.commit()
    assert confirms(c.take()) == [("Ack", 1, True)]


HEARTBEAT, FAILOVER = 1.0, 8.0  # the lease may have run out 7 s after the last good beat


def guarded():
    clock = ManualClock(100.0)
    lease = DbLease(clock.time, HEARTBEAT, FAILOVER)
    broker = make_broker(clock=clock, durability=HungStore())
    broker.delivery_guard = lease.may_deliver
    c = SansIOClient(broker, clock)
    c.call(Q.Declare(queue="orders", durable=True))     # another node could take it over
    c.call(Q.Declare(queue="scratch"))                  # transient: dies with this node
    c.call(Q.Declare(queue="mine", exclusive=True))
    for q in ("orders", "scratch", "mine"):
        c.call(B.Consume(queue=q, no_ack=True))
    return clock, lease, broker, c


def bodies(c) -> list[bytes]:
    got = [d.body for d in c.deliveries]
    c.deliveries.clear()
    return got


def test_only_queues_another_node_could_take_over_wait_once_the_lease_may_have_run_out():
    clock, lease, broker, c = guarded()
    lease.beat_failed()                       # the database is away: it delivers while its lease surely runs
    clock.advance(5.0)
    for q in ("orders", "scratch", "mine"):
        c.publish(q, q.encode() + b"-1")
    c.take()
    assert sorted(bodies(c)) == [b"mine-1", b"orders-1", b"scratch-1"]
    clock.advance(2.5)                        # 7.5 s without a good beat: the lease may have run out
    for q in ("orders", "scratch", "mine"):
        c.publish(q, q.encode() + b"-2")
    c.take()
    assert sorted(bodies(c)) == [b"mine-2", b"scratch-2"]   # transient traffic flows
    assert broker.vhosts["/"].queues["orders"].message_count == 1
    assert c.get("orders", channel=2) is None               # basic.get hands nothing out either
    assert c.get("scratch", channel=2) is None              # (empty: its consumer took it)
    lease.beat_ok(lease.beat_started())       # a beat gets through: the row was there, it still leads
    assert dispatch_guarded(broker) == 1
    c.take()
    assert bodies(c) == [b"orders-2"]
    assert c.closes == [] and not c.closed_transport        # one connection all along


def test_an_evicted_node_hands_out_nothing_of_its_durable_queues_until_it_rejoined():
    clock, lease, broker, c = guarded()
    clock.advance(9.0)
    lease.evicted()                           # the database is back and the row is gone
    c.publish("orders", b"o")
    c.publish("scratch", b"s")
    c.take()
    assert bodies(c) == [b"s"]
    lease.rejoined(lease.beat_started())
    dispatch_guarded(broker)
    c.take()
    assert bodies(c) == [b"o"]


def test_definition_changes_are_refused_with_541_and_the_connection_stays_usable():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    c = SansIOClient(broker, clock)
    c.call(Q.Declare(queue="kept", durable=True))
    away = ["node 'n1' cannot reach the database (for 3 s): definitions cannot be changed until it is back"]
    broker.definitions_unavailable = lambda: away[0] if away else None
    for method in (Q.Declare(queue="new", durable=True), Q.Declare(queue="", exclusive=True),
                   Q.Bind(queue="kept", exchange="amq.topic", routing_key="#"),
                   Q.Purge(queue="kept"), Q.Delete(queue="kept"),
                   E.Declare(exchange="new-x", exchange_type="topic"), E.Delete(exchange="amq.topic")):
        reply = c.call(method, channel=3)
        assert isinstance(reply, commands.Channel.Close), method
        assert reply.reply_code == 541 and "cannot reach the database" in reply.reply_text
    assert c.call(Q.Declare(queue="kept", durable=True)).__class__ is Q.DeclareOk      # equivalent: answered
    assert c.call(Q.Declare(queue="kept", passive=True)).__class__ is Q.DeclareOk
    assert c.call(E.Declare(exchange="amq.topic", exchange_type="topic", durable=True)).__class__ is E.DeclareOk
    c.publish("kept", b"still")               # the connection and channel 1 work on
    assert c.get("kept").body == b"still"
    away.clear()                              # the database is back
    assert isinstance(c.call(Q.Declare(queue="new", durable=True), channel=3), Q.DeclareOk)
    assert not c.closed_transport


def test_the_bound_is_a_serve_setting_from_the_command_line_or_a_config_file(tmp_path):
    assert Config().database_outage_nack_after == 0.0          # wait as long as it takes
    with pytest.raises(ValueError, match="--database-outage-nack-after"):
        Config(database_outage_nack_after=-1.0)
    toml = tmp_path / "broker.toml"
    toml.write_text("database_outage_nack_after = 2.5\n")
    settings, _ignored = config_file.load(str(toml))
    assert Config(**settings).database_outage_nack_after == 2.5
