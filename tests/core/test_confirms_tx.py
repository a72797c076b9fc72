"""Publisher confirms and transactions through real clients (and a raw socket where the clients
hide the wire: delivery tags and the multiple flag of confirms). Checked against RabbitMQ 3.10."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq.exceptions as amqe
import pika
import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pika.exceptions import ChannelClosedByBroker

from eb_support import RawClient


def ready(conn, queue: str) -> int:
    ch = conn.channel()
    count = ch.queue_declare(queue, passive=True).method.message_count
    ch.close()
    return count


def covered(confirms: list) -> set[int]:
    """Delivery tags a confirm sequence covers (multiple=true covers every tag up to its own)."""
    tags: set[int] = set()
    for _name, tag, multiple in confirms:
        tags.update(range(1, tag + 1) if multiple else (tag,))
    return tags


def collect_confirms(raw: RawClient, upto: dict[int, int]) -> dict[int, list]:
    """Read frames until every channel's confirms cover tags 1..upto[channel].

    RabbitMQ may confirm out of order (an unroutable message before a routed one), so only the
    covered set is meaningful, not the order."""
    seen: dict[int, list] = {ch: [] for ch in upto}
    while any(covered(seen[ch]) != set(range(1, upto[ch] + 1)) for ch in upto):
        channel, value = raw.next()
        if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)):
            seen[channel].append((value.name, value.delivery_tag, value.multiple))
            assert 1 <= value.delivery_tag <= upto[channel]
    return seen


# -- publisher confirms ----------------------------------------------------------------------

def test_confirm_tags_count_from_one_per_channel_and_may_be_multiple(broker):
    raw = RawClient(broker.port)
    try:
        for ch in (1, 2):
            raw.send(ch, commands.Channel.Open())
            raw.expect(commands.Channel.OpenOk)
            raw.send(ch, commands.Confirm.Select())
            raw.expect(commands.Confirm.SelectOk)
        raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
        q = raw.expect(commands.Queue.DeclareOk).queue
        raw.send(1, commands.Queue.Bind(queue=q, exchange="amq.direct", routing_key="k"))
        raw.expect(commands.Queue.BindOk)
        for i in range(40):  # routed and unroutable messages alike are confirmed
            if i % 4 == 0:
                raw.publish(1, "amq.direct", "k", b"%d" % i)
            elif i % 4 == 1:
                raw.publish(1, "amq.direct", "nowhere", b"%d" % i)
            else:
                raw.publish(1, "", q if i % 2 else "no-such-queue", b"%d" % i)
        for i in range(5):
            raw.publish(2, "", q, b"c2-%d" % i)
        seen = collect_confirms(raw, {1: 40, 2: 5})
        for ch in (1, 2):
            assert all(name == "Basic.Ack" for name, _, _ in seen[ch])
        raw.send(1, commands.Queue.Declare(queue=q, passive=True))
        assert raw.expect(commands.Queue.DeclareOk).message_count == 10 + 10 + 5
    finally:
        raw.close_connection()


def test_confirm_select_nowait_and_twice(broker):
    raw = RawClient(broker.port)
    try:
        raw.send(1, commands.Channel.Open())
        raw.expect(commands.Channel.OpenOk)
        raw.send(1, commands.Confirm.Select(nowait=True), commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk)  # only the second one is answered
        raw.publish(1, "amq.fanout", "", b"x")
        [(name, tag, _multiple)] = collect_confirms(raw, {1: 1})[1]
        assert (name, tag) == ("Basic.Ack", 1)
    finally:
        raw.close_connection()


def test_confirms_with_pika(connect):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)  # each call waits for its ack
    ch.basic_publish("amq.direct", "nowhere", b"dropped")  # unroutable, not mandatory: acked
    assert ready(conn, q) == 10


def test_confirms_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(exclusive=True)
            tags = []
            for i in range(3):
                ok = await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
                assert isinstance(ok, commands.Basic.Ack)
                tags.append(ok.delivery_tag)
            assert tags == [1, 2, 3]
            results = await asyncio.gather(*(
                ch.default_exchange.publish(aio_pika.Message(b"p%d" % i), routing_key=q.name)
                for i in range(50)))
            assert all(isinstance(r, commands.Basic.Ack) for r in results)
            assert max(r.delivery_tag for r in results) == 53
            ch2 = await conn.channel(publisher_confirms=True)
            ok = await ch2.default_exchange.publish(aio_pika.Message(b"x"), routing_key=q.name)
            assert ok.delivery_tag == 1  # per channel
            declared = await ch.declare_queue(q.name, passive=True)
            assert declared.declaration_result.message_count == 54
    asyncio.run(main())


def test_confirm_nack_when_message_cannot_be_enqueued(connect):
    """x-overflow=reject-publish: a message the full queue refuses is basic.nack'ed (pika raises
    NackError); acks continue once there is room again. Checked against RabbitMQ 3.10."""
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-length": 1,
                                                        "x-overflow": "reject-publish"}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"refused")
    assert ready(conn, q) == 1
    ch.basic_get(q, auto_ack=True)
    ch.basic_publish("", q, b"fits again")  # acked
    assert ready(conn, q) == 1


# -- transactions -----------------------------------------------------------------------------

def test_tx_publishes_are_invisible_until_commit(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    time.sleep(0.05)
    assert ready(conn, q) == 0
    ch.tx_commit()
    assert ready(conn, q) == 3
    ch.basic_publish("", q, b"3")  # still transactional after a commit
    time.sleep(0.05)
    assert ready(conn, q) == 3
    ch.tx_commit()
    assert ready(conn, q) == 4
    ch.tx_commit()  # an empty commit is fine


def test_tx_rollback_discards_publishes(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"gone")
    ch.tx_rollback()
    ch.tx_commit()
    assert ready(conn, q) == 0
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    assert ch.basic_get(q, auto_ack=True)[2] == b"kept"


def test_tx_mandatory_return_comes_with_the_commit(connect):
    conn = connect()
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, method, _p, body: returns.append((method.reply_code, body)))
    ch.tx_select()
    ch.basic_publish("amq.direct", "nowhere", b"r", mandatory=True)
    conn.process_data_events(0.1)
    assert returns == []
    ch.tx_commit()
    deadline = time.monotonic() + 5
    while not returns and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    assert returns == [(312, b"r")]


def test_tx_ack_takes_effect_only_on_commit(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", q, body)
    ch.tx_select()
    tag_a = ch.basic_get(q)[0].delivery_tag
    ch.basic_ack(tag_a)
    ch.tx_rollback()                  # the ack is discarded: "a" is still unacked
    ch.basic_recover(requeue=True)    # ... so recover puts it back
    assert ready(conn, q) == 3
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"a", True)
    ch.basic_ack(method.delivery_tag)
    assert ready(conn, q) == 2
    ch.tx_commit()                    # now it is gone for good
    ch.basic_recover(requeue=True)
    assert ready(conn, q) == 2
    # an uncommitted ack does not survive the channel
    tag_b = ch.basic_get(q)[0].delivery_tag
    ch.basic_ack(tag_b)
    ch.close()
    ch = conn.channel()
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"b", b"c"]


def test_tx_reject_and_nack_take_effect_on_commit(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for body in (b"a", b"b"):
        ch.basic_publish("", q, body)
    ch.tx_select()
    tag_a = ch.basic_get(q)[0].delivery_tag
    tag_b = ch.basic_get(q)[0].delivery_tag
    ch.basic_reject(tag_a, requeue=False)
    ch.basic_nack(tag_b, requeue=True)
    assert ready(conn, q) == 0
    ch.tx_commit()
    assert ready(conn, q) == 1  # "a" dropped, "b" requeued
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"b", True)


def test_transactions_with_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=False)
            q = await ch.declare_queue(exclusive=True)
            observer = await conn.channel()

            async def count():
                return (await observer.declare_queue(q.name, passive=True)).declaration_result.message_count

            tx = ch.transaction()
            await tx.select()
            await ch.default_exchange.publish(aio_pika.Message(b"1"), routing_key=q.name)
            assert await count() == 0
            await tx.rollback()
            assert await count() == 0
            await ch.default_exchange.publish(aio_pika.Message(b"2"), routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"3"), routing_key=q.name)
            await tx.commit()
            assert await count() == 2
            # acks inside the transaction
            m = await q.get()
            await m.ack()
            await tx.rollback()
            assert await count() == 1
            await (await ch.get_underlay_channel()).basic_recover(requeue=True)
            assert await count() == 2
            m = await q.get()
            assert (m.body, m.redelivered) == (b"2", True)
            await m.ack()
            await tx.commit()
            assert await count() == 1
    asyncio.run(main())


def test_confirm_select_on_tx_channel_and_tx_select_on_confirm_channel_are_406(connect):
    conn = connect()
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.confirm_delivery()
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_select()
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


def test_commit_or_rollback_without_tx_select_is_406_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            for op in ("tx_commit", "tx_rollback"):
                ch = await conn.channel(publisher_confirms=False)
                underlay = await ch.get_underlay_channel()
                with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                    await getattr(underlay, op)()
                assert ei.value.args[0] == "PRECONDITION_FAILED - channel is not transactional"
            ch = await conn.channel(publisher_confirms=True)
            with pytest.raises(amqe.ChannelPreconditionFailed) as ei:
                await (await ch.get_underlay_channel()).tx_select()
            assert ei.value.args[0] == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
    asyncio.run(main())


def test_transaction_context_manager_aio_pika(broker):
    async def main():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=False)
            q = await ch.declare_queue(exclusive=True)
            observer = await conn.channel()

            async def count():
                return (await observer.declare_queue(q.name, passive=True)).declaration_result.message_count

            async with ch.transaction():
                for i in range(3):
                    await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=q.name)
                assert await count() == 0
            assert await count() == 3
            with pytest.raises(RuntimeError):
                async with ch.transaction():
                    await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=q.name)
                    raise RuntimeError("rolls back")
            assert await count() == 3
    asyncio.run(main())


def test_stored_publishes_mixed_with_at_once_acks_and_nacks_are_confirmed_in_order(spawn_broker, workdir):
    """Persistent publishes waiting on one store commit, with publishes confirmed at once
    between them (unroutable: ack; a full reject-publish queue: nack), all in one write: every
    tag is confirmed exactly once, the nack only for the rejected one, and nothing after a
    pending publish is confirmed before it."""
    proc = spawn_broker("--data-dir", str(workdir / "data"))
    raw = RawClient(proc.port, open_channel=1)
    try:
        raw.send(1, commands.Queue.Declare(queue="stored", durable=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send(1, commands.Queue.Declare(queue="full", durable=True, arguments={
            "x-max-length": 1, "x-overflow": "reject-publish"}))
        raw.expect(commands.Queue.DeclareOk)
        raw.publish(1, "", "full", b"fills it")
        raw.send(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk)
        persistent = commands.Basic.Properties(delivery_mode=2)
        plan = ["stored", "stored", "unroutable", "stored", "full", "stored", "stored", "full",
                "unroutable", "stored"]
        frames = b""
        for target in plan:
            exchange, key = ("amq.direct", "nowhere") if target == "unroutable" else ("", target)
            body = target.encode()
            frames += b"".join(pframe.marshal(f, 1) for f in (
                commands.Basic.Publish(exchange=exchange, routing_key=key),
                pheader.ContentHeader(0, len(body), persistent), pbody.ContentBody(body)))
        raw.send_raw(frames)
        seen = collect_confirms(raw, {1: len(plan)})[1]
        outcome: dict[int, str] = {}
        for name, tag, multiple in seen:
            for t in (range(1, tag + 1) if multiple else (tag,)):
                if t not in outcome:
                    outcome[t] = name
            assert name == "Basic.Ack" or not multiple
        assert outcome == {i + 1: ("Basic.Nack" if t == "full" else "Basic.Ack")
                           for i, t in enumerate(plan)}
        # in order: a confirm never covers a tag beyond one still unconfirmed before it
        highest = 0
        for name, tag, multiple in seen:
            assert tag > highest
            highest = tag
        raw.send(1, commands.Queue.Declare(queue="stored", passive=True))
        assert raw.expect(commands.Queue.DeclareOk).message_count == plan.count("stored")
    finally:
        raw.close_connection()
