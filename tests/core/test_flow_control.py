"""Publisher pacing (queue_types/pacing.py): a classic queue whose consumers drain it fast stops
reading the connections that publish into it while its backlog is past flow.HIGH, and reads them
again below flow.LOW; never a queue without consumers, slow consumers, a connection that consumes,
or with pacing turned off. Nothing is lost or reordered either way.

Real broker, real pika connections. The thresholds are lowered for the test and, where the test
is about the mechanism rather than the rate, the measured consumer rate is taken as "fast" (a
measured rate depends on timing; the decision on it does not)."""

from __future__ import annotations

import threading

import pytest

from eb_support import pika_connect, uniq, wait_until
from exchange_broker.config import Config
from exchange_broker.core.backpressure import BackPressure
from exchange_broker.queue_types import pacing as flow
from exchange_broker.testing import ThreadedBroker

N_BEFORE, N_AFTER = 1000, 2000


@pytest.fixture
def holds(monkeypatch):
    """Small thresholds, no time limit on a pause; returns the list of (queue, session) paused."""
    monkeypatch.setattr(flow, "HIGH", 400)
    monkeypatch.setattr(flow, "LOW", 100)
    monkeypatch.setattr(flow, "MAX_HOLD", 3600.0)
    seen = []
    original = BackPressure.throttle

    def throttle(session, queue):
        # the queue answered a publish with Block, and the connection stops reading
        if queue not in session.throttled_by:
            seen.append((queue.name, session))
        original(session, queue)
    monkeypatch.setattr(BackPressure, "throttle", throttle)
    return seen


@pytest.fixture
def fast(monkeypatch):
    """The consumers count as fast whatever their measured rate."""
    def sample(self):
        self.rate = 1e12
        return self.rate
    monkeypatch.setattr(flow.Pacer, "sample", sample)


def _session_of(broker, conn_name_port: int):
    def find():
        for s in broker.broker.sessions:
            if s.peer and s.peer[1] == conn_name_port:
                return s
        return None
    return broker.call(find)


def _local_port(conn) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def _publish(ch, q, start, n):
    for i in range(start, start + n):
        ch.basic_publish("", q, b"%d" % i)


def _drain(conn, ch, q, total, ack=True, got=None):
    """Consume (prefetch 50, acks) until ``total`` bodies arrived; returns them in order."""
    got = [] if got is None else got

    def on_msg(c, m, _p, body):
        got.append(int(body))
        if ack:
            c.basic_ack(m.delivery_tag)
    ch.basic_qos(prefetch_count=50)
    ch.basic_consume(q, on_msg)
    assert wait_until(lambda: (conn.process_data_events(0.01), len(got) >= total)[1], timeout=60)
    return got


def _passive_count(ch, q) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def test_publisher_paced_while_fast_consumer_drains_then_read_again(broker, connect, holds, fast):
    q = uniq("pace")
    pub_conn, cons_conn = connect(), connect()
    pub = pub_conn.channel()
    pub.queue_declare(q)
    _publish(pub, q, 0, N_BEFORE)
    assert _passive_count(pub, q) == N_BEFORE
    assert holds == []  # no consumer yet: an ordinary backlog

    cons = cons_conn.channel()
    cons.basic_qos(prefetch_count=50)
    got = []
    cons.basic_consume(q, lambda c, m, _p, body: (got.append(int(body)), c.basic_ack(m.delivery_tag)))
    cons_conn.process_data_events(0.05)
    session = _session_of(broker, _local_port(pub_conn))
    _publish(pub, q, N_BEFORE, N_AFTER)
    pub_conn.process_data_events(0)
    assert wait_until(lambda: holds)  # paused once its publishes were read
    assert holds[0] == (q, session)
    assert wait_until(lambda: (cons_conn.process_data_events(0.01), len(got) >= N_BEFORE + N_AFTER)[1],
                      timeout=60)
    assert got == list(range(N_BEFORE + N_AFTER))  # every message once, in order
    assert wait_until(lambda: broker.call(lambda: session.reading and not session.throttled_by))
    assert _passive_count(pub, q) == 0


