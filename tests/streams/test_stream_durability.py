"""Item 6: the log lives in the SQL store (one row per message, seq = offset + 1, with its
timestamp) and survives SIGKILL and restart with every confirmed message and its offset; named
consumer offsets and retention survive too. Real `exchange_broker serve` subprocesses on SQLite."""

from __future__ import annotations

import asyncio
import datetime
import math
import sqlite3
import time

import aio_pika

from eb_support import uniq
from stream_helpers import STREAM, connect, declare_stream, publish, read


def _rows(proc, queue: str) -> tuple[int, int, int]:
    """(count, min seq, max seq) of the stream's messages in the SQLite store (its chunks)."""
    db = sqlite3.connect(proc.workdir / "db" / "broker.db")
    try:
        return db.execute(
            "SELECT coalesce(sum(count), 0), min(first_seq), max(last_seq) FROM stream_chunks "
            "WHERE queue_id = (SELECT id FROM queues WHERE vhost = '/' AND name = ?)",
            (queue,)).fetchone()
    finally:
        db.close()


def test_sigkill_mid_publish_keeps_every_confirmed_message_aio_pika(broker_process):
    """A publisher with 500 confirms in flight; SIGKILL once ~3000 are confirmed."""
    proc = broker_process(EXCHANGE_BROKER_STREAM_TAIL="1000")  # most of the log only in SQL
    name = uniq()
    confirmed: set[int] = set()

    async def publisher():
        conn = await aio_pika.connect(proc.url)
        ch = await conn.channel()
        await ch.declare_queue(name, durable=True, arguments=STREAM)
        sem = asyncio.Semaphore(500)

        async def one(i):
            try:
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=name)
                confirmed.add(i)
            except Exception:  # noqa: BLE001 - the broker died under it
                pass
            finally:
                sem.release()

        tasks = []
        for i in range(100_000):
            await sem.acquire()
            if len(confirmed) >= 3000:
                proc.kill()                              # SIGKILL with ~500 publishes in flight
                break
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.wait(tasks, timeout=10)
        try:
            await asyncio.wait_for(conn.close(), 2)
        except Exception:  # noqa: BLE001
            pass

    asyncio.run(publisher())
    assert len(confirmed) >= 3000
    top = max(confirmed)
    proc = broker_process()
    conn = connect(proc.port)
    count = conn.channel().queue_declare(name, passive=True).method.message_count
    assert count > top                                   # every confirmed one (and maybe more)
    got = read(conn, name, count, offset="first", prefetch=1000, timeout=30)
    # the stored log is exactly the first `count` publishes, each at the offset of its order
    assert [(b, o) for b, o, _ in got] == [(b"%d" % i, i) for i in range(count)]
    assert confirmed <= set(range(count))
    # offsets continue after the recovered end, never reused
    ch = conn.channel()
    ch.confirm_delivery()
    publish(ch, name, [b"after"])
    assert [(b, o) for b, o, _ in read(conn, name, 1, offset="last")] == [(b"after", count)]
    conn.close()


def test_sigkill_restart_pika_offsets_timestamps_and_named_consumers(broker_process):
    proc = broker_process()
    name = uniq()
    conn = connect(proc.port)
    ch = conn.channel()
    declare_stream(ch, name)
    ch.confirm_delivery()
    publish(ch, name, [b"a%d" % i for i in range(20)],
            headers={"h": 1})                            # confirmed one by one
    boundary = math.floor(time.time()) + 1
    time.sleep(boundary - time.time() + 0.05)
    publish(ch, name, [b"b%d" % i for i in range(10)])   # published after `boundary`
    ch2 = conn.channel()
    ch2.tx_select()                                      # tx.commit-ok also means stored
    for i in range(10):
        ch2.basic_publish("", name, b"c%d" % i)
    ch2.tx_commit()
    got = read(conn, name, 7, offset="first", name="reader-1")
    assert [o for _, o, _ in got] == list(range(7))
    time.sleep(0.5)                                      # named offsets are written within 0.2 s
    proc.kill()
    assert _rows(proc, name) == (40, 1, 40)              # seq = offset + 1

    proc = broker_process()
    conn = connect(proc.port)
    ch = conn.channel()
    assert ch.queue_declare(name, durable=True, arguments=STREAM).method.message_count == 40
    got = read(conn, name, 40, offset="first")
    assert [b for b, _, _ in got] == ([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(10)]
                                      + [b"c%d" % i for i in range(10)])
    assert [o for _, o, _ in got] == list(range(40))
    assert got[0][2] == {"h": 1, "x-stream-offset": 0}
    # the named consumer resumes after its last ack
    assert [o for _, o, _ in read(conn, name, 3, name="reader-1")] == [7, 8, 9]
    # timestamps are stored with the rows: a timestamp seek still finds the b-messages
    ts = datetime.datetime.fromtimestamp(boundary, tz=datetime.timezone.utc)
    assert [b for b, _, _ in read(conn, name, 2, offset=ts)] == [b"b0", b"b1"]
    assert [o for _, o, _ in read(conn, name, 1, offset="last")] == [39]
    assert [o for _, o, _ in read(conn, name, 2, offset=25)] == [25, 26]
    # graceful restart: the offset stored just before SIGTERM is kept too
    read(conn, name, 5, name="reader-1")                 # acks 10..14
    conn.close()
    proc.terminate()
    proc = broker_process()
    conn = connect(proc.port)
    assert [o for _, o, _ in read(conn, name, 2, name="reader-1")] == [15, 16]
    conn.close()


