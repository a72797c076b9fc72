"""Durable queues longer than memory: ``--queue-window 1000`` with 20,000 persistent 1 KiB messages.

The queue keeps about one window of messages in memory and pages the rest to the store; the
order is kept across paging, a restart with 20,000 stored messages is quick and lean,
transient messages mixed into a paging queue keep their place, and reading pages back never
loads much more than a window (64 KiB messages).
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika

from durability_helpers import LeanPublisher, connect, message_count, publish_confirmed
from eb_support import close_quietly, wait_until

N = 20_000
WINDOW = 1000
BODY_SIZE = 1024
QUEUE = "paged"
RSS_LIMIT_MB = 150
# 20,000 bodies of 1 KiB are 20 MB before any per-message overhead: a queue that paged must
# grow the process by clearly less than that over the same broker with an empty store
RSS_GROWTH_LIMIT_MB = 15


def _body(i: int) -> bytes:
    return f"{i:08d}|".encode().ljust(BODY_SIZE, b".")


def _seq(body: bytes) -> int:
    return int(body[:8])


async def _publish(port: int, queue: str, bodies) -> None:
    """The lean raw-frame publisher: 1000 in flight, every publish confirmed."""
    pub = await LeanPublisher().connect(port)
    try:
        await pub.publish_all(queue, bodies, in_flight=1000)
    finally:
        await pub.close()


async def _publish_aio(url: str, queue: str, bodies, persistent) -> None:
    """aio-pika with publisher confirms, many publishes in flight."""
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await publish_confirmed(ch, queue, bodies, persistent=persistent, in_flight=500)
    finally:
        await conn.close()


def _consume_in_order(conn, queue: str, count: int, prefetch: int = 200) -> list[tuple[int, bool]]:
    """Manual acks (multiple, every prefetch/4 deliveries), prefetch ``prefetch``: returns
    (seq, redelivered) in delivery order."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    out: list[tuple[int, bool]] = []
    every = max(1, prefetch // 4)
    for method, _props, body in ch.consume(queue, inactivity_timeout=5.0):
        if method is None:
            break  # stalled: the assertion on the count below reports it
        out.append((_seq(body), method.redelivered))
        if len(out) % every == 0 or len(out) >= count:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(out) >= count:
            break
    ch.cancel()
    ch.close()
    return out


def test_20k_messages_page_and_come_back_in_order(broker_factory, backend):
    b = broker_factory("--queue-window", str(WINDOW))
    conn = connect(b)
    conn.channel().queue_declare(QUEUE, durable=True)
    close_quietly(conn)
    baseline_rss = b.rss_mb()  # a started broker with an empty store

    t0 = time.monotonic()
    asyncio.run(_publish(b.port, QUEUE, (_body(i) for i in range(N))))
    publish_s = time.monotonic() - t0
    conn = connect(b)
    try:
        assert message_count(conn, QUEUE) == N
    finally:
        close_quietly(conn)
    assert backend.message_rows(QUEUE) == N
    live_rss = b.rss_mb()
    assert live_rss < RSS_LIMIT_MB
    assert live_rss - baseline_rss < RSS_GROWTH_LIMIT_MB, (baseline_rss, live_rss)

    assert b.terminate() == 0
    b2 = broker_factory("--queue-window", str(WINDOW))
    assert b2.startup_seconds < 10, f"start-up with {N} stored messages took {b2.startup_seconds:.1f}s"
    assert f"{N} messages" in b2.log()
    restart_rss = b2.rss_mb()
    assert restart_rss < RSS_LIMIT_MB
    assert restart_rss - baseline_rss < RSS_GROWTH_LIMIT_MB, (baseline_rss, restart_rss)
    print(f"{backend.name}: publish {publish_s:.1f}s, start-up {b2.startup_seconds:.2f}s, RSS MB "
          f"empty {baseline_rss:.0f} live {live_rss:.0f} restarted {restart_rss:.0f}")

    conn = connect(b2)
    try:
        assert message_count(conn, QUEUE) == N
        got = _consume_in_order(conn, QUEUE, N)
        assert [s for s, _ in got] == list(range(N)), "paged messages lost, duplicated or reordered"
        assert not any(r for _, r in got)
        assert message_count(conn, QUEUE) == 0
        assert wait_until(lambda: backend.message_rows(QUEUE) == 0, timeout=10), \
            "acked rows left in the store"
    finally:
        close_quietly(conn)


def test_mixed_transient_and_persistent_keep_order_while_paging(broker_factory, backend):
    """Transient messages cannot be paged (they have no row); they stay in memory in their place."""
    n, extra, first_part = 4000, 1000, 1500
    # a window in memory, then rows paged out, then every third message transient: a transient
    # message has no row, so it stays in memory at its place behind the paged rows
    persistent = [i < 2500 or i % 3 != 0 for i in range(n)]
    b = broker_factory("--queue-window", str(WINDOW))
    conn = connect(b)
    conn.channel().queue_declare("mixed", durable=True)
    close_quietly(conn)
    asyncio.run(_publish_aio(b.url, "mixed", [_body(i) for i in range(n)], persistent))
    assert backend.message_rows("mixed") == sum(persistent)
    conn = connect(b)
    try:
        assert message_count(conn, "mixed") == n
        # part now, then more published behind a partly drained, paging queue
        first = _consume_in_order(conn, "mixed", first_part)
        asyncio.run(_publish_aio(b.url, "mixed", [_body(i) for i in range(n, n + extra)],
                                 [i % 2 == 0 for i in range(extra)]))
        rest = _consume_in_order(conn, "mixed", n + extra - first_part)
        seqs = [s for s, _ in first + rest]
        assert seqs == list(range(n + extra)), "mixed messages lost or reordered while paging"
        assert message_count(conn, "mixed") == 0
        assert wait_until(lambda: backend.message_rows("mixed") == 0, timeout=10)
    finally:
        close_quietly(conn)


def test_refill_respects_the_window_for_large_messages(broker_factory, backend):
    """Reading paged rows back must not pull far more than ``--queue-window`` messages into
    memory: with 64 KiB messages a refill of thousands of rows would be hundreds of MB."""
    window, n, size = 20, 1000, 64 * 1024
    b = broker_factory("--queue-window", str(window))
    conn = connect(b)
    conn.channel().queue_declare("big", durable=True)
    close_quietly(conn)
    baseline_rss = b.rss_mb()

    async def publish() -> None:
        pub = await LeanPublisher().connect(b.port)
        try:
            await pub.publish_all("big", (f"{i:08d}|".encode().ljust(size, b"b") for i in range(n)),
                                  in_flight=50)
        finally:
            await pub.close()

    asyncio.run(publish())
    conn = connect(b)
    try:
        assert message_count(conn, "big") == n
        after_publish = b.rss_mb()  # eviction keeps publishing lean too
        assert after_publish - baseline_rss < 30, (baseline_rss, after_publish)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        seqs = []
        peak = after_publish
        for method, _props, body in ch.consume("big", inactivity_timeout=5.0):
            assert method is not None, "consumer stalled"
            seqs.append(_seq(body))
            ch.basic_ack(method.delivery_tag)
            if len(seqs) % 50 == 0:
                peak = max(peak, b.rss_mb())
            if len(seqs) == 3 * window:  # a few refills in: enough to see what they load
                break
        ch.cancel()
        assert seqs == list(range(3 * window))
        # n * size is 64 MB: a refill limited by the window keeps the growth to a few MB
        assert peak - baseline_rss < 30, (baseline_rss, peak)
        print(f"{backend.name}: 64 KiB messages, window {window}: RSS MB empty {baseline_rss:.0f}, "
              f"after publish {after_publish:.0f}, peak while consuming {peak:.0f}")
    finally:
        close_quietly(conn)


def test_basic_get_never_reports_empty_while_pages_are_being_read_back(spawn_broker, workdir):
    """basic.get on a paged queue waits for the refill instead of answering get-empty."""
    proc = spawn_broker("--data-dir", str(workdir / "data"), "--queue-window", "2")
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        ch.queue_declare("gets", durable=True)
        ch.confirm_delivery()
        for i in range(600):
            ch.basic_publish("", "gets", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        got = []
        for _ in range(600):
            method, _props, body = ch.basic_get("gets", auto_ack=True)
            assert method is not None, f"get-empty after {len(got)} of 600 messages"
            got.append(int(body))
        assert got == list(range(600))
        assert ch.basic_get("gets")[0] is None  # and empty once it really is
    finally:
        conn.close()