def test_paused_connection_shows_flow_and_confirms_still_arrive(broker, connect, holds, fast):
    from exchange_broker.management.connections import _conn_state
    q = uniq("pace-state")
    pub_conn, cons_conn = connect(), connect()
    pub = pub_conn.channel()
    pub.queue_declare(q)
    pub.confirm_delivery()
    _publish(pub, q, 0, N_BEFORE)  # each confirmed: nothing paced without consumers
    cons = cons_conn.channel()
    cons.basic_qos(prefetch_count=10)
    cons.basic_consume(q, lambda *a: None)  # holds 10, acks nothing for now
    cons_conn.process_data_events(0.05)
    session = _session_of(broker, _local_port(pub_conn))
    pub.basic_publish("", q, b"-1")  # the look at the 64th publish: confirmed, then paused
    extra = 1
    while not holds:
        pub.basic_publish("", q, b"-1")
        extra += 1
    assert wait_until(lambda: broker.call(lambda: _conn_state(session, "opened")) == "flow")
    got = _drain(cons_conn, cons_conn.channel(), q, N_BEFORE + extra - 10)
    assert len(got) == N_BEFORE + extra - 10
    assert wait_until(lambda: broker.call(lambda: _conn_state(session, "opened")) == "running")


def test_no_consumer_and_slow_consumer_are_ordinary_backlogs(broker, connect, holds):
    q = uniq("slow")
    pub_conn, cons_conn = connect(), connect()
    pub = pub_conn.channel()
    pub.queue_declare(q)
    _publish(pub, q, 0, N_BEFORE)
    assert _passive_count(pub, q) == N_BEFORE
    cons = cons_conn.channel()
    cons.basic_qos(prefetch_count=10)
    cons.basic_consume(q, lambda *a: None)  # a slow worker: 10 at a time, none acked yet
    cons_conn.process_data_events(0.05)
    _publish(pub, q, N_BEFORE, N_AFTER)
    # at most 10 deliveries per RATE_WINDOW: far too slow to drain the backlog within MAX_DRAIN
    assert _passive_count(pub, q) == N_BEFORE + N_AFTER - 10
    assert holds == []


def test_connection_that_consumes_is_never_paced(broker, connect, holds, fast):
    """Pausing it would hold back its own acks (same queue) or a queue's it consumes: no deadlock."""
    q, other = uniq("self"), uniq("other")
    conn = connect()
    pub, cons = conn.channel(), conn.channel()
    pub.queue_declare(q)
    pub.queue_declare(other)
    _publish(pub, other, 0, 5)
    got = []
    cons.basic_qos(prefetch_count=50)
    cons.basic_consume(other, lambda c, m, _p, body: got.append(body))  # unacked: it consumes
    helper_conn = connect()
    helper = helper_conn.channel()
    helper.basic_qos(prefetch_count=10)
    helper.basic_consume(q, lambda *a: None)  # q has a consumer elsewhere, blocked at prefetch
    helper_conn.process_data_events(0.05)
    _publish(pub, q, 0, N_BEFORE + N_AFTER)
    assert _passive_count(pub, q) == N_BEFORE + N_AFTER - 10
    assert holds == []
    # the same connection publishing into the queue it consumes from (acks every message)
    mine = _drain(conn, conn.channel(), q, 0)  # a consumer of q on this connection too
    _publish(pub, q, 0, N_BEFORE)
    assert holds == []
    assert wait_until(lambda: (conn.process_data_events(0.01), len(mine) >= N_BEFORE)[1], timeout=60)


