"""The crash test: SIGKILL the broker in the middle of a confirmed-publish + consume + tx load.

While a lean raw-frame publisher keeps up to 1000 persistent ~100-byte messages in flight with
publisher confirms, an aio-pika consumer acks most deliveries and keeps every 20th unacked, and a
pika publisher commits small transactions to a second queue, the broker is SIGKILLed.  After a
restart on the same store:

* every message whose confirm arrived and that was not acked is back, exactly once, in publish
  order; messages delivered but not acked come back with redelivered=True;
* no message acked well before the kill (1 s) comes back (an ack is not confirmed by AMQP, so one
  sent in the last moments may legitimately come back);
* every transaction whose tx.commit-ok arrived is present; no transaction is half-present.
"""

from __future__ import annotations

import asyncio
import threading
import time

import aio_pika

from durability_helpers import LeanPublisher, PERSISTENT, connect, drain, message_count
from eb_support import close_quietly

QUEUE = "crash"
TX_QUEUE = "crash-tx"
LOAD_SECONDS = 2.5
IN_FLIGHT = 1000
UNACKED_EVERY = 20
TX_BATCH = 10
WINDOW = 500  # small: the backlog the consumer leaves pages to the store during the load
SETTLE = 1.0  # acks/deliveries older than this at the kill must have been written


def _body(mid: int) -> bytes:
    return f"{mid:010d}|".encode() + b"x" * 89  # 100 bytes


def _mid(body: bytes) -> int:
    return int(body[:10])


class Load:
    def __init__(self) -> None:
        self.published = 0
        self.confirmed: set[int] = set()
        self.nacked: set[int] = set()
        self.acked: dict[int, float] = {}
        self.delivered: dict[int, float] = {}
        self.tx_batches: list[list[int]] = []   # every batch sent (the last may be uncommitted)
        self.tx_committed: set[int] = set()
        self.kill_at = 0.0


async def _publisher(port: int, load: Load, stop: asyncio.Event) -> None:
    """The lean raw-frame publisher: up to IN_FLIGHT unconfirmed; tag n carries id n."""
    pub = await LeanPublisher().connect(port)
    try:
        while not stop.is_set() and pub.closed_reason is None:
            if pub.in_flight >= IN_FLIGHT:
                await pub.wait(lambda: pub.in_flight < IN_FLIGHT or stop.is_set(), 0.2)
                continue
            mid = pub.published + 1
            assert pub.publish(QUEUE, _body(mid)) == mid
            load.published = mid
            if mid % 50 == 0:
                await asyncio.sleep(0.01)  # <= ~5000/s: the consumer keeps up, the drain stays short
    finally:
        load.confirmed = pub.confirmed()
        load.nacked = {t for t, ok in pub.outcome.items() if not ok}
        await pub.close()


async def _consumer(url: str, load: Load, stop: asyncio.Event) -> None:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1000)
        queue = await ch.get_queue(QUEUE)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            mid = _mid(message.body)
            load.delivered.setdefault(mid, time.monotonic())
            if mid % UNACKED_EVERY and not stop.is_set():
                await message.ack()
                load.acked[mid] = time.monotonic()

        await queue.consume(on_message)
        await stop.wait()
    finally:
        await _close(conn)


async def _close(conn) -> None:
    try:
        await asyncio.wait_for(conn.close(), 2)
    except BaseException:  # noqa: BLE001 - the broker is gone
        pass


def _tx_publisher(broker, load: Load, stop: threading.Event) -> None:
    conn = None
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.tx_select()
        mid = 0
        while not stop.is_set():
            batch = list(range(mid + 1, mid + 1 + TX_BATCH))
            mid += TX_BATCH
            load.tx_batches.append(batch)
            for m in batch:
                ch.basic_publish("", TX_QUEUE, _body(m), PERSISTENT)
            ch.tx_commit()
            load.tx_committed.update(batch)
    except Exception:  # noqa: BLE001 - the kill
        pass
    finally:
        close_quietly(conn)


