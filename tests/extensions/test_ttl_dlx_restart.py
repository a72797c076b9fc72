"""TTL and dead-lettering across a broker crash (SIGKILL) and restart on the SQLite store.

A message's expiry is stored as an absolute time (expires_ms), so time spent down counts."""

from __future__ import annotations

import sqlite3
import time

import pika

from eb_support import pika_connect, uniq, wait_until
from ext_helpers import get_all

PERSISTENT = 2


def _confirmed_channel(conn):
    ch = conn.channel()
    ch.confirm_delivery()  # confirms of persistent messages on durable queues come after the commit
    return ch


def _stored(bp, *queues: str) -> int:
    """Message rows of ``queues`` in the broker's SQLite store (what a restart recovers)."""
    db = sqlite3.connect(bp.workdir / "data" / "broker.db")
    try:
        marks = ", ".join("?" * len(queues))
        return db.execute(f"SELECT count(*) FROM messages WHERE queue_id IN "
                          f"(SELECT id FROM queues WHERE vhost = '/' AND name IN ({marks}))",
                          queues).fetchone()[0]
    finally:
        db.close()


def _close(conn):
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - the broker may be gone
        pass


def test_message_that_expired_while_the_broker_was_down_is_not_delivered(broker_proc):
    bp = broker_proc.start()
    conn = pika_connect(bp.port)
    ch = _confirmed_channel(conn)
    q_ttl, q_exp = uniq("qttl"), uniq("msgttl")
    ch.queue_declare(q_ttl, durable=True, arguments={"x-message-ttl": 1000})
    ch.queue_declare(q_exp, durable=True)
    ch.basic_publish("", q_ttl, b"queue-ttl", pika.BasicProperties(delivery_mode=PERSISTENT))
    ch.basic_publish("", q_exp, b"short", pika.BasicProperties(delivery_mode=PERSISTENT, expiration="1000"))
    ch.basic_publish("", q_exp, b"long", pika.BasicProperties(delivery_mode=PERSISTENT,
                                                              expiration="600000"))
    ch.basic_publish("", q_exp, b"forever", pika.BasicProperties(delivery_mode=PERSISTENT))
    bp.kill()
    _close(conn)
    time.sleep(1.2)  # both short TTLs pass while the broker is down

    bp.start()
    conn = pika_connect(bp.port)
    try:
        ch = conn.channel()
        assert get_all(ch, q_ttl) == []
        got = get_all(ch, q_exp)
        assert [b for _m, _p, b in got] == [b"long", b"forever"]
        assert got[0][1].expiration == "600000"
        # and through a consumer as well (nothing left to deliver)
        ch.basic_publish("", q_ttl, b"fresh", pika.BasicProperties(delivery_mode=PERSISTENT))
        assert [b for _m, _p, b in get_all(ch, q_ttl)] == [b"fresh"]
    finally:
        _close(conn)


