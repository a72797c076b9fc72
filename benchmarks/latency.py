#!/usr/bin/env python3
"""Latency of this broker and RabbitMQ in the same run, from one client process.

Two connections of the lean raw-frame client share one event loop (uvloop when installed) and
so one clock: a producer in confirm mode and an auto-ack consumer on a fresh queue (transient
messages on a non-durable queue; ``--persistent`` for delivery_mode 2 on a durable one).

1. Steady load: the producer publishes at ``--rate`` msg/s (default 10,000; a write every
   millisecond of as many messages as are due) for ``--seconds``; each body carries its
   sequence number and the send time (perf_counter ns). Over the messages sent after
   ``--warmup``: publish->confirm (send to the broker's basic.ack covering it) and
   publish->deliver (send to the arrival of its basic.deliver) p50, p99 and max.
2. Synchronous confirms: publish one message, wait for its confirm, repeat for
   ``--sync-seconds``; reports msgs/s and the round trip's p50 and p99.

Ratios: RabbitMQ's latency / ours, and our synchronous msgs/s / RabbitMQ's, so >= 1.00 means
this broker is as good or better.

    python benchmarks/latency.py                          # both brokers, 10,000 msg/s, 10 s
    python benchmarks/latency.py --seconds 3 --sync-seconds 2
    python benchmarks/latency.py --port 5672 --json       # one broker only
"""
from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pamqp import commands  # noqa: E402

from loadgen import standalone  # noqa: E402
from loadgen.client import AMQPError, Connection  # noqa: E402
from loadgen.report import latency_summary  # noqa: E402
from loadgen.rows import LATENCY  # noqa: E402
from loadgen.wire import body_offset, encode_publish, server_name  # noqa: E402

_STAMP = struct.Struct(">QQ")  # sequence number, send time (perf_counter_ns)

METRICS = list(LATENCY)


class TimedProducer(Connection):
    """Notes when the confirm of each publish (delivery tag = sequence number) arrived."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.sent: list[int] = []       # send time of tag i+1
        self.acked_at: list[int] = []   # confirm time of tag i+1 (0: not yet)
        self._mark = 0                  # a multiple confirm scans from here

    def note_sent(self, k: int, t_ns: int) -> None:
        self.sent.extend([t_ns] * k)
        self.acked_at.extend([0] * k)

    def _on_confirm(self, tag, multiple, is_ack):
        super()._on_confirm(tag, multiple, is_ack)
        now = time.perf_counter_ns()
        acked = self.acked_at
        if multiple:
            for i in range(self._mark, min(tag, len(acked))):
                if not acked[i]:
                    acked[i] = now
            self._mark = max(self._mark, tag)
        elif 0 < tag <= len(acked) and not acked[tag - 1]:
            acked[tag - 1] = now


class TimedConsumer(Connection):
    """Reads the sequence number and send time from each delivery's body."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.verify = True  # routes each delivery's body through _verify_body
        self.arrivals: list[tuple[int, int]] = []  # (sequence, arrival - send ns)

    def _verify_header(self, buf, off):
        pass

    def _verify_body(self, buf, off, size):
        if self._v_need_seq:
            self._v_need_seq = False
            seq, t_ns = _STAMP.unpack_from(buf, off)
            self.arrivals.append((seq, time.perf_counter_ns() - t_ns))


def _stamped(message: bytes, off: int, first_seq: int, k: int, t_ns: int) -> bytearray:
    out = bytearray(message * k)
    step = len(message)
    pack = _STAMP.pack_into
    for i in range(k):
        pack(out, off + i * step, first_seq + i, t_ns)
    return out


