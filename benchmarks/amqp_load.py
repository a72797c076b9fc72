#!/usr/bin/env python3
"""Lean AMQP 0-9-1 load generator.

Speaks the wire protocol directly on asyncio (uvloop when importable):

* pamqp encodes/decodes the handshake and the other rare ("cold") methods;
* the hot path never goes through pamqp: a publish (basic.publish method
  frame + content header frame + body frame(s)) is encoded once with struct
  and written in large batches, and incoming frames are split with struct
  straight out of a bytearray.  Deliveries are only counted (and their
  delivery tag extracted when acks are needed); publisher confirms are
  parsed the same way.

Scenarios
---------
transient  1 producer + 1 consumer connection, transient messages
           (delivery_mode 1), consumer with no_ack=True, on a fresh
           non-durable auto-delete queue.  Reports consumed msgs/s.
confirms   1 producer in confirm mode (at most --max-unconfirmed
           publishes in flight), 1 consumer with manual acks and
           basic.qos prefetch, persistent messages (delivery_mode 2) on a
           fresh durable queue.  Reports consumed/s and confirmed/s.

With --verify the producer publishes exactly --count messages (each body
carries its sequence number) and the run checks the consumer received
exactly that many, in order, with the right size and no duplicates.

Examples::

    python benchmarks/amqp_load.py --scenario transient
    python benchmarks/amqp_load.py --scenario confirms --seconds 10 --json
    python benchmarks/amqp_load.py --scenario transient --verify --count 200000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import time
import uuid

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

# --------------------------------------------------------------------------
# Wire constants / pre-compiled structs
# --------------------------------------------------------------------------
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7 byte header + 1 byte frame-end

_FRAME_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACKNACK = struct.Struct(">QB")  # delivery-tag, bits
# basic.ack method frame: type, channel, size(=13), class 60, method 80,
# delivery-tag, bits, frame-end
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_HEARTBEAT = bytes([FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END])

# (class_id << 16) | method_id, read as one big-endian u32 from the payload
M_BASIC_DELIVER = (60 << 16) | 60
M_BASIC_ACK = (60 << 16) | 80
M_BASIC_NACK = (60 << 16) | 120

DEFAULT_FRAME_MAX = 131072


class AMQPError(Exception):
    """Connection/channel level failure reported by the broker or socket."""


# --------------------------------------------------------------------------
# Hot-path encoders (struct only)
# --------------------------------------------------------------------------
def _shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"shortstr too long: {value!r}")
    return bytes([len(raw)]) + raw


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HDR.pack(ftype, channel, len(payload)) + payload + b"\xce"


def encode_publish(channel: int, exchange: str, routing_key: str, body: bytes,
                   delivery_mode: int, frame_max: int) -> bytes:
    """basic.publish + content header + body frame(s), as raw bytes."""
    method = (struct.pack(">HHH", 60, 40, 0) + _shortstr(exchange)
              + _shortstr(routing_key) + b"\x00")  # mandatory=0 immediate=0
    # class-id, weight, body-size, property-flags (bit 12 = delivery-mode)
    header = struct.pack(">HHQHB", 60, 0, len(body), 0x1000, delivery_mode)
    out = [_frame(FRAME_METHOD, channel, method),
           _frame(FRAME_HEADER, channel, header)]
    chunk = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), chunk):
        out.append(_frame(FRAME_BODY, channel, body[i:i + chunk]))
    return b"".join(out)


def _encode_publish_pamqp(channel, exchange, routing_key, body, delivery_mode,
                          frame_max) -> bytes:
    """Reference encoding through pamqp, used once to cross-check ours."""
    parts = [
        pframe.marshal(commands.Basic.Publish(exchange=exchange,
                                              routing_key=routing_key), channel),
        pframe.marshal(pheader.ContentHeader(
            0, len(body), commands.Basic.Properties(delivery_mode=delivery_mode)),
            channel),
    ]
    chunk = frame_max - FRAME_OVERHEAD
    for i in range(0, len(body), chunk):
        parts.append(pframe.marshal(pbody.ContentBody(body[i:i + chunk]), channel))
    return b"".join(parts)


# --------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------
class Connection(asyncio.Protocol):
    """One AMQP connection using channel 1 only."""

    CHANNEL = 1

    def __init__(self, name: str):
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.frame_max = DEFAULT_FRAME_MAX
        self.heartbeat = 0
        self.server_properties: dict = {}
        self.error: BaseException | None = None
        self.closing = False
        self._waiters: list[tuple[int, tuple[str, ...], asyncio.Future]] = []
        self._hb_handle: asyncio.TimerHandle | None = None
        self._close_ok: asyncio.Future | None = None
        # write flow control (TCP back-pressure)
        self.writable = asyncio.Event()
        self.writable.set()
        self.write_pauses = 0
        # consumer state
        self.deliveries = 0
        self.ack_every = 0          # 0 = no_ack consumer; 1 = ack each; n = multiple every n
        self._unacked = 0
        self._last_tag = 0
        self.acks_sent = 0
        self._ack_flush: asyncio.TimerHandle | None = None
        self.consumer_cancelled = False
        self.delivery_event: asyncio.Event | None = None  # set by --max-backlog
        # verify state (consumer)
        self.verify = False
        self.v_expected_size = 0
        self.v_next_seq = 1
        self.v_errors: list[str] = []
        self.v_completed = 0
        self._v_remaining = 0       # body bytes still expected for current msg
        self._v_need_seq = False
        # publisher-confirm state (producer)
        self.confirmed = 0
        self.nacked = 0
        self._c_water = 0           # every tag <= this has been confirmed
        self._c_singles: set[int] = set()
        self.confirm_event = asyncio.Event()
        self.returned = 0
        self.blocked = False

    # ---------------------------------------------------------------- asyncio
    def connection_made(self, transport):
        self.transport = transport
        # Keep the user-space write buffer small so back-pressure is prompt.
        transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)

    def pause_writing(self):
        self.writable.clear()
        self.write_pauses += 1

    def resume_writing(self):
        self.writable.set()

    def connection_lost(self, exc):
        if self.error is None and not self.closing:
            self.error = AMQPError(f"{self.name}: connection lost"
                                   + (f": {exc}" if exc else ""))
        self._fail_waiters(self.error or AMQPError(f"{self.name}: closed"))
        if self._close_ok is not None and not self._close_ok.done():
            self._close_ok.set_result(None)
        if self._hb_handle:
            self._hb_handle.cancel()
        if self._ack_flush:
            self._ack_flush.cancel()
        # wake anybody blocked on flow control so they notice the error
        self.writable.set()
        self.confirm_event.set()
        if self.delivery_event is not None:
            self.delivery_event.set()

    # ------------------------------------------------------------- hot path
    def data_received(self, data):
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        unpack_hdr = _FRAME_HDR.unpack_from
        unpack_u32 = _U32.unpack_from
        ack_frames = None
        while n - pos >= FRAME_OVERHEAD:
            ftype, channel, size = unpack_hdr(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                if buf[pos:pos + 4] == b"AMQP":
                    self._fatal(AMQPError(
                        f"{self.name}: server rejected protocol header "
                        f"{bytes(buf[pos:pos + 8])!r}"))
                else:
                    self._fatal(AMQPError(
                        f"{self.name}: bad frame end at offset {end}"))
                return
            if ftype == FRAME_METHOD:
                mid = unpack_u32(buf, pos + 7)[0]
                if mid == M_BASIC_DELIVER:
                    self.deliveries += 1
                    if self.ack_every:
                        ctag_len = buf[pos + 11]
                        self._last_tag = _U64.unpack_from(buf, pos + 12 + ctag_len)[0]
                        self._unacked += 1
                        if self._unacked >= self.ack_every:
                            if ack_frames is None:
                                ack_frames = []
                            ack_frames.append(_ACK_FRAME.pack(
                                FRAME_METHOD, self.CHANNEL, 13, 60, 80,
                                self._last_tag, 1 if self.ack_every > 1 else 0,
                                FRAME_END))
                            self._unacked = 0
                            self.acks_sent += 1
                    if self.verify:
                        self._v_need_seq = True
                elif mid == M_BASIC_ACK or mid == M_BASIC_NACK:
                    tag, bits = _ACKNACK.unpack_from(buf, pos + 11)
                    self._on_confirm(tag, bits & 1, mid == M_BASIC_ACK)
                else:
                    self._cold_frame(bytes(buf[pos:end + 1]))
            elif ftype == FRAME_BODY:
                if self.verify:
                    self._verify_body(buf, pos + 7, size)
            elif ftype == FRAME_HEADER:
                if self.verify and self._v_need_seq:
                    self._verify_header(buf, pos + 7)
            elif ftype == FRAME_HEARTBEAT:
                pass  # any traffic we send keeps the server happy
            else:
                self._fatal(AMQPError(f"{self.name}: unknown frame type {ftype}"))
                return
            pos = end + 1
        if pos:
            del buf[:pos]
        if ack_frames is not None:
            self.transport.write(b"".join(ack_frames))
        if self.delivery_event is not None:
            self.delivery_event.set()
        if self._unacked and self._ack_flush is None and self.transport is not None:
            # don't leave a partial ack batch hanging if traffic goes quiet
            self._ack_flush = self.loop.call_later(0.02, self._flush_acks)

    def _flush_acks(self):
        self._ack_flush = None
        if self._unacked and not self.transport.is_closing():
            self.transport.write(_ACK_FRAME.pack(
                FRAME_METHOD, self.CHANNEL, 13, 60, 80, self._last_tag,
                1 if self.ack_every > 1 else 0, FRAME_END))
            self._unacked = 0
            self.acks_sent += 1

    def _on_confirm(self, tag: int, multiple: int, is_ack: bool):
        singles = self._c_singles
        if multiple:
            if tag <= self._c_water:
                return
            count = tag - self._c_water
            if singles:
                covered = [t for t in singles if t <= tag]
                count -= len(covered)
                singles.difference_update(covered)
            self._c_water = tag
        else:
            if tag <= self._c_water or tag in singles:
                return
            count = 1
            singles.add(tag)
            while self._c_water + 1 in singles:
                self._c_water += 1
                singles.discard(self._c_water)
        if is_ack:
            self.confirmed += count
        else:
            self.nacked += count
        self.confirm_event.set()

    # --------------------------------------------------------- verify path
    def _verify_header(self, buf, off):
        body_size = _U64.unpack_from(buf, off + 4)[0]
        if body_size != self.v_expected_size and len(self.v_errors) < 20:
            self.v_errors.append(
                f"delivery #{self.deliveries}: body size {body_size}, "
                f"expected {self.v_expected_size}")
        self._v_remaining = body_size
        if body_size == 0:
            self._v_need_seq = False
            self.v_completed += 1

    def _verify_body(self, buf, off, size):
        if self._v_need_seq:
            self._v_need_seq = False
            seq = _U64.unpack_from(buf, off)[0] if size >= 8 else -1
            if seq != self.v_next_seq and len(self.v_errors) < 20:
                self.v_errors.append(
                    f"delivery #{self.deliveries}: sequence {seq}, "
                    f"expected {self.v_next_seq}")
            self.v_next_seq = seq + 1
        self._v_remaining -= size
        if self._v_remaining <= 0:
            self.v_completed += 1

    # ------------------------------------------------------------ cold path
    def _cold_frame(self, raw: bytes):
        try:
            _, channel, frame = pframe.unmarshal(raw)
        except Exception as exc:  # noqa: BLE001
            self._fatal(AMQPError(f"{self.name}: cannot decode frame: {exc}"))
            return
        name = getattr(frame, "name", "")
        if name == "Connection.Close":
            self._send(0, commands.Connection.CloseOk())
            self._fatal(AMQPError(
                f"{self.name}: broker closed connection: {frame.reply_code} "
                f"{frame.reply_text} (class {frame.class_id} method {frame.method_id})"))
            return
        if name == "Connection.CloseOk":
            if self._close_ok is not None and not self._close_ok.done():
                self._close_ok.set_result(None)
            return
        if name == "Channel.Close":
            self._send(channel, commands.Channel.CloseOk())
            self._fatal(AMQPError(
                f"{self.name}: broker closed channel {channel}: {frame.reply_code} "
                f"{frame.reply_text} (class {frame.class_id} method {frame.method_id})"),
                close=False)
            return
        if name == "Connection.Blocked":
            self.blocked = True
            print(f"[{self.name}] connection blocked by broker: {frame.reason}",
                  file=sys.stderr)
            return
        if name == "Connection.Unblocked":
            self.blocked = False
            return
        if name == "Basic.Cancel":  # server-initiated consumer cancel
            self.consumer_cancelled = True
            return
        if name == "Basic.Return":
            self.returned += 1
            return
        for i, (ch, names, fut) in enumerate(self._waiters):
            if ch == channel and name in names:
                del self._waiters[i]
                if not fut.done():
                    fut.set_result(frame)
                return
        # anything else (e.g. content frames of a basic.return) is ignored

    def _fail_waiters(self, exc: BaseException):
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    def _fatal(self, exc: BaseException, close: bool = True):
        if self.error is None:
            self.error = exc
        self._fail_waiters(exc)
        self.writable.set()
        self.confirm_event.set()
        if self.delivery_event is not None:
            self.delivery_event.set()
        if close and self.transport is not None:
            self.transport.close()

    # --------------------------------------------------------------- helpers
    def _send(self, channel: int, method) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(pframe.marshal(method, channel))

    def _expect(self, channel: int, names: tuple[str, ...]) -> asyncio.Future:
        fut = self.loop.create_future()
        if self.error is not None:
            fut.set_exception(self.error)
        else:
            self._waiters.append((channel, names, fut))
        return fut

    async def rpc(self, method, reply: str | tuple[str, ...], channel: int | None = None,
                  timeout: float = 30.0):
        if isinstance(reply, str):
            reply = (reply,)
        channel = self.CHANNEL if channel is None else channel
        fut = self._expect(channel, reply)
        self._send(channel, method)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise AMQPError(f"{self.name}: timed out waiting for {'/'.join(reply)}") from None

    def _heartbeat_tick(self):
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(_HEARTBEAT)
        self._hb_handle = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # ------------------------------------------------------------- lifecycle
    async def open(self, host: str, port: int, user: str, password: str, vhost: str,
                   heartbeat: int = 0, timeout: float = 10.0) -> None:
        await asyncio.wait_for(
            self.loop.create_connection(lambda: self, host, port), timeout)
        start_fut = self._expect(0, ("Connection.Start",))
        self.transport.write(pheader.ProtocolHeader().marshal())
        try:
            start = await asyncio.wait_for(start_fut, timeout)
        except asyncio.TimeoutError:
            raise AMQPError(f"{self.name}: no connection.start from {host}:{port}") from None
        self.server_properties = start.server_properties or {}
        mechanisms = start.mechanisms
        if isinstance(mechanisms, bytes):
            mechanisms = mechanisms.decode()
        if "PLAIN" not in mechanisms.split():
            raise AMQPError(f"{self.name}: server does not offer PLAIN ({mechanisms})")
        tune_fut = self._expect(0, ("Connection.Tune",))
        self._send(0, commands.Connection.StartOk(
            client_properties={
                "product": "amqp_load",
                "platform": f"Python {sys.version.split()[0]}",
                "connection_name": f"amqp_load-{self.name}",
                "capabilities": {"publisher_confirms": True,
                                 "basic.nack": True,
                                 "consumer_cancel_notify": True,
                                 "authentication_failure_close": True},
            },
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        try:
            tune = await asyncio.wait_for(tune_fut, timeout)
        except asyncio.TimeoutError:
            raise AMQPError(f"{self.name}: no connection.tune (bad credentials?)") from None
        self.frame_max = min(tune.frame_max or DEFAULT_FRAME_MAX, DEFAULT_FRAME_MAX)
        if heartbeat and tune.heartbeat:
            self.heartbeat = min(heartbeat, tune.heartbeat)
        else:
            self.heartbeat = heartbeat if not tune.heartbeat else 0
        self._send(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max or 1, frame_max=self.frame_max,
            heartbeat=self.heartbeat))
        await self.rpc(commands.Connection.Open(virtual_host=vhost),
                       "Connection.OpenOk", channel=0, timeout=timeout)
        if self.heartbeat:
            self._hb_handle = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        await self.rpc(commands.Channel.Open(), "Channel.OpenOk", timeout=timeout)

    async def close(self, timeout: float = 5.0) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.closing = True
        self._close_ok = self.loop.create_future()
        self._send(0, commands.Connection.Close(reply_code=200, reply_text="bye",
                                                class_id=0, method_id=0))
        try:
            await asyncio.wait_for(self._close_ok, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if not self.transport.is_closing():
                self.transport.close()


# --------------------------------------------------------------------------
# Publisher
# --------------------------------------------------------------------------
class Publisher:
    def __init__(self, conn: Connection, message: bytes, batch: int,
                 window: int = 0, limit: int = 0, seq_offset: int = -1,
                 rate: float = 0.0, consumer: Connection | None = None,
                 max_backlog: int = 0):
        if rate:
            # keep writes ~10 ms apart at the target rate
            batch = max(1, min(batch, int(rate / 100)))
        self.rate = rate
        self.consumer = consumer
        self.max_backlog = max_backlog
        if max_backlog and consumer is not None:
            consumer.delivery_event = asyncio.Event()
        self.conn = conn
        self.message = message
        self.batch = batch
        self.batch_bytes = message * batch
        self.window = window          # max unconfirmed (0 = unlimited)
        self.limit = limit            # total messages to publish (0 = forever)
        self.seq_offset = seq_offset  # where to stamp the sequence (verify)
        self.published = 0
        self.stopped = False

    def _chunk(self, k: int) -> bytes:
        if self.seq_offset < 0:
            return self.batch_bytes if k == self.batch else self.message * k
        out = bytearray(self.message * k)
        step = len(self.message)
        off = self.seq_offset
        seq = self.published
        pack_into = _U64.pack_into
        for i in range(k):
            seq += 1
            pack_into(out, off, seq)
            off += step
        return out

    async def run(self) -> None:
        conn = self.conn
        transport = conn.transport
        writable = conn.writable
        confirm_event = conn.confirm_event
        window = self.window
        limit = self.limit
        sleep = asyncio.sleep
        rate = self.rate
        loop = asyncio.get_running_loop()
        t_start = loop.time()
        max_backlog = self.max_backlog
        consumer = self.consumer
        while not self.stopped and conn.error is None:
            if max_backlog:
                room = max_backlog - (self.published - consumer.deliveries)
                if room <= 0:
                    consumer.delivery_event.clear()
                    await consumer.delivery_event.wait()
                    continue
            if rate:
                ahead = t_start + self.published / rate - loop.time()
                if ahead > 0:
                    await sleep(ahead)
                    continue
            if not writable.is_set():
                await writable.wait()
                continue
            k = self.batch
            if limit:
                k = min(k, limit - self.published)
                if k <= 0:
                    return
            if window:
                room = window - (self.published - conn.confirmed - conn.nacked)
                if room <= 0:
                    confirm_event.clear()
                    await confirm_event.wait()
                    continue
                k = min(k, room)
            if max_backlog:
                k = min(k, max_backlog - (self.published - consumer.deliveries))
            transport.write(self._chunk(k))
            self.published += k
            # let the consumer's reads (same loop) run between batches
            await sleep(0)
        if conn.error is not None and not conn.closing:
            raise conn.error


# --------------------------------------------------------------------------
# Scenario runner
# --------------------------------------------------------------------------
SCENARIOS = {
    "transient": dict(durable=False, delivery_mode=1, confirms=False, no_ack=True),
    "confirms": dict(durable=True, delivery_mode=2, confirms=True, no_ack=False),
}


def _rate(a: float, b: float, dt: float) -> float:
    return (b - a) / dt if dt > 0 else 0.0


async def run(opts) -> dict:
    sc = SCENARIOS[opts.scenario]
    loop = asyncio.get_running_loop()
    qname = f"amqp-load-{opts.scenario}-{uuid.uuid4().hex[:10]}"
    conn_args = (opts.host, opts.port, opts.user, opts.password, opts.vhost,
                 opts.heartbeat, opts.connect_timeout)

    prod = Connection("producer")
    cons = Connection("consumer")
    conns = [prod, cons]
    result: dict = {
        "scenario": opts.scenario, "host": opts.host, "port": opts.port,
        "size": opts.size, "queue": qname,
        "delivery_mode": sc["delivery_mode"], "durable_queue": sc["durable"],
        "queue_type": opts.queue_type or "classic",
        "event_loop": type(loop).__module__.split(".")[0],
    }
    declared = False
    try:
        await prod.open(*conn_args)
        await cons.open(*conn_args)
        result["server"] = _server_name(prod.server_properties)

        durable = sc["durable"] or opts.queue_type in ("quorum", "stream")
        await prod.rpc(commands.Queue.Declare(
            queue=qname, durable=durable, auto_delete=not durable,
            arguments={"x-queue-type": opts.queue_type} if opts.queue_type else {}),
            "Queue.DeclareOk")
        declared = True

        if sc["confirms"]:
            await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        if sc["no_ack"]:
            cons.ack_every = 0
            result["ack_mode"] = "no_ack (auto-ack)"
        else:
            await cons.rpc(commands.Basic.Qos(prefetch_count=opts.prefetch), "Basic.QosOk")
            every = max(1, opts.ack_every)
            if opts.prefetch:
                every = max(1, min(every, opts.prefetch // 2))
            cons.ack_every = every
            result["prefetch"] = opts.prefetch
            result["ack_mode"] = ("basic.ack per message" if every == 1 else
                                  f"basic.ack multiple=True every {every} deliveries "
                                  f"(+ flush after 20 ms idle)")
        await cons.rpc(commands.Basic.Consume(queue=qname, consumer_tag="amqp-load",
                                              no_ack=sc["no_ack"]),
                       "Basic.ConsumeOk")

        body = bytes(opts.size)
        frame_max = min(prod.frame_max, cons.frame_max)
        message = encode_publish(Connection.CHANNEL, "", qname, body,
                                 sc["delivery_mode"], frame_max)
        if message != _encode_publish_pamqp(Connection.CHANNEL, "", qname, body,
                                            sc["delivery_mode"], frame_max):
            raise AssertionError("hot-path publish encoding differs from pamqp's")
        seq_offset = -1
        if opts.verify:
            # offset of the first body byte: method frame + header frame + 7
            method_len = 7 + 4 + 2 + 1 + 0 + 1 + len(qname.encode()) + 1 + 1
            header_len = 7 + 15 + 1
            seq_offset = method_len + header_len + 7
            assert message[seq_offset - 7] == FRAME_BODY
            cons.verify = True
            cons.v_expected_size = opts.size
        result["frame_max"] = frame_max
        # keep one write <= 256 KiB so big messages don't defeat back-pressure
        batch = max(1, min(opts.batch, (256 * 1024) // len(message)))
        result["batch"] = batch
        result["rate_limit"] = opts.rate or None
        result["max_backlog"] = opts.max_backlog or None
        if sc["confirms"]:
            result["max_unconfirmed"] = opts.max_unconfirmed

        pub = Publisher(prod, message, batch,
                        window=opts.max_unconfirmed if sc["confirms"] else 0,
                        limit=opts.count if opts.verify else 0,
                        seq_offset=seq_offset, rate=opts.rate, consumer=cons,
                        max_backlog=opts.max_backlog)

        if opts.verify:
            await _run_verify(opts, sc, prod, cons, pub, result)
        else:
            await _run_timed(opts, sc, prod, cons, pub, result)

        if declared:
            try:
                await prod.rpc(commands.Queue.Delete(queue=qname), "Queue.DeleteOk",
                               timeout=15)
                declared = False
            except AMQPError as exc:
                print(f"warning: queue.delete failed: {exc}", file=sys.stderr)
    finally:
        if declared and prod.error is None and prod.transport is not None:
            try:
                await prod.rpc(commands.Queue.Delete(queue=qname), "Queue.DeleteOk",
                               timeout=5)
            except Exception:  # noqa: BLE001
                pass
        for c in conns:
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
    return result


async def _run_timed(opts, sc, prod, cons, pub, result):
    loop = asyncio.get_running_loop()
    samples = []  # (t, published, consumed, confirmed, cpu)

    def snap():
        samples.append((loop.time(), pub.published, cons.deliveries, prod.confirmed,
                        time.process_time()))

    t0 = loop.time()
    # sample at the end of the warm-up, then once a second, then at the end
    marks = [opts.warmup]
    while marks[-1] + 1.0 < opts.seconds - 1e-6:
        marks.append(marks[-1] + 1.0)
    marks.append(opts.seconds)
    task = asyncio.ensure_future(pub.run())
    try:
        for mark in marks:
            delay = t0 + mark - loop.time()
            if delay > 0:
                done, _ = await asyncio.wait({task}, timeout=delay)
                if done:
                    task.result()  # propagate publisher errors
                    raise AMQPError("publisher stopped unexpectedly")
            for c in (prod, cons):
                if c.error is not None:
                    raise c.error
            snap()
    finally:
        pub.stopped = True
        try:
            await asyncio.wait_for(task, 5)
        except Exception:  # noqa: BLE001
            task.cancel()
    a, b = samples[0], samples[-1]
    dt = b[0] - a[0]
    per_second = []
    for x, y in zip(samples, samples[1:]):
        per_second.append(round(_rate(x[2], y[2], y[0] - x[0]), 1))
    result.update({
        "mode": "timed",
        "seconds": opts.seconds, "warmup": opts.warmup, "window_s": round(dt, 3),
        "published": pub.published, "consumed": cons.deliveries,
        "published_per_s": round(_rate(a[1], b[1], dt), 1),
        "consumed_per_s": round(_rate(a[2], b[2], dt), 1),
        "consumed_per_s_by_second": per_second,
        "backlog_at_end": pub.published - cons.deliveries,
        "client_cpu": round((b[4] - a[4]) / dt, 3) if dt > 0 else None,
        "producer_write_pauses": prod.write_pauses,
    })
    if sc["confirms"]:
        result.update({
            "confirmed": prod.confirmed, "nacked": prod.nacked,
            "confirmed_per_s": round(_rate(a[3], b[3], dt), 1),
            "consumer_acks_sent": cons.acks_sent,
        })


async def _run_verify(opts, sc, prod, cons, pub, result):
    loop = asyncio.get_running_loop()
    n = opts.count
    t0 = loop.time()
    cpu0 = time.process_time()
    await pub.run()
    t_pub = loop.time()
    # wait until everything arrived (and, with confirms, was confirmed);
    # give up after --verify-timeout seconds without progress
    last = (-1, -1)
    last_change = loop.time()
    while True:
        for c in (prod, cons):
            if c.error is not None:
                raise c.error
        done_recv = cons.v_completed >= n
        done_conf = not sc["confirms"] or prod.confirmed + prod.nacked >= n
        if done_recv and done_conf:
            break
        cur = (cons.v_completed, prod.confirmed + prod.nacked)
        if cur != last:
            last, last_change = cur, loop.time()
        elif loop.time() - last_change > opts.verify_timeout:
            break
        await asyncio.sleep(0.005)
    t_done = loop.time()
    cpu1 = time.process_time()
    if sc["confirms"]:
        # make sure the trailing partial ack batch reached the broker
        cons._flush_acks()
    await asyncio.sleep(opts.verify_grace)  # catch duplicates / extras
    problems = list(cons.v_errors)
    if cons.deliveries != n:
        problems.append(f"received {cons.deliveries} deliveries, expected exactly {n}")
    if cons.v_completed != n:
        problems.append(f"completed {cons.v_completed} message bodies, expected {n}")
    if pub.published != n:
        problems.append(f"published {pub.published}, expected {n}")
    if sc["confirms"]:
        if prod.confirmed != n:
            problems.append(f"confirmed {prod.confirmed}, expected {n}")
        if prod.nacked:
            problems.append(f"{prod.nacked} publishes nacked")
    dt = t_done - t0
    result.update({
        "mode": "verify", "count": n,
        "published": pub.published, "consumed": cons.deliveries,
        "publish_seconds": round(t_pub - t0, 3), "total_seconds": round(dt, 3),
        "consumed_per_s": round(cons.deliveries / dt, 1) if dt > 0 else None,
        "client_cpu": round((cpu1 - cpu0) / dt, 3) if dt > 0 else None,
        "verify_ok": not problems, "verify_problems": problems,
    })
    if sc["confirms"]:
        result.update({"confirmed": prod.confirmed, "nacked": prod.nacked,
                       "confirmed_per_s": round(prod.confirmed / dt, 1) if dt > 0 else None})


def _server_name(props: dict) -> str:
    def s(v):
        return v.decode() if isinstance(v, bytes) else str(v)
    prod = s(props.get("product", "?"))
    ver = props.get("version")
    return f"{prod} {s(ver)}" if ver else prod


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Lean AMQP 0-9-1 load generator (raw frames, asyncio/uvloop).")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="transient")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="total run time incl. warm-up (default 10)")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds excluded from the measurement (default 1)")
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--batch", type=int, default=256,
                   help="messages per transport.write (default 256, capped so one write "
                        "stays <= 256 KiB)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="cap the publish rate in msgs/s (default 0 = as fast as "
                        "TCP back-pressure allows)")
    p.add_argument("--max-backlog", type=int, default=0,
                   help="pause publishing while published - consumed >= N, keeping "
                        "the queue short (default 0 = unlimited)")
    p.add_argument("--max-unconfirmed", type=int, default=500,
                   help="confirms: max publishes awaiting confirm (default 500)")
    p.add_argument("--prefetch", type=int, default=200,
                   help="confirms: consumer basic.qos prefetch_count (default 200)")
    p.add_argument("--ack-every", type=int, default=50,
                   help="confirms: consumer acks with multiple=True every N deliveries, "
                        "capped at prefetch/2; 1 = one basic.ack per message (default 50)")
    p.add_argument("--heartbeat", type=int, default=0,
                   help="heartbeat seconds to negotiate (default 0 = off)")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--verify", action="store_true",
                   help="publish exactly --count messages and check every one is "
                        "consumed exactly once, in order")
    p.add_argument("--count", type=int, default=100000,
                   help="messages to publish with --verify (default 100000)")
    p.add_argument("--verify-timeout", type=float, default=15.0,
                   help="--verify gives up after this many seconds without progress")
    p.add_argument("--verify-grace", type=float, default=0.5,
                   help="--verify waits this long after completion to catch extras")
    p.add_argument("--queue-type", default=None, choices=("classic", "quorum"),
                   help="x-queue-type of the benchmark queue (quorum queues are always durable)")
    p.add_argument("--json", action="store_true", help="print one JSON line with results")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    return p


def _print_human(r: dict) -> None:
    print(f"scenario      : {r['scenario']}  (server {r.get('server', '?')} at "
          f"{r['host']}:{r['port']}, loop {r['event_loop']})")
    print(f"message       : {r['size']} B, delivery_mode {r['delivery_mode']}, "
          f"{'durable' if r['durable_queue'] else 'non-durable'} queue; "
          f"consumer {r['ack_mode']}")
    if r["mode"] == "timed":
        print(f"window        : {r['window_s']} s (after {r['warmup']} s warm-up)")
        print(f"published/s   : {r['published_per_s']:,.0f}")
        print(f"consumed/s    : {r['consumed_per_s']:,.0f}   per second: "
              + ", ".join(f"{x:,.0f}" for x in r["consumed_per_s_by_second"]))
        if "confirmed_per_s" in r:
            print(f"confirmed/s   : {r['confirmed_per_s']:,.0f}  (nacked {r['nacked']})")
        print(f"totals        : published {r['published']:,}, consumed {r['consumed']:,}, "
              f"backlog at end {r['backlog_at_end']:,}")
        print(f"client CPU    : {r['client_cpu']:.0%} of one core")
        if len(r["consumed_per_s_by_second"]) > 2:
            sd = statistics.pstdev(r["consumed_per_s_by_second"])
            print(f"stdev/s       : {sd:,.0f}")
    else:
        status = "OK" if r["verify_ok"] else "FAILED"
        print(f"verify        : {status}: published {r['published']:,}, "
              f"consumed {r['consumed']:,} of {r['count']:,}"
              + (f", confirmed {r['confirmed']:,}, nacked {r['nacked']}"
                 if "confirmed" in r else ""))
        print(f"time          : publish {r['publish_seconds']} s, all consumed "
              f"{r['total_seconds']} s -> {r['consumed_per_s']:,.0f} msg/s")
        for p in r["verify_problems"]:
            print(f"  problem: {p}")


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.verify and opts.size < 8:
        print("--verify needs --size >= 8 (the body carries a sequence number)",
              file=sys.stderr)
        return 2
    if not opts.verify and opts.seconds - opts.warmup < 0.5:
        print("--seconds must exceed --warmup by at least 0.5", file=sys.stderr)
        return 2
    if opts.batch < 1 or opts.max_unconfirmed < 1:
        print("--batch and --max-unconfirmed must be >= 1", file=sys.stderr)
        return 2
    runner = asyncio.run
    if not opts.no_uvloop:
        try:
            import uvloop  # noqa: PLC0415
            runner = uvloop.run
        except ImportError:
            pass
    try:
        result = runner(run(opts))
    except (AMQPError, OSError, asyncio.TimeoutError) as exc:
        msg = str(exc) or type(exc).__name__
        if opts.json:
            print(json.dumps({"scenario": opts.scenario, "host": opts.host,
                              "port": opts.port, "error": msg}))
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if opts.json:
        print(json.dumps(result, separators=(",", ":")))
    else:
        _print_human(result)
    if result.get("mode") == "verify" and not result["verify_ok"]:
        return 1
    if result.get("mode") == "timed" and result.get("client_cpu", 0) and \
            result["client_cpu"] > 0.9 and not opts.json:
        print("note: the load generator used >90% of a core; it may be the bottleneck",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
