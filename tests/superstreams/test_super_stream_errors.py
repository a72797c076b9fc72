"""Bad input around super streams gets RabbitMQ-style AMQP errors (channel 406/404, connection
540), and the broker keeps serving: declare arguments, redeclaration, name clashes, bindings,
x-partition headers, and consumer-group consumes on the wrong thing or with the wrong options."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from eb_support import uniq
from ss_helpers import declare

SS = "x-super-stream"


def _refused(conn, fn, code: int, text: str) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        fn(ch)
    assert exc.value.reply_code == code, exc.value.reply_text
    assert text in exc.value.reply_text, exc.value.reply_text


@pytest.mark.parametrize("value", [None, 0, -1, 1025, "abc", True])
def test_bad_x_partitions(connect, value):
    conn = connect()
    name = uniq("ss")
    args = {} if value is None else {"x-partitions": value}
    _refused(conn, lambda ch: ch.exchange_declare(name, SS, durable=True, arguments=args), 406,
             f"invalid arg 'x-partitions' for exchange '{name}' in vhost '/'")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker):
        ch.exchange_declare(name, passive=True)        # nothing was created
    with pytest.raises(ChannelClosedByBroker):
        conn.channel().queue_declare(f"{name}-0", passive=True)


def test_declare_rules(connect):
    conn = connect()
    name = uniq("ss")
    _refused(conn, lambda ch: ch.exchange_declare(name, SS, arguments={"x-partitions": 2}), 406,
             "invalid property 'non-durable'")
    _refused(conn, lambda ch: ch.exchange_declare(name, SS, durable=True, auto_delete=True,
                                                  arguments={"x-partitions": 2}), 406,
             "invalid property 'auto-delete'")
    _refused(conn, lambda ch: ch.exchange_declare(name, SS, durable=True, arguments={
        "x-partitions": 2, "x-max-age": "soon"}), 406, "invalid arg 'x-max-age'")
    ch = conn.channel()
    ch.queue_declare(f"{name}-1")                      # a partition's name is taken
    _refused(conn, lambda ch: declare(ch, name, 2), 406, f"queue '{name}-1' in vhost '/'")
    ch.queue_delete(f"{name}-1")
    declare(ch, name, 2)
    declare(ch, name, 2)                               # the same again: fine
    _refused(conn, lambda ch: declare(ch, name, 3), 406, "inequivalent arg 'x-partitions'")
    q = ch.queue_declare("", exclusive=True).method.queue
    _refused(conn, lambda ch: ch.queue_bind(q, name, "not-a-number"), 406, "binding key")
    # x-partition naming no partition: unroutable (returned when mandatory)
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a[1].routing_key))
    ch.confirm_delivery()
    for bad in (7, "nope", f"{name}-9"):
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(name, "k", b"x", pika.BasicProperties(headers={"x-partition": bad}),
                             mandatory=True)
    ch.basic_publish(name, "k", b"x", pika.BasicProperties(headers={"x-partition": f"{name}-1"}))
    ch.basic_publish(name, "k", b"x", pika.BasicProperties(headers={"x-partition": "0"}))
    assert ch.queue_declare(f"{name}-1", passive=True).method.message_count == 1
    assert ch.queue_declare(f"{name}-0", passive=True).method.message_count == 1
    ch.exchange_delete(name)                           # deletes its partitions too
    with pytest.raises(ChannelClosedByBroker):
        ch.queue_declare(f"{name}-0", passive=True)


def test_bad_group_consumes(connect):
    conn = connect()
    name = uniq("ss")
    ch = conn.channel()
    declare(ch, name, 2)
    plain = ch.queue_declare(uniq("plain"), durable=True, arguments={"x-queue-type": "stream"}).method.queue

    def consume(queue, group="g", qos=10, **kw):
        def go(ch):
            if qos:
                ch.basic_qos(prefetch_count=qos)
            args = {"x-consumer-group": group} if group is not None else {}
            args.update(kw.pop("arguments", {}))
            ch.basic_consume(queue, lambda *a: None, arguments=args, **kw)
        return go

    _refused(conn, consume(plain), 406, f"invalid arg 'x-consumer-group' for queue '{plain}'")
    _refused(conn, consume("no-such-thing"), 404, "no super stream 'no-such-thing' in vhost '/'")
    _refused(conn, consume(name, group=""), 406, "expected a non-empty string")
    _refused(conn, consume(name, group=5), 406, "expected a non-empty string")
    _refused(conn, consume(name, qos=0), 406, "consumer prefetch count is not set")
    _refused(conn, consume(name, arguments={"x-stream-offset": "sometime"}), 406,
             "invalid arg 'x-stream-offset'")
    _refused(conn, consume(name, arguments={"x-priority": 3}), 406, "invalid arg 'x-priority'")
    _refused(conn, consume(name, exclusive=True), 406, "exclusive consume not supported")
    _refused(conn, consume(name, group=None), 404, f"no queue '{name}'")  # not a queue itself
    with pytest.raises(ConnectionClosedByBroker) as exc:
        consume(name, auto_ack=True)(conn.channel())
    assert exc.value.reply_code == 540


def test_broker_keeps_serving_after_errors(connect):
    """After the refusals above on one connection, a group on another works as ever."""
    conn = connect()
    name = uniq("ss")
    ch = conn.channel()
    declare(ch, name, 2)
    _refused(conn, lambda c: c.basic_consume(name, lambda *a: None,
                                             arguments={"x-consumer-group": ""}), 406, "non-empty")
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish(name, f"k{i}", b"%d" % i)
    got = []
    c2 = conn.channel()
    c2.basic_qos(prefetch_count=5)

    def on(chan, method, props, body):
        got.append(int(body))
        chan.basic_ack(method.delivery_tag)
    c2.basic_consume(name, on, arguments={"x-consumer-group": "g", "x-stream-offset": "first"})
    for _ in range(200):
        if len(got) >= 20:
            break
        conn.process_data_events(0.02)
    assert sorted(got) == list(range(20))


def test_partitions_need_configure_permission(broker, connect):
    """Declaring (and deleting) a super stream declares (deletes) its partition queues: the user
    needs configure permission on them too (403 otherwise, nothing created)."""
    broker.broker.add_user("narrow", "pw", [])
    broker.broker.set_permissions("narrow", "/", "^(orders|other.*)$", ".*", ".*")
    conn = connect(user="narrow", password="pw")
    _refused(conn, lambda ch: declare(ch, "orders", 2), 403, "access to queue 'orders-0'")
    assert "orders" not in broker.broker.vhosts["/"].exchanges
    declare(conn.channel(), "other", 2)                # other-0, other-1 match the pattern
    broker.broker.set_permissions("narrow", "/", "^other$", ".*", ".*")
    _refused(conn, lambda ch: ch.exchange_delete("other"), 403, "access to queue 'other-0'")