def test_expired_while_down_is_dead_lettered_after_restart(broker_proc):
    bp = broker_proc.start()
    conn = pika_connect(bp.port)
    ch = _confirmed_channel(conn)
    src, dlq = uniq("src"), uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(src, durable=True, arguments={"x-message-ttl": 800, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", src, b"doomed", pika.BasicProperties(delivery_mode=PERSISTENT))
    bp.kill()
    _close(conn)
    time.sleep(1.0)
    bp.start()
    conn = pika_connect(bp.port)
    try:
        ch = conn.channel()
        got = wait_until(lambda: get_all(ch, dlq), timeout=5, interval=0.05)
        assert [b for _m, _p, b in got] == [b"doomed"]
        [death] = got[0][1].headers["x-death"]
        assert (death["reason"], death["queue"]) == ("expired", src)
        assert get_all(ch, src) == []
    finally:
        _close(conn)


def test_dead_lettered_persistent_messages_on_a_durable_dlq_survive_a_restart(broker_proc):
    bp = broker_proc.start()
    conn = pika_connect(bp.port)
    ch = _confirmed_channel(conn)
    dlx, dlq, src = uniq("dlx"), uniq("dlq"), uniq("src")
    ch.exchange_declare(dlx, "direct", durable=True)
    ch.queue_declare(dlq, durable=True)
    ch.queue_bind(dlq, dlx, "dead")
    ch.queue_declare(src, durable=True, arguments={"x-dead-letter-exchange": dlx,
                                                   "x-dead-letter-routing-key": "dead",
                                                   "x-max-length": 5})
    for i in range(8):  # 3 dropped by the length limit (maxlen)
        ch.basic_publish("", src, b"m%d" % i, pika.BasicProperties(delivery_mode=PERSISTENT,
                                                                  headers={"n": i}))
    tags = [ch.basic_get(src)[0].delivery_tag for _ in range(2)]
    for tag in tags:  # 2 rejected (rejected)
        ch.basic_reject(tag, requeue=False)
    for i in range(3):  # 3 ready + 3 transient > 5: m5 is dropped (maxlen)
        ch.basic_publish("", src, b"transient", pika.BasicProperties(delivery_mode=1))
    # dead-lettering has no confirm: wait for the store to hold the six copies
    assert wait_until(lambda: _stored(bp, dlq) == 6, 15), _stored(bp, dlq)
    bp.kill()
    _close(conn)

    bp.start()
    conn = pika_connect(bp.port)
    try:
        ch = conn.channel()
        got = get_all(ch, dlq)
        bodies = [b for _m, _p, b in got]
        # persistent dead-lettered copies survived; the order of arrival in the DLQ is kept
        assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
        reasons = [p.headers["x-death"][0]["reason"] for _m, p, _b in got]
        assert reasons == ["maxlen", "maxlen", "maxlen", "rejected", "rejected", "maxlen"]
        for (m, p, body) in got:
            assert p.delivery_mode == PERSISTENT
            assert p.headers["n"] == int(body[1:])
            assert p.headers["x-first-death-queue"] == src
            assert m.exchange == dlx and m.routing_key == "dead"
        # the source kept m6, m7 (persistent); the transient messages are gone
        assert [b for _m, _p, b in get_all(ch, src)] == [b"m6", b"m7"]
    finally:
        _close(conn)


def test_expired_while_down_goes_through_a_dlx_exchange_declared_later_and_stays_settled(broker_proc):
    """The DLX is a named exchange and the DLQ was declared after the source queue: recovery
    dead-letters only once every queue and binding is back, and stores the outcome (the copy is
    kept and the original row deleted: consuming the copy makes it gone for good)."""
    bp = broker_proc.start()
    conn = pika_connect(bp.port)
    ch = _confirmed_channel(conn)
    src, dlx, dlq = uniq("src"), uniq("dlx"), uniq("dlq")
    ch.queue_declare(src, durable=True, arguments={"x-message-ttl": 700, "x-dead-letter-exchange": dlx})
    ch.exchange_declare(dlx, "fanout", durable=True)
    ch.queue_declare(dlq, durable=True)
    ch.queue_bind(dlq, dlx)
    ch.basic_publish("", src, b"doomed", pika.BasicProperties(delivery_mode=PERSISTENT))
    bp.kill()
    _close(conn)
    time.sleep(0.8)

    bp.start()
    conn = pika_connect(bp.port)
    ch = conn.channel()
    got = get_all(ch, dlq)  # consumed (auto-ack)
    assert [b for _m, _p, b in got] == [b"doomed"]
    assert got[0][1].headers["x-death"][0]["reason"] == "expired"
    assert get_all(ch, src) == []
    assert wait_until(lambda: _stored(bp, src, dlq) == 0, 15)  # the ack reached the store
    bp.kill()
    _close(conn)

    bp.start()
    conn = pika_connect(bp.port)
    try:
        ch = conn.channel()
        assert get_all(ch, src) == [] and get_all(ch, dlq) == []  # not resurrected
    finally:
        _close(conn)


def test_ttl_timer_runs_after_a_restart(broker_proc):
    """A message whose TTL had not yet passed at restart still expires (and is dead-lettered)
    on time, without any consumer or basic.get touching the queue."""
    bp = broker_proc.start()
    conn = pika_connect(bp.port)
    ch = _confirmed_channel(conn)
    src, dlq = uniq("src"), uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(src, durable=True, arguments={"x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", src, b"later", pika.BasicProperties(delivery_mode=PERSISTENT, expiration="2500"))
    bp.kill()
    _close(conn)
    bp.start()
    conn = pika_connect(bp.port)
    try:
        ch = conn.channel()
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            if ch.queue_declare(dlq, passive=True).method.message_count:
                break
            time.sleep(0.1)
        assert ch.queue_declare(dlq, passive=True).method.message_count == 1
        assert ch.queue_declare(src, passive=True).method.message_count == 0
    finally:
        _close(conn)
