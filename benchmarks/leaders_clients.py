"""Clients of the leaders-mode cluster benchmark (``cluster_leaders_bench.py``), on loadgen's lean
connection: a consumer that records the sequence number stamped in each body (so a run can check
every confirmed message was consumed at least once), a producer that knows which delivery tags
the broker acked and which it nacked, and the waits around them.
"""
from __future__ import annotations

import asyncio

from pamqp import commands

from loadgen.client import AMQPError, Connection
from loadgen.wire import _U64, body_offset, encode_publish

PREFETCH = 200        # amqp_load's defaults: basic.qos, acks (multiple) every 50, 500 unconfirmed
ACK_EVERY = 50
MAX_UNCONFIRMED = 500
SIZE = 100            # body bytes (the first 8: the sequence number)


class Seen:
    """Sequence numbers received (a bitmap), with the count of repeats (redeliveries)."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.distinct = 0
        self.repeats = 0

    def add(self, seq: int) -> None:
        byte, bit = seq >> 3, 1 << (seq & 7)
        if byte >= len(self.bits):
            self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
        if self.bits[byte] & bit:
            self.repeats += 1
        else:
            self.bits[byte] |= bit
            self.distinct += 1

    def __contains__(self, seq: int) -> bool:
        byte = seq >> 3
        return byte < len(self.bits) and bool(self.bits[byte] & (1 << (seq & 7)))


class SeqConsumer(Connection):
    """A consumer (manual acks, multiple every ACK_EVERY) recording each body's sequence number."""

    def __init__(self, name: str, seen: Seen | None = None) -> None:
        super().__init__(name)
        self.seen = seen if seen is not None else Seen()
        self.verify = True  # routes each delivery's body through _verify_body
        self.cancels = 0

    def _verify_header(self, buf, off) -> None:
        pass  # the sequence number is in the body frame

    def _verify_body(self, buf, off, size) -> None:
        if self._v_need_seq:
            self._v_need_seq = False
            self.seen.add(_U64.unpack_from(buf, off)[0])

    def _cold_frame(self, raw: bytes) -> None:
        if raw[7:11] == b"\x00\x3c\x00\x1e":  # basic.cancel from the broker (consumer-cancel-notify)
            self.cancels += 1
            if self.delivery_event is not None:
                self.delivery_event.set()
        super()._cold_frame(raw)

    async def consume(self, queue: str, tag: str) -> None:
        self.ack_every = ACK_EVERY
        await self.rpc(commands.Basic.Consume(queue=queue, consumer_tag=tag), "Basic.ConsumeOk")


class TrackingProducer(Connection):
    """A confirm-mode producer; ``on_settled(tags, acked)`` hears which delivery tags the broker
    acked or nacked (a multiple ack expanded)."""

    def __init__(self, name: str, on_settled) -> None:
        super().__init__(name)
        self.on_settled = on_settled

    def _on_confirm(self, tag: int, multiple: int, is_ack: bool) -> None:
        if multiple:
            tags = [t for t in range(self._c_water + 1, tag + 1) if t not in self._c_singles]
        else:
            tags = [] if tag <= self._c_water or tag in self._c_singles else [tag]
        super()._on_confirm(tag, multiple, is_ack)
        if tags:
            self.on_settled(tags, is_ack)


def publish_template(queue: str, frame_max: int) -> tuple[bytes, int]:
    """A persistent publish of a SIZE-byte body to ``queue`` (default exchange), and the offset
    of its body (where the sequence number goes)."""
    message = encode_publish(Connection.CHANNEL, "", queue, bytes(SIZE), 2, frame_max)
    return message, body_offset(message, SIZE)


async def open_pair(port: int, queue: str, producer: TrackingProducer, consumer: SeqConsumer,
                    tag: str = "bench") -> None:
    """Open both connections to ``port``: the producer in confirm mode, the consumer consuming."""
    await producer.open("127.0.0.1", port, "guest", "guest", "/", 0, 10.0)
    await producer.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
    await consumer.open("127.0.0.1", port, "guest", "guest", "/", 0, 10.0)
    await consumer.rpc(commands.Basic.Qos(prefetch_count=PREFETCH), "Basic.QosOk")
    await consumer.consume(queue, tag)


async def consumed_all(consumer: SeqConsumer, wanted: list[int], stall: float) -> list[int]:
    """Wait until every sequence number in ``wanted`` was received, or ``stall`` seconds pass
    without a new one; the ones still missing (acks flushed either way)."""
    loop = asyncio.get_running_loop()
    last, since = -1, loop.time()
    pending = wanted
    while True:
        if consumer.error is not None:
            raise consumer.error
        pending = [s for s in pending if s not in consumer.seen]
        if not pending or (consumer.seen.distinct == last and loop.time() - since > stall):
            consumer._flush_acks()
            return pending
        if consumer.seen.distinct != last:
            last, since = consumer.seen.distinct, loop.time()
        await asyncio.sleep(0.02)


def check_open(*conns: Connection) -> None:
    for c in conns:
        if c.error is not None:
            raise c.error if isinstance(c.error, AMQPError) else AMQPError(str(c.error))