async def _run_load(broker, load: Load) -> None:
    stop = asyncio.Event()
    tx_stop = threading.Event()
    tx_thread = threading.Thread(target=_tx_publisher, args=(broker, load, tx_stop), daemon=True)
    tasks = [asyncio.ensure_future(_consumer(broker.url, load, stop)),
             asyncio.ensure_future(_publisher(broker.port, load, stop))]
    tx_thread.start()
    try:
        await asyncio.sleep(LOAD_SECONDS)
        load.kill_at = time.monotonic()
        broker.kill()  # mid-load: publishes, confirms, deliveries and acks in flight
    finally:
        stop.set()
        tx_stop.set()
        await asyncio.wait(tasks, timeout=10)
        for t in tasks:
            if not t.done():
                t.cancel()
        # confirms/acks after the kill cannot exist; let failed publish tasks finish
        await asyncio.sleep(0.2)
        tx_thread.join(10)


def test_sigkill_mid_load_loses_nothing_confirmed(broker_factory, backend):
    b = broker_factory("--queue-window", str(WINDOW))
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_declare(TX_QUEUE, durable=True)
    close_quietly(conn)

    load = Load()
    asyncio.run(_run_load(b, load))
    assert not b.alive()
    print(f"{backend.name}: published {load.published}, confirmed {len(load.confirmed)}, "
          f"delivered {len(load.delivered)}, acked {len(load.acked)}, tx {len(load.tx_committed)}")

    # the load really was a load, and the kill hit it mid-flight
    assert len(load.confirmed) >= 500, (load.published, len(load.confirmed))
    assert len(load.acked) >= 100, len(load.acked)
    unacked_delivered = {m for m in load.delivered if m not in load.acked}
    assert len(unacked_delivered) >= 5
    assert len(load.tx_committed) >= TX_BATCH
    assert not load.nacked, f"{len(load.nacked)} publishes were nacked without a database failure"

    b2 = broker_factory("--queue-window", str(WINDOW))
    conn = connect(b2)
    try:
        count = message_count(conn, QUEUE)
        got = drain(conn, QUEUE, expected=count)
        tx_count = message_count(conn, TX_QUEUE)
        tx_got = drain(conn, TX_QUEUE, expected=tx_count)
        assert message_count(conn, QUEUE) == 0
    finally:
        close_quietly(conn)
    assert len(got) == count and len(tx_got) == tx_count

    ids = [_mid(body) for body, _ in got]
    redelivered = {_mid(body) for body, r in got if r}
    present = set(ids)
    # publish order, no duplicates
    assert ids == sorted(set(ids)), "recovered messages out of order or duplicated"
    assert present <= set(range(1, load.published + 1))
    # confirmed and not acked => present
    missing = sorted(m for m in load.confirmed if m not in load.acked and m not in present)
    assert not missing, f"{len(missing)} confirmed, unacked messages lost, e.g. {missing[:10]}"
    # acked (and the ack had time to be written) => gone; an ack in flight at the kill may not be
    settled = load.kill_at - SETTLE
    back = sorted(m for m, t in load.acked.items() if m in present and t < settled)
    assert not back, f"{len(back)} acked messages came back, e.g. {back[:10]}"
    # delivered, not acked => back with redelivered=True
    old_unacked = {m for m in unacked_delivered
                   if load.delivered[m] < settled and m in load.confirmed}
    assert old_unacked, "no delivered-but-unacked message old enough to check"
    assert old_unacked <= present
    not_flagged = sorted(old_unacked - redelivered)
    assert not not_flagged, f"delivered messages came back without redelivered: {not_flagged[:10]}"

    # transactions: commit-ok => present, in order; a transaction is all or nothing
    tx_ids = [_mid(body) for body, _ in tx_got]
    assert tx_ids == sorted(set(tx_ids))
    tx_present = set(tx_ids)
    lost = sorted(load.tx_committed - tx_present)
    assert not lost, f"committed transactional messages lost: {lost[:10]}"
    for batch in load.tx_batches:
        n = len(tx_present.intersection(batch))
        assert n in (0, len(batch)), f"transaction {batch[0]}..{batch[-1]} partially recovered ({n})"
    assert tx_present <= {m for batch in load.tx_batches for m in batch}