def test_retention_in_the_store_and_after_restart(broker_process):
    proc = broker_process()
    name = uniq()

    async def fill():
        async with await aio_pika.connect(proc.url) as conn:
            ch = await conn.channel()
            await ch.declare_queue(name, durable=True, arguments={
                **STREAM, "x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 5_000})
            await asyncio.gather(*(ch.default_exchange.publish(
                aio_pika.Message(b"r" * 200, headers={"i": i}), routing_key=name) for i in range(300)))
    asyncio.run(fill())
    conn = connect(proc.port)
    count = conn.channel().queue_declare(name, passive=True).method.message_count
    assert 0 < count < 300
    first = 300 - count
    time.sleep(0.3)                                      # the head deletion is an ordered write
    assert _rows(proc, name) == (count, first + 1, 300)  # truncated rows are gone from the store
    got = read(conn, name, count, offset=0, prefetch=500)
    assert [o for _, o, _ in got] == list(range(first, 300))
    conn.close()
    proc.kill()

    proc = broker_process()
    conn = connect(proc.port)
    assert conn.channel().queue_declare(name, passive=True).method.message_count == count
    # segments are rebuilt from the rows: more appends keep truncating at segment boundaries
    ch = conn.channel()
    ch.confirm_delivery()
    publish(ch, name, [b"s" * 200] * 100)
    info_first = read(conn, name, 1, offset="first")[0][1]
    assert info_first > first
    total = conn.channel().queue_declare(name, passive=True).method.message_count
    assert total == 400 - info_first
    assert total * (200 + 40) < 20_000 + 5_000 + 2_000   # within the limit (+ active segment)
    conn.close()


def test_long_log_is_read_back_from_the_store(broker_process):
    """With a 1000-message memory tail, 6000 messages: consumers behind read blocks from SQL."""
    proc = broker_process(EXCHANGE_BROKER_STREAM_TAIL="1000")
    name = uniq()

    async def main():
        async with await aio_pika.connect(proc.url) as conn:
            ch = await conn.channel()
            await ch.declare_queue(name, durable=True, arguments=STREAM)
            for start in range(0, 6000, 1000):
                await asyncio.gather(*(ch.default_exchange.publish(
                    aio_pika.Message(b"%d" % i), routing_key=name) for i in range(start, start + 1000)))
            await ch.set_qos(prefetch_count=300)
            q = await ch.get_queue(name, ensure=False)
            results = {}

            async def reader(key, start):
                seen = []
                async with q.iterator(arguments={"x-stream-offset": start}) as it:
                    async for m in it:
                        seen.append((m.body, m.headers["x-stream-offset"]))
                        await m.ack()
                        if seen[-1][1] == 5999:
                            break
                results[key] = seen
            await asyncio.wait_for(asyncio.gather(reader("a", "first"), reader("b", 4000)), 60)
            assert results["a"] == [(b"%d" % i, i) for i in range(6000)]
            assert results["b"] == [(b"%d" % i, i) for i in range(4000, 6000)]
    asyncio.run(main())
