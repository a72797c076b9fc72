"""Dead-lettering (x-dead-letter-exchange / x-dead-letter-routing-key) with x-death exactly as
RabbitMQ 3.10 shapes it (each field compared by hand against a real RabbitMQ 3.10.8):

    x-death: [{count: long, reason: longstr, queue: longstr, time: timestamp (seconds),
               exchange: longstr, routing-keys: array of longstr,
               original-expiration: longstr (only with a per-message expiration)}]
    x-first-death-reason / -queue / -exchange (no x-last-death-*: those arrived in 3.13)

The rules without a shape to compare (TTL cycles, requeue is not a death, a missing dead-letter
exchange) are tested sans-IO on a ManualClock in tests/core/test_deadletter_rules.py.
"""

from __future__ import annotations

import asyncio
import datetime

import aio_pika
import pika
import pika.compat
import pytest

from eb_support import uniq, wait_until
from ext_helpers import count, get_all

DEATH_KEYS = {"count", "reason", "queue", "time", "exchange", "routing-keys"}


def _setup(ch, *, dlrk: str | None = "dead", **qargs):
    """A source queue dead-lettering to a direct exchange bound to a DLQ (by key 'dead')."""
    src, dlx, dlq = uniq("src"), uniq("dlx"), uniq("dlq")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, "dead")
    args = {"x-dead-letter-exchange": dlx, **qargs}
    if dlrk is not None:
        args["x-dead-letter-routing-key"] = dlrk
    ch.queue_declare(src, arguments=args)
    return src, dlx, dlq


def _one(ch, q):
    assert wait_until(lambda: count(ch, q) >= 1), f"nothing dead-lettered to {q}"
    [(m, p, b)] = get_all(ch, q)
    return m, p, b


def _check_death(death: dict, *, reason: str, queue: str, exchange: str, keys: list[str],
                 count_: int = 1, original_expiration: str | None = None) -> None:
    expected_keys = set(DEATH_KEYS)
    if original_expiration is not None:
        expected_keys.add("original-expiration")
    assert set(death) == expected_keys
    assert death["count"] == count_
    assert isinstance(death["count"], pika.compat.long)  # 'l' (signed 64-bit) on the wire
    assert death["reason"] == reason
    assert death["queue"] == queue
    assert death["exchange"] == exchange
    assert death["routing-keys"] == keys
    t = death["time"]
    assert isinstance(t, datetime.datetime)  # 'T' timestamp, whole seconds
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((now - t).total_seconds()) < 10
    if original_expiration is not None:
        assert death["original-expiration"] == original_expiration


def _check_first(headers: dict, reason: str, queue: str, exchange: str) -> None:
    assert headers["x-first-death-reason"] == reason
    assert headers["x-first-death-queue"] == queue
    assert headers["x-first-death-exchange"] == exchange
    assert not any(k.startswith("x-last-death") for k in headers)


def test_rejected_message_is_dead_lettered_with_x_death(ch):
    src, dlx, dlq = _setup(ch)
    ch.basic_publish("", src, b"body", pika.BasicProperties(headers={"app": "kept"}, message_id="m1",
                                                            delivery_mode=2))
    m, _p, _b = ch.basic_get(src)
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, p, body = _one(ch, dlq)
    assert body == b"body" and m.exchange == dlx and m.routing_key == "dead"
    assert not m.redelivered
    assert p.message_id == "m1" and p.delivery_mode == 2
    h = p.headers
    assert h["app"] == "kept"
    assert set(h) == {"app", "x-death", "x-first-death-reason", "x-first-death-queue",
                      "x-first-death-exchange"}
    [death] = h["x-death"]
    _check_death(death, reason="rejected", queue=src, exchange="", keys=[src])
    _check_first(h, "rejected", src, "")
    assert count(ch, src) == 0


def test_nack_without_requeue_multiple(ch):
    src, _dlx, dlq = _setup(ch)
    for i in range(3):
        ch.basic_publish("", src, b"%d" % i)
    tags = [ch.basic_get(src)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[-1], multiple=True, requeue=False)
    assert wait_until(lambda: count(ch, dlq) == 3)
    got = get_all(ch, dlq)
    assert [b for _m, _p, b in got] == [b"0", b"1", b"2"]
    assert all(p.headers["x-death"][0]["reason"] == "rejected" for _m, p, _b in got)


def test_expired_by_queue_ttl(ch):
    src, dlx, dlq = _setup(ch, **{"x-message-ttl": 50})
    ch.basic_publish("amq.direct", "", b"nope")  # unroutable; just to use a non-default exchange
    ch.queue_bind(src, "amq.direct", "via-amq")
    ch.basic_publish("amq.direct", "via-amq", b"t")
    m, p, body = _one(ch, dlq)
    assert body == b"t"
    [death] = p.headers["x-death"]
    _check_death(death, reason="expired", queue=src, exchange="amq.direct", keys=["via-amq"])
    _check_first(p.headers, "expired", src, "amq.direct")


def test_expired_by_per_message_ttl_keeps_original_expiration(ch):
    src, _dlx, dlq = _setup(ch)
    ch.basic_publish("", src, b"t", pika.BasicProperties(expiration="50"))
    m, p, body = _one(ch, dlq)
    assert p.expiration is None  # removed from the dead-lettered copy...
    [death] = p.headers["x-death"]  # ...and recorded here
    _check_death(death, reason="expired", queue=src, exchange="", keys=[src], original_expiration="50")