def test_pause_ends_after_max_hold_when_consumers_stop(broker, connect, holds, fast, monkeypatch):
    monkeypatch.setattr(flow, "MAX_HOLD", 0.05)
    q = uniq("hold")
    pub_conn, cons_conn = connect(), connect()
    pub = pub_conn.channel()
    pub.queue_declare(q)
    cons = cons_conn.channel()
    cons.basic_qos(prefetch_count=10)
    cons.basic_consume(q, lambda *a: None)  # takes 10, then never acks
    cons_conn.process_data_events(0.05)
    _publish(pub, q, 0, N_BEFORE + N_AFTER)
    # paused (perhaps repeatedly), each time read again after MAX_HOLD: all of it arrives
    assert _passive_count(pub, q) == N_BEFORE + N_AFTER - 10
    assert holds


def test_no_publisher_pacing_turns_it_off(holds, fast):
    assert Config(no_publisher_pacing=True).limits["publisher_pacing"] is False
    assert "publisher_pacing" not in Config().limits
    with ThreadedBroker(limits=Config(no_publisher_pacing=True).limits) as tb:
        pub_conn, cons_conn = pika_connect(tb.port), pika_connect(tb.port)
        try:
            q = uniq("off")
            pub = pub_conn.channel()
            pub.queue_declare(q)
            _publish(pub, q, 0, N_BEFORE)
            cons = cons_conn.channel()
            cons.basic_qos(prefetch_count=10)
            cons.basic_consume(q, lambda *a: None)
            cons_conn.process_data_events(0.05)
            _publish(pub, q, N_BEFORE, N_AFTER)
            assert _passive_count(pub, q) == N_BEFORE + N_AFTER - 10
            assert holds == []
        finally:
            for c in (pub_conn, cons_conn):
                if c.is_open:
                    c.close()


class Drainer(threading.Thread):
    """Consumes ``queue`` on its own connection (prefetch 50, acks) until ``total`` arrived."""

    def __init__(self, port: int, queue: str, total: int) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.total = port, queue, total
        self.got: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika_connect(self.port)
            try:
                _drain(conn, conn.channel(), self.queue, self.total, got=self.got)
            finally:
                conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_paced_publisher_to_two_queues_and_a_transaction(broker, connect, holds, fast):
    """A publisher paused by one queue keeps its other queue's messages and its transaction."""
    q1, q2 = uniq("two-a"), uniq("two-b")
    pub_conn, cons_conn = connect(), connect()
    pub = pub_conn.channel()
    for q in (q1, q2):
        pub.queue_declare(q)
    _publish(pub, q1, 0, N_BEFORE)
    cons = cons_conn.channel()
    first, tags = [], []
    cons.basic_qos(prefetch_count=50)
    cons.basic_consume(q1, lambda c, m, _p, body: (first.append(int(body)), tags.append(m.delivery_tag)))
    cons_conn.process_data_events(0.05)  # takes the first 50, acked only at the end
    tx = pub_conn.channel()
    tx.tx_select()
    for i in range(N_AFTER):
        pub.basic_publish("", q1, b"%d" % (N_BEFORE + i))
        tx.basic_publish("", q2, b"%d" % i)
    pub_conn.process_data_events(0)
    assert wait_until(lambda: holds)
    assert holds[0][0] == q1
    drainer = Drainer(broker.port, q1, N_BEFORE + N_AFTER - 50)
    drainer.start()
    tx.tx_commit()  # answered once q1 drained and the broker reads the publisher again
    assert _passive_count(pub, q2) == N_AFTER
    got2 = _drain(pub_conn, pub_conn.channel(), q2, N_AFTER)
    drainer.join(60)
    assert drainer.error is None and not drainer.is_alive()
    assert wait_until(lambda: (cons_conn.process_data_events(0.01), len(first) >= 50)[1])
    cons.basic_ack(tags[-1], multiple=True)
    assert first + drainer.got == list(range(N_BEFORE + N_AFTER))  # once each, in order
    assert got2 == list(range(N_AFTER))
