"""x-consistent-hash, x-modulus-hash and x-local-random over real sockets (pika), their errors as
RabbitMQ answers them, recovery after a restart, and the admin API listing and creating them."""
from __future__ import annotations

import pika
import pytest
from ext_helpers import count, get_all

from eb_support import uniq, wait_until


def _queues(ch, n, **kw):
    names = [uniq("chq") for _ in range(n)]
    for name in names:
        ch.queue_declare(name, **kw)
    return names


def _counts_after(ch, x, names, keys, props=None):
    """Purge ``names``, publish one message per routing key in ``keys`` to ``x``; the counts."""
    for name in names:
        ch.queue_purge(name)
    for key in keys:
        ch.basic_publish(x, key, b"m", props)
    wait_until(lambda: sum(count(ch, n) for n in names) == len(keys))
    return [count(ch, n) for n in names]


def test_consistent_hash_weights_over_pika(ch):
    x = uniq("chx")
    ch.exchange_declare(x, "x-consistent-hash")
    names = _queues(ch, 3)
    for name, weight in zip(names, ("1", "2", "7")):
        ch.queue_bind(name, x, weight)
    got = _counts_after(ch, x, names, [f"order-{i}" for i in range(2000)])
    assert 100 < got[0] < 300 and 280 < got[1] < 520 and 1200 < got[2] < 1600, got
    # one key, one queue, every time
    assert sorted(_counts_after(ch, x, names, ["customer-42"] * 20)) == [0, 0, 20]


def test_consistent_hash_on_header_and_property(ch):
    xh, xp = uniq("chx"), uniq("chx")
    ch.exchange_declare(xh, "x-consistent-hash", arguments={"hash-header": "customer"})
    ch.exchange_declare(xp, "x-consistent-hash", arguments={"hash-property": "message_id"})
    hq, pq = _queues(ch, 4), _queues(ch, 4)
    for a, b in zip(hq, pq):
        ch.queue_bind(a, xh, "10")
        ch.queue_bind(b, xp, "10")
    for i in range(40):   # routing keys differ; the header / message id is the same
        ch.basic_publish(xh, f"rk{i}", b"m", pika.BasicProperties(headers={"customer": "acme"}))
        ch.basic_publish(xp, f"rk{i}", b"m", pika.BasicProperties(message_id="id-1"))
    wait_until(lambda: sum(count(ch, n) for n in hq + pq) == 80)
    assert sorted(count(ch, n) for n in hq)[-1] == 40
    assert sorted(count(ch, n) for n in pq)[-1] == 40
    for i in range(200):
        ch.basic_publish(xp, "same", b"m", pika.BasicProperties(message_id=f"id-{i}"))
    wait_until(lambda: sum(count(ch, n) for n in pq) == 240)
    assert all(count(ch, n) > 10 for n in pq)


@pytest.mark.parametrize("args, text", [
    ({"hash-header": "h", "hash-property": "message_id"}, "mutually exclusive"),
    ({"hash-property": "app_id"}, "Unsupported property: app_id")])
def test_consistent_hash_bad_arguments_are_406(connect, args, text):
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare(uniq("chx"), "x-consistent-hash", arguments=args)
    assert err.value.reply_code == 406 and text in err.value.reply_text


def test_consistent_hash_bad_weight_is_406(connect):
    ch = connect().channel()
    x = uniq("chx")
    ch.exchange_declare(x, "x-consistent-hash")
    (name,) = _queues(ch, 1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_bind(name, x, "heavy")
    assert err.value.reply_code == 406 and "The binding key must be an integer" in err.value.reply_text


def test_modulus_hash_one_queue_per_message(ch):
    x = uniq("mhx")
    ch.exchange_declare(x, "x-modulus-hash")
    names = _queues(ch, 3)
    for name in names:
        ch.queue_bind(name, x, "any-key-is-ignored")
    assert all(n > 50 for n in _counts_after(ch, x, names, [f"k{i}" for i in range(300)]))
    assert sorted(_counts_after(ch, x, names, ["k7"] * 10)) == [0, 0, 10]


def test_local_random_rpc_over_exclusive_queues(connect):
    ch = connect().channel()
    x = uniq("lrx")
    ch.exchange_declare(x, "x-local-random")
    names = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for name in names:
        ch.queue_bind(name, x, "")
    for i in range(300):
        ch.basic_publish(x, "rpc.request", str(i).encode())
    wait_until(lambda: sum(count(ch, n) for n in names) == 300)
    assert all(count(ch, n) > 40 for n in names)   # random, each message to exactly one queue
    bodies = sorted(int(b) for n in names for _, _, b in get_all(ch, n))
    assert bodies == list(range(300))


@pytest.mark.parametrize("declare, key, text", [
    ({}, "rk", "Non empty binding 'rk' key not permitted"),
    ({"arguments": {"x-queue-type": "quorum"}, "durable": True}, "", "not valid for this exchange type")])
def test_local_random_binding_refusals(connect, declare, key, text):
    ch = connect().channel()
    x = uniq("lrx")
    ch.exchange_declare(x, "x-local-random")
    name = uniq("lrq")
    ch.queue_declare(name, **declare)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_bind(name, x, key)
    assert err.value.reply_code == 406 and text in err.value.reply_text
    connect().channel().queue_delete(name)


def test_local_random_refuses_an_exchange_destination(connect):
    ch = connect().channel()
    x, y = uniq("lrx"), uniq("lry")
    ch.exchange_declare(x, "x-local-random")
    ch.exchange_declare(y, "fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_bind(y, x, "")
    assert err.value.reply_code == 406 and "Destination not found" in err.value.reply_text


def test_consistent_hash_ring_survives_restart(broker_proc):
    broker_proc.start()
    conn = pika.BlockingConnection(pika.URLParameters(broker_proc.url))
    ch = conn.channel()
    ch.exchange_declare("chx", "x-consistent-hash", durable=True)
    names = ["chq-a", "chq-b", "chq-c"]
    for name, w in zip(names, ("3", "1", "5")):
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, "chx", w)
    for i in range(60):
        ch.basic_publish("chx", f"k{i}", b"m")
    wait_until(lambda: sum(count(ch, n) for n in names) == 60)
    before = [count(ch, n) for n in names]
    for n in names:
        ch.queue_purge(n)
    conn.close()
    broker_proc.terminate()
    broker_proc.start()
    conn = pika.BlockingConnection(pika.URLParameters(broker_proc.url))
    ch = conn.channel()
    for i in range(60):
        ch.basic_publish("chx", f"k{i}", b"m")
    wait_until(lambda: sum(count(ch, n) for n in names) == 60)
    assert [count(ch, n) for n in names] == before     # same keys, same queues after recovery
    conn.close()