def test_rejected_message_with_expiration_records_original_expiration(ch):
    src, _dlx, dlq = _setup(ch)
    ch.basic_publish("", src, b"t", pika.BasicProperties(expiration="60000"))
    m, _p, _b = ch.basic_get(src)
    ch.basic_reject(m.delivery_tag, requeue=False)
    _m, p, _b = _one(ch, dlq)
    assert p.expiration is None
    _check_death(p.headers["x-death"][0], reason="rejected", queue=src, exchange="", keys=[src],
                 original_expiration="60000")


def test_maxlen_drop_head_is_dead_lettered(ch):
    src, _dlx, dlq = _setup(ch, **{"x-max-length": 2})
    for i in range(4):
        ch.basic_publish("", src, b"%d" % i)
    assert wait_until(lambda: count(ch, dlq) == 2)
    dropped = get_all(ch, dlq)
    assert [b for _m, _p, b in dropped] == [b"0", b"1"]  # the head is dropped
    for _m, p, _b in dropped:
        _check_death(p.headers["x-death"][0], reason="maxlen", queue=src, exchange="", keys=[src])
    assert [b for _m, _p, b in get_all(ch, src)] == [b"2", b"3"]


def test_without_dead_letter_routing_key_the_original_key_is_used(ch):
    src, dlx, dlq = _setup(ch, dlrk=None)
    ch.queue_bind(dlq, dlx, src)  # the original routing key is the queue name (default exchange)
    ch.basic_publish("", src, b"x")
    m, _p, _b = ch.basic_get(src)
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, _p, _b = _one(ch, dlq)
    assert m.routing_key == src and m.exchange == dlx


def test_cc_without_dlrk_routes_again_and_is_recorded(ch):
    """RabbitMQ 3.10: routing-keys lists the routing key and CC; without a dead-letter routing
    key the dead-lettered copy is routed by all of them (CC kept)."""
    src, dlx, dlq = _setup(ch, dlrk=None)
    other = uniq("dlq2")
    ch.queue_declare(other)
    ch.queue_bind(dlq, dlx, src)
    ch.queue_bind(other, dlx, "cc-key")
    ch.basic_publish("", src, b"x", pika.BasicProperties(headers={"CC": ["cc-key"], "BCC": ["bcc-key"]}))
    m, _p, _b = ch.basic_get(src)
    ch.basic_reject(m.delivery_tag, requeue=False)
    for q in (dlq, other):
        m, p, _b = _one(ch, q)
        assert m.routing_key == src
        assert p.headers["CC"] == ["cc-key"] and "BCC" not in p.headers
        _check_death(p.headers["x-death"][0], reason="rejected", queue=src, exchange="",
                     keys=[src, "cc-key"])


def test_cc_is_removed_when_a_dead_letter_routing_key_is_set(ch):
    src, _dlx, dlq = _setup(ch)
    ch.basic_publish("", src, b"x", pika.BasicProperties(headers={"CC": ["elsewhere"], "k": "v"}))
    m, _p, _b = ch.basic_get(src)
    ch.basic_reject(m.delivery_tag, requeue=False)
    _m, p, _b = _one(ch, dlq)
    assert "CC" not in p.headers and p.headers["k"] == "v"
    assert p.headers["x-death"][0]["routing-keys"] == [src, "elsewhere"]


def test_count_increments_for_the_same_queue_and_reason_and_newest_first(ch):
    """A rejection cycle (A rejects -> DLX -> A) keeps going; count increments; a different
    (queue, reason) gets its own entry at the front."""
    a, b = uniq("a"), uniq("b")
    ch.queue_declare(a, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"cycle")
    for n in range(1, 4):
        assert wait_until(lambda: count(ch, a) == 1)
        m, p, _b = ch.basic_get(a)
        if n > 1:
            assert p.headers["x-death"][0]["count"] == n - 1
        ch.basic_reject(m.delivery_tag, requeue=False)
    assert wait_until(lambda: count(ch, a) == 1)
    # now route it through a TTL queue b that dead-letters back to a
    ch.queue_declare(b, arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": a})
    m, p, body = ch.basic_get(a)
    ch.basic_ack(m.delivery_tag)
    ch.basic_publish("", b, body, pika.BasicProperties(headers=p.headers))
    assert wait_until(lambda: count(ch, a) == 1)
    _m, p, _b = ch.basic_get(a, auto_ack=True)
    deaths = p.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [(b, "expired", 1), (a, "rejected", 3)]
    _check_first(p.headers, "rejected", a, "")  # x-first-death-* never changes


def test_dead_letter_routing_key_requires_exchange(ch):
    q = uniq("src")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare(q, arguments={"x-dead-letter-routing-key": "k"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.endswith("routing_key_but_no_dlx_defined")


def test_dead_lettering_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            dlq = await ch.declare_queue(uniq("dlq"))
            src = await ch.declare_queue(uniq("src"), arguments={
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name})
            await ch.default_exchange.publish(aio_pika.Message(b"a", expiration=60), routing_key=src.name)
            msg = await src.get()
            await msg.reject(requeue=False)
            for _ in range(100):
                dead = await dlq.get(fail=False)
                if dead is not None:
                    break
                await asyncio.sleep(0.02)
            assert dead is not None and dead.body == b"a"
            [death] = dead.headers["x-death"]
            assert death["count"] == 1 and death["reason"] == "rejected" and death["queue"] == src.name
            assert death["routing-keys"] == [src.name] and death["exchange"] == ""
            assert death["original-expiration"] == "60000"
            assert isinstance(death["time"], datetime.datetime)
            assert dead.headers["x-first-death-reason"] == "rejected"
            assert dead.expiration is None
            await dead.ack()
    asyncio.run(main())
