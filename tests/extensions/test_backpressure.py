"""Back-pressure: resource alarms (connection.blocked / connection.unblocked for publishing
connections, which are then not read), the memory high watermark of a real broker process, and
channel.flow. Reason text "low on memory" as RabbitMQ 3.10 sends it."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest

from eb_support import pika_connect, uniq, wait_until
from ext_helpers import count


def _pump(conn, until, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    return until()


def _events(conn):
    log = []
    conn.add_on_connection_blocked_callback(lambda _c, frame: log.append(("blocked", frame.method.reason)))
    conn.add_on_connection_unblocked_callback(lambda _c, _frame: log.append(("unblocked", None)))
    return log


def test_alarm_blocks_publishers_consumers_keep_draining_nothing_lost(broker, connect):
    q, work = uniq("bp"), uniq("work")
    pub_conn, cons_conn, observer_conn = connect(), connect(), connect()
    pub_events, cons_events = _events(pub_conn), _events(cons_conn)
    pub = pub_conn.channel()
    pub.queue_declare(q)
    pub.queue_declare(work)
    for i in range(10):
        pub.basic_publish("", q, b"before-%d" % i)
    for i in range(50):
        pub.basic_publish("", work, b"w%d" % i)
    observer = observer_conn.channel()
    assert wait_until(lambda: count(observer, q) == 10 and count(observer, work) == 50)

    broker.call(broker.broker.set_alarm, "memory", True, "test")
    assert _pump(pub_conn, lambda: pub_events)
    assert pub_events == [("blocked", "low on memory")]

    # published while blocked: written to the socket, but the broker does not read them yet
    for i in range(200):
        pub.basic_publish("", q, b"during-%d" % i)
    pub_conn.process_data_events(0)

    # the consumer's connection never published: not blocked, it drains `work` meanwhile
    cons = cons_conn.channel()
    cons.basic_qos(prefetch_count=1)
    drained = []

    def on_msg(c, m, _p, body):
        drained.append(body)
        c.basic_ack(m.delivery_tag)

    cons.basic_consume(work, on_msg)
    assert _pump(cons_conn, lambda: len(drained) == 50)
    assert cons_events == []
    time.sleep(0.2)
    assert count(observer, q) == 10  # nothing published during the alarm was enqueued
    assert broker.call(lambda: broker.broker.vhosts["/"].queues[q].message_count) == 10

    broker.call(broker.broker.set_alarm, "memory", False)
    assert _pump(pub_conn, lambda: len(pub_events) == 2)
    assert pub_events[1] == ("unblocked", None)
    assert wait_until(lambda: count(observer, q) == 210)
    pub.basic_publish("", q, b"after")
    assert wait_until(lambda: count(observer, q) == 211)
    bodies = []
    while True:
        m, _p, body = observer.basic_get(q, auto_ack=True)
        if m is None:
            break
        bodies.append(body)
    assert bodies == ([b"before-%d" % i for i in range(10)] + [b"during-%d" % i for i in range(200)]
                      + [b"after"])


def test_connection_that_first_publishes_during_an_alarm_is_blocked(broker, connect):
    q = uniq("bp")
    observer = connect().channel()
    observer.queue_declare(q)
    broker.call(broker.broker.set_alarm, "disk", True, "test")
    try:
        conn = connect()
        events = _events(conn)
        ch = conn.channel()
        ch.queue_declare(q)  # declaring is not publishing: still read
        ch.basic_publish("", q, b"first")
        assert _pump(conn, lambda: events)
        assert events == [("blocked", "low on disk")]
        ch.basic_publish("", q, b"second")  # not read while blocked
        time.sleep(0.2)
        assert count(observer, q) == 1
    finally:
        broker.call(broker.broker.set_alarm, "disk", False)
    assert _pump(conn, lambda: len(events) == 2)
    assert wait_until(lambda: count(observer, q) == 2)


def test_two_alarms_unblock_only_when_both_clear(broker, connect):
    conn = connect()
    events = _events(conn)
    ch = conn.channel()
    q = uniq("bp")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x")
    broker.call(broker.broker.set_alarm, "memory", True, "test")
    broker.call(broker.broker.set_alarm, "disk", True, "test")
    assert _pump(conn, lambda: events)
    broker.call(broker.broker.set_alarm, "memory", False)
    _pump(conn, lambda: False, timeout=0.2)
    assert [e for e, _r in events] == ["blocked"]
    broker.call(broker.broker.set_alarm, "disk", False)
    assert _pump(conn, lambda: len(events) == 2)
    assert events[1][0] == "unblocked"


def test_confirms_wait_out_the_alarm_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(uniq("bp"))
            await ch.default_exchange.publish(aio_pika.Message(b"0"), routing_key=q.name)
            broker.call(broker.broker.set_alarm, "memory", True, "test")
            pending = [asyncio.ensure_future(ch.default_exchange.publish(
                aio_pika.Message(b"%d" % i), routing_key=q.name)) for i in range(1, 21)]
            await asyncio.sleep(0.3)
            assert not any(p.done() for p in pending)  # not read, so not confirmed
            broker.call(broker.broker.set_alarm, "memory", False)
            results = await asyncio.wait_for(asyncio.gather(*pending), 10)
            assert all(r.name == "Basic.Ack" for r in results)
            declared = await ch.declare_queue(q.name, passive=True)
            assert declared.declaration_result.message_count == 21
    asyncio.run(main())


def test_memory_high_watermark_of_a_broker_process_fires_by_itself(broker_proc):
    """Any Python process is above 1 MB resident: the alarm is raised on the first check."""
    bp = broker_proc.start("--memory-high-watermark", "1MB")
    conn = pika_connect(bp.port)
    cons = pika_connect(bp.port)
    try:
        events = _events(conn)
        ch = conn.channel()
        q = uniq("bp")
        ch.queue_declare(q)
        ch.basic_publish("", q, b"gets-in")
        assert _pump(conn, lambda: events, timeout=5), bp.log()[-2000:]
        assert events[0] == ("blocked", "low on memory")
        assert "memory alarm set" in bp.log()
        ch.basic_publish("", q, b"held-back")
        # consumers keep working during the alarm
        cch = cons.channel()
        m, _p, body = cch.basic_get(q, auto_ack=True)
        assert body == b"gets-in"
        time.sleep(0.3)
        assert cch.basic_get(q, auto_ack=True)[0] is None
    finally:
        # a blocked connection is not read, so its connection.close would wait for pika's
        # blocked_connection_timeout (RabbitMQ does the same): stop the broker first
        bp.kill()
        for c in (conn, cons):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - the broker is gone
                pass


def test_client_channel_flow_true_is_answered_false_is_540(connect):
    # RabbitMQ (rabbit_channel, channel.flow): active=true gets flow-ok, active=false is refused
    # with a connection error 540 NOT_IMPLEMENTED; deliveries never pause for a client's flow
    conn = connect()
    ch = conn.channel()
    assert ch.flow(True) is True
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
        ch.flow(False)
    assert exc.value.reply_code == 540
    assert exc.value.reply_text == "NOT_IMPLEMENTED - active=false"
