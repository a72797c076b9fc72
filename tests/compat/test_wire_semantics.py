"""Where clients in other languages look and the broker used to differ from RabbitMQ 3.x (issue
25): each test names what RabbitMQ does (its source: rabbit_reader.erl, rabbit_channel.erl, ...)
and checks the broker does the same, over a real socket (raw frames where pika hides the order)."""

from __future__ import annotations

import struct
import time

import pika
import pytest
from pamqp import commands as C

from eb_support import RawClient, uniq, wait_until

CAPS = {"capabilities": {"authentication_failure_close": True, "consumer_cancel_notify": True}}


def _consumed_queue(client: RawClient) -> str:
    """A new queue with consumer "ct" on channel 1."""
    queue = uniq("qdel")
    client.send(1, C.Queue.Declare(queue=queue))
    client.expect_next(C.Queue.DeclareOk)
    client.send(1, C.Basic.Consume(queue=queue, consumer_tag="ct"))
    client.expect_next(C.Basic.ConsumeOk)
    return queue


def test_queue_delete_ok_comes_before_the_cancel_of_a_consumer_on_the_same_channel(broker):
    # rabbit_channel replies delete-ok, the queue's cancel notification follows; clients that close
    # the channel on basic.cancel (amqplib's suite) otherwise lose the reply
    client = RawClient(broker.port, open_channel=1, client_properties=CAPS)
    try:
        queue = _consumed_queue(client)
        client.send(1, C.Queue.Delete(queue=queue))
        assert client.expect_next(C.Queue.DeleteOk, channel=1).message_count == 0
        assert client.expect_next(C.Basic.Cancel, channel=1).consumer_tag == "ct"
        # the channel is still open and in step
        client.send(1, C.Basic.Qos(prefetch_count=1))
        client.expect_next(C.Basic.QosOk, channel=1)
        client.close_connection()
    finally:
        client.close()


def test_queue_delete_ok_first_for_a_durable_queue_in_a_sqlite_store(spawn_broker):
    # the reply waits for the store (a held place in the channel's output): still first
    proc = spawn_broker()
    client = RawClient(proc.port, open_channel=1, client_properties=CAPS)
    try:
        queue = uniq("qdel")
        client.send(1, C.Queue.Declare(queue=queue, durable=True))
        client.expect_next(C.Queue.DeclareOk)
        client.publish(1, "", queue, b"ready", C.Basic.Properties(delivery_mode=2))
        client.send(1, C.Basic.Consume(queue=queue, consumer_tag="ct", no_ack=True),
                    C.Queue.Delete(queue=queue))
        client.expect_next(C.Basic.ConsumeOk)
        client.expect(C.Queue.DeleteOk)  # after the one delivery, if it was sent before
        assert client.expect_next(C.Basic.Cancel, channel=1).consumer_tag == "ct"
        client.close_connection()
    finally:
        client.close()


def test_queue_delete_of_a_consumed_queue_with_if_unused_is_still_406(broker):
    client = RawClient(broker.port, open_channel=1, client_properties=CAPS)
    try:
        queue = _consumed_queue(client)
        client.send(1, C.Queue.Delete(queue=queue, if_unused=True))
        close = client.expect_next(C.Channel.Close)
        assert close.reply_code == 406
        client.send(1, C.Channel.CloseOk())
        client.close_connection()
    finally:
        client.close()


@pytest.mark.parametrize("caps", [{}, {"capabilities": {"authentication_failure_close": False}}])
def test_refused_login_without_failure_close_capability_is_a_closed_socket(broker, caps):
    # rabbit_reader:auth_fail sends connection.close 403 only with authentication_failure_close
    client = RawClient(broker.port, handshake=False)
    try:
        assert client.handshake(password="wrong", client_properties=caps) is None
        assert client.tune is None
    finally:
        client.close()