async def _steady(prod: TimedProducer, message: bytes, off: int, opts) -> tuple[int, int, float]:
    """Publish at opts.rate for opts.seconds; returns (first sequence after the warm-up,
    published, measured window in seconds)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    published = 0
    first_measured = 0
    t_measure = 0.0
    while True:
        now = loop.time()
        if prod.error is not None:
            raise prod.error
        if now - t0 >= opts.seconds:
            break
        if not first_measured and now - t0 >= opts.warmup:
            first_measured, t_measure = published + 1, now
        due = min(int((now - t0) * opts.rate) - published, 5000)
        if due > 0:
            t_ns = time.perf_counter_ns()
            prod.transport.write(_stamped(message, off, published + 1, due, t_ns))
            prod.note_sent(due, t_ns)
            published += due
        await asyncio.sleep(0.001)
    return first_measured or 1, published, loop.time() - (t_measure or t0)


async def _wait(cond, conns, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        for c in conns:
            if c.error is not None:
                raise c.error
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def _sync(prod: TimedProducer, message: bytes, off: int, first_seq: int,
                seconds: float) -> tuple[list[int], float]:
    loop = asyncio.get_running_loop()
    rtts: list[int] = []
    seq = first_seq
    t_end = loop.time() + seconds
    t0 = loop.time()
    while loop.time() < t_end:
        t_ns = time.perf_counter_ns()
        prod.transport.write(_stamped(message, off, seq, 1, t_ns))
        prod.note_sent(1, t_ns)
        while prod.confirmed + prod.nacked < seq:
            if prod.error is not None:
                raise prod.error
            prod.confirm_event.clear()
            try:
                await asyncio.wait_for(prod.confirm_event.wait(), 10)
            except asyncio.TimeoutError:
                raise AMQPError(f"no confirm for message {seq} within 10 s") from None
        rtts.append(time.perf_counter_ns() - t_ns)
        seq += 1
    return rtts, loop.time() - t0


async def measure(host: str, port: int, pid: int, opts) -> dict:
    queue = f"latency-{uuid.uuid4().hex[:10]}"
    args = (host, port, opts.user, opts.password, opts.vhost, 0, 10.0)
    prod, cons = TimedProducer("latency-producer"), TimedConsumer("latency-consumer")
    result: dict = {"host": host, "port": port, "rate_target": opts.rate, "size": opts.size,
                    "persistent": opts.persistent, "seconds": opts.seconds,
                    "warmup": opts.warmup, "sync_seconds": opts.sync_seconds}
    declared = False
    try:
        await prod.open(*args)
        await cons.open(*args)
        result["server"] = server_name(prod.server_properties)
        await prod.rpc(commands.Queue.Declare(queue=queue, durable=opts.persistent,
                                              auto_delete=not opts.persistent),
                       "Queue.DeclareOk")
        declared = True
        await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        await cons.rpc(commands.Basic.Consume(queue=queue, consumer_tag="latency", no_ack=True),
                       "Basic.ConsumeOk")
        message = encode_publish(Connection.CHANNEL, "", queue, bytes(opts.size),
                                 2 if opts.persistent else 1, min(prod.frame_max, cons.frame_max))
        off = body_offset(message, opts.size)

        first, published, window = await _steady(prod, message, off, opts)
        await _wait(lambda: prod.confirmed + prod.nacked >= published
                    and len(cons.arrivals) >= published, (prod, cons), 15)
        sent, acked = prod.sent, prod.acked_at
        confirm_ns = [acked[i] - sent[i] for i in range(first - 1, published) if acked[i]]
        seen = [s for s, _ in cons.arrivals]
        deliver_ns = [lat for s, lat in cons.arrivals if s >= first]
        result.update({
            "published": published, "publish_rate": round((published - first + 1) / window, 1),
            "confirmed": prod.confirmed, "nacked": prod.nacked, "delivered": len(seen),
            "all_delivered": sorted(seen) == list(range(1, published + 1)),
            **latency_summary("confirm", confirm_ns), **latency_summary("deliver", deliver_ns),
        })

        if opts.sync_seconds > 0:
            rtts, took = await _sync(prod, message, off, published + 1, opts.sync_seconds)
            result.update({"sync_count": len(rtts),
                           "sync_per_s": round(len(rtts) / took, 1) if took else None,
                           **latency_summary("sync", rtts)})
            result.pop("sync_max_ms", None)
        result["client_note"] = ("one client process, both connections on one event loop; "
                                 "times from perf_counter_ns")
    finally:
        if declared and prod.error is None:
            try:
                await prod.rpc(commands.Queue.Delete(queue=queue), "Queue.DeleteOk", timeout=15)
            except Exception as exc:  # noqa: BLE001
                print(f"warning: queue.delete failed: {exc}", file=sys.stderr)
        for c in (cons, prod):
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="ratio >= 1.00: this broker is as good or better")
    p.add_argument("--rate", type=float, default=10000.0,
                   help="steady publish rate, msgs/s (default 10,000)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="length of the steady phase incl. warm-up (default 10)")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="first seconds of the steady phase not counted (default 1)")
    p.add_argument("--sync-seconds", type=float, default=5.0,
                   help="length of the synchronous-confirm phase (default 5; 0 skips it)")
    p.add_argument("--size", type=int, default=100, help="body bytes, >= 16 (default 100)")
    p.add_argument("--persistent", action="store_true",
                   help="delivery_mode 2 on a durable queue (default transient, non-durable)")
    standalone.add_target_args(p)
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.size < 16 or opts.size > 100_000:
        print("--size must be between 16 and 100,000 bytes", file=sys.stderr)
        return 2
    if opts.rate <= 0 or opts.seconds - opts.warmup < 0.5:
        print("--rate must be > 0 and --seconds exceed --warmup by at least 0.5",
              file=sys.stderr)
        return 2
    return standalone.run(opts, measure, METRICS, "latency")


if __name__ == "__main__":
    sys.exit(main())