def test_refused_login_with_failure_close_capability_is_403(broker):
    client = RawClient(broker.port, handshake=False)
    try:
        close = client.handshake(password="wrong", client_properties=CAPS)
        assert isinstance(close, C.Connection.Close) and close.reply_code == 403
        assert "Login was refused" in close.reply_text
    finally:
        client.close()


def _short(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def _method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    """A method frame written by hand: pamqp refuses to encode names with CR/LF."""
    payload = struct.pack(">HH", class_id, method_id) + args
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


NO_ARGS = b"\x00\x00\x00\x00"


def test_cr_and_lf_are_dropped_from_names_as_rabbitmq_does(broker):
    # rabbit_channel:strip_cr_lf on queue.declare/delete, exchange.declare/delete and both names of
    # a binding: "a\r\nb" is "ab"; a passive declare of the stripped name finds it
    client = RawClient(broker.port, open_channel=1)
    try:
        queue, exchange = uniq("crlf"), uniq("crlfx")
        q_crlf, x_crlf = queue[:3] + "\r\n" + queue[3:], exchange[:2] + "\n" + exchange[2:] + "\r"
        client.send_raw(_method(1, 50, 10, b"\x00\x00" + _short(q_crlf) + b"\x00" + NO_ARGS))
        assert client.expect_next(C.Queue.DeclareOk).queue == queue
        client.send_raw(_method(1, 40, 10, b"\x00\x00" + _short(x_crlf) + _short("fanout") + b"\x00" + NO_ARGS))
        client.expect_next(C.Exchange.DeclareOk)
        client.send_raw(_method(1, 50, 20, b"\x00\x00" + _short(q_crlf) + _short(x_crlf) + _short("") + b"\x00"
                                + NO_ARGS))
        client.expect_next(C.Queue.BindOk)
        client.publish(1, exchange, "any", b"through the stripped names")
        assert wait_until(lambda: (client.send(1, C.Queue.Declare(queue=queue, passive=True)),
                                   client.expect_next(C.Queue.DeclareOk).message_count)[1] == 1)
        client.send_raw(_method(1, 40, 20, b"\x00\x00" + _short(x_crlf) + b"\x00"))
        client.expect_next(C.Exchange.DeleteOk)
        client.send_raw(_method(1, 50, 40, b"\x00\x00" + _short(q_crlf) + b"\x00"))
        assert client.expect_next(C.Queue.DeleteOk).message_count == 1
        client.close_connection()
    finally:
        client.close()


def test_declares_of_direct_reply_to_are_passive_as_in_rabbitmq(connect):
    # rabbit_channel: any queue.declare of amq.rabbitmq.reply-to* is passive; the pseudo-queue
    # exists with one consumer; a reply address while its channel consumes, else 404
    conn = connect()
    ch = conn.channel()
    for passive in (True, False):
        ok = ch.queue_declare("amq.rabbitmq.reply-to", passive=passive).method
        assert (ok.queue, ok.message_count, ok.consumer_count) == ("amq.rabbitmq.reply-to", 0, 1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("amq.rabbitmq.reply-to.unknown", passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no queue 'amq.rabbitmq.reply-to.unknown' in vhost '/'"
    # a live reply address: the client's own, as a server sees it in reply_to
    server = conn.channel()
    server_q = server.queue_declare("", exclusive=True).method.queue
    ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    ch.basic_publish("", server_q, b"request", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    method, props, _ = wait_until(lambda: (lambda got: got if got[0] else None)(server.basic_get(server_q, True)))
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
    ok = server.queue_declare(props.reply_to, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (props.reply_to, 0, 1)


def test_consumer_x_priority_void_is_406(broker):
    # rabbit_amqqueue's consumer argument check: x-priority must be an integer, void included
    client = RawClient(broker.port, open_channel=1)
    try:
        client.send(1, C.Queue.Declare(queue="prio-void"))
        client.expect_next(C.Queue.DeclareOk)
        client.send(1, C.Basic.Consume(queue="prio-void", arguments={"x-priority": None}))
        close = client.expect_next(C.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 20)
        assert close.reply_text.endswith('"expected integer, got void"')
    finally:
        client.close()


def _gets(ch, queue: str, n: int) -> list[int]:
    tags = []
    for _ in range(n):
        method = wait_until(lambda: ch.basic_get(queue)[0])
        tags.append(method.delivery_tag)
    return tags


def _ready(conn, queue: str) -> int:
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        ch.close()


@pytest.fixture
def tx_queue(connect):
    """(connection, transactional channel, queue holding a, b, c)."""
    conn = connect()
    ch = conn.channel()
    queue = ch.queue_declare(uniq("tx"), exclusive=True).method.queue
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", queue, body)
    ch.tx_select()
    return conn, ch, queue


def test_an_ack_twice_in_a_transaction_is_406_at_the_second(tx_queue):
    # rabbit_channel collects acks out of the unacked queue when they come, tx or not
    conn, ch, queue = tx_queue
    [tag] = _gets(ch, queue, 1)
    ch.basic_ack(tag)
    ch.basic_ack(tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert (info.value.reply_code, info.value.reply_text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")


def test_basic_recover_in_a_transaction_leaves_the_acked_deliveries_to_the_commit(tx_queue):
    conn, ch, queue = tx_queue
    tags = _gets(ch, queue, 3)
    ch.basic_ack(tags[0])
    ch.basic_recover(requeue=True)  # b and c go back; a waits for the commit
    ch.tx_commit()
    assert wait_until(lambda: _ready(conn, queue) == 2)


def test_tx_rollback_makes_the_acked_deliveries_outstanding_again(tx_queue):
    conn, ch, queue = tx_queue
    tags = _gets(ch, queue, 3)
    ch.basic_ack(tags[1])
    ch.basic_reject(tags[0], requeue=False)
    ch.tx_rollback()
    ch.basic_ack(tags[1])  # known again
    ch.tx_commit()
    assert _ready(conn, queue) == 0
    ch.close()  # a and c were never settled: requeued
    assert wait_until(lambda: _ready(conn, queue) == 2)


def test_closing_a_channel_with_uncommitted_acks_requeues_those_deliveries(tx_queue):
    conn, ch, queue = tx_queue
    tags = _gets(ch, queue, 3)
    ch.basic_ack(tags[2], multiple=True)
    ch.close()
    assert wait_until(lambda: _ready(conn, queue) == 3)


def _drain(ch, queue: str) -> list:
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, props.headers))


def test_cc_and_bcc_keys_are_matched_at_every_exchange_through_e2e_bindings(connect):
    # rabbit_exchange:route matches all of a message's routing keys (its own, CC, BCC) at each
    # exchange it passes, bound exchanges included; BCC is removed from what is delivered
    ch = connect().channel()
    src, dst = uniq("cc-src"), uniq("cc-dst")
    ch.exchange_declare(src, "direct", auto_delete=True)
    ch.exchange_declare(dst, "direct", auto_delete=True)
    ch.exchange_bind(dst, src, routing_key="k2")
    queues = {}
    for key in ("k1", "k2", "k3"):
        queues[key] = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queues[key], dst, key)
    ch.basic_publish(src, "k1", b"m", pika.BasicProperties(headers={"CC": ["k2"], "BCC": ["k3"]}))
    ch.basic_publish(src, "k2", b"m2", pika.BasicProperties(headers={"CC": ["k3"]}))
    ch.basic_publish(src, "k1", b"m3", pika.BasicProperties(headers={"CC": ["k3"]}))  # no key passes src
    assert wait_until(lambda: ch.queue_declare(queues["k1"], passive=True).method.message_count == 1)
    assert _drain(ch, queues["k1"]) == [(b"m", {"CC": ["k2"]})]
    assert _drain(ch, queues["k2"]) == [(b"m", {"CC": ["k2"]}), (b"m2", {"CC": ["k3"]})]
    assert _drain(ch, queues["k3"]) == [(b"m", {"CC": ["k2"]}), (b"m2", {"CC": ["k3"]})]


def _consume_for(conn, seconds: float = 0.5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)


def test_a_ttl_of_0_reaches_a_consumer_that_can_take_it_now(connect):
    # rabbit_amqqueue_process:deliver_or_enqueue tries a consumer before the TTL applies: with
    # prefetch 1 the first message is delivered, the others expire (dead-lettered) at once
    conn = connect()
    ch = conn.channel()
    dead = ch.queue_declare("", exclusive=True).method.queue
    queue = ch.queue_declare("", exclusive=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}).method.queue
    ch.basic_publish("", queue, b"nobody waits")
    assert wait_until(lambda: _ready(conn, dead) == 1)
    got = []
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(queue, lambda c, m, p, b: got.append(b))
    for i in range(3):
        ch.basic_publish("", queue, b"w%d" % i)
    # a per-message expiration of 0 likewise, to a consumer without a prefetch limit
    other = conn.channel()
    plain = other.queue_declare("", exclusive=True).method.queue
    other.basic_consume(plain, lambda c, m, p, b: got.append((b, p.expiration)), auto_ack=True)
    for i in range(3):
        other.basic_publish("", plain, b"e%d" % i, pika.BasicProperties(expiration="0"))
    _consume_for(conn)
    assert wait_until(lambda: (conn.process_data_events(0.05), len(got))[1] == 4)
    assert got == [b"w0"] + [(b"e%d" % i, "0") for i in range(3)]
    assert [b for b, _ in _drain(ch, dead)] == [b"nobody waits", b"w1", b"w2"]


@pytest.mark.parametrize("dead_letter", [False, True])
def test_x_max_length_applies_again_after_a_requeue(connect, dead_letter):
    # rabbit_amqqueue_process:requeue_and_run calls maybe_drop_head: the requeued messages at the
    # head go (dead-lettered with reason maxlen when the queue has a DLX)
    conn = connect()
    ch = conn.channel()
    args = {"x-max-length": 2}
    dead = ch.queue_declare("", exclusive=True).method.queue
    if dead_letter:
        args.update({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    queue = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    ch.basic_publish("", queue, b"1")
    ch.basic_publish("", queue, b"2")
    _gets(ch, queue, 2)  # now unacked: the queue holds none ready
    ch.basic_publish("", queue, b"3")
    ch.basic_publish("", queue, b"4")
    assert wait_until(lambda: _ready(conn, queue) == 2)
    ch.basic_nack(0, multiple=True, requeue=True)
    assert wait_until(lambda: _ready(conn, queue) == 2)
    assert [b for b, _ in _drain(ch, queue)] == [b"3", b"4"]
    dead_lettered = _drain(ch, dead)
    if dead_letter:
        assert [(b, [(d["reason"], d["count"]) for d in h["x-death"]]) for b, h in dead_lettered] == \
            [(b"1", [("maxlen", 1)]), (b"2", [("maxlen", 1)])]
    else:
        assert dead_lettered == []


def _ttl_table(kind: bytes, packed: bytes) -> bytes:
    entry = _short("x-message-ttl") + kind + packed
    return struct.pack(">I", len(entry)) + entry


@pytest.mark.parametrize("kind,packed,equivalent", [
    (b"l", struct.pack(">q", 1000), True),       # long long
    (b"s", struct.pack(">h", 1000), True),       # short
    (b"u", struct.pack(">H", 1000), True),       # unsigned short
    (b"i", struct.pack(">I", 1000), True),       # unsigned int
    (b"d", struct.pack(">d", 1000.0), False),    # double: another type class
    (b"f", struct.pack(">f", 1000.0), False),    # float
])
def test_redeclare_with_x_message_ttl_of_another_type(broker, kind, packed, equivalent):
    # rabbit_misc:assert_args_equivalence compares type classes: every integer type is one, so
    # 1000 as a long is the signed int 1000; 1000.0 is not
    queue = uniq("ttl-type")
    client = RawClient(broker.port, open_channel=1)
    try:
        client.send_raw(_method(1, 50, 10, b"\x00\x00" + _short(queue) + b"\x00" + _ttl_table(b"I", struct.pack(">i", 1000))))
        client.expect_next(C.Queue.DeclareOk)
        client.send_raw(_method(1, 50, 10, b"\x00\x00" + _short(queue) + b"\x00" + _ttl_table(kind, packed)))
        if equivalent:
            client.expect_next(C.Queue.DeclareOk)
        else:
            close = client.expect_next(C.Channel.Close)
            assert close.reply_code == 406
            assert close.reply_text.startswith(f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{queue}'")
    finally:
        client.close()


def test_consumers_under_prefetch_1_take_turns(broker):
    # RabbitMQ's round robin among the consumers that can take a message (rabbit_queue_consumers):
    # with prefetch 1 each and every delivery acked as it comes, A and B alternate
    client = RawClient(broker.port)
    try:
        for ch in (1, 2, 3):
            client.send(ch, C.Channel.Open())
            client.expect_next(C.Channel.OpenOk)
        queue = uniq("fair")
        client.send(3, C.Queue.Declare(queue=queue, exclusive=True))
        client.expect_next(C.Queue.DeclareOk)
        for ch, tag in ((1, "A"), (2, "B")):
            client.send(ch, C.Basic.Qos(prefetch_count=1))
            client.expect_next(C.Basic.QosOk)
            client.send(ch, C.Basic.Consume(queue=queue, consumer_tag=tag))
            client.expect_next(C.Basic.ConsumeOk)
        for i in range(10):
            client.publish(3, "", queue, b"%d" % i)
        order = []
        while len(order) < 10:
            ch, frame = client.next()
            if isinstance(frame, C.Basic.Deliver):
                order.append(frame.consumer_tag)
                client.send(ch, C.Basic.Ack(delivery_tag=frame.delivery_tag))
        assert "".join(order) == "AB" * 5
        client.close_connection()
    finally:
        client.close()


def test_no_ack_deliveries_do_not_count_against_basic_qos(connect):
    # rabbit_limiter counts only deliveries that wait for an ack: a no-ack consumer takes every
    # message whatever the channel's prefetch (per consumer or global), and leaves the ack
    # consumer of the same channel its own credit
    conn = connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    no_ack_q = ch.queue_declare("", exclusive=True).method.queue
    ack_q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", no_ack_q, b"n%d" % i)
        ch.basic_publish("", ack_q, b"a%d" % i)
    assert wait_until(lambda: _ready(conn, ack_q) == 3)
    got = []
    ch.basic_consume(no_ack_q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_consume(ack_q, lambda c, m, p, b: got.append(b), auto_ack=False)
    assert wait_until(lambda: (conn.process_data_events(0.05), len(got))[1] >= 4)
    _consume_for(conn, 0.3)
    assert sorted(got) == [b"a0", b"n0", b"n1", b"n2"]


def test_a_message_dead_lettered_around_a_cycle_counts_its_deaths(connect):
    # rabbit_dead_letter: x-death has one entry per (queue, reason), its count raised and the entry
    # moved to the front when it dies there again; a cycle with a rejection in it is allowed
    conn = connect()
    ch = conn.channel()
    a, b = uniq("cy-a"), uniq("cy-b")
    ch.queue_declare(a, exclusive=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
    ch.queue_declare(b, exclusive=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a,
                                                   "x-message-ttl": 20})
    ch.basic_publish("", a, b"m", pika.BasicProperties(headers={"h": 1}))
    seen = []
    for _ in range(3):
        method, props, _ = wait_until(lambda: (lambda got: got if got[0] else None)(ch.basic_get(a)))
        seen.append([(x["queue"], x["reason"], x["count"]) for x in (props.headers or {}).get("x-death", [])])
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert seen == [[], [(b, "expired", 1), (a, "rejected", 1)], [(b, "expired", 2), (a, "rejected", 2)]]
    assert props.headers["x-first-death-queue"] == a and props.headers["x-first-death-reason"] == "rejected"
