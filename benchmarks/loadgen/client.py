"""One AMQP 0-9-1 connection on channel 1, as a lean asyncio Protocol.

The hot path (deliveries, confirms, acks) is parsed and built with struct straight out of a
bytearray; the handshake and rare methods go through pamqp. Subclasses hook the verify path
(``verify = True`` routes each delivery's header and body frames through ``_verify_header`` and
``_verify_body``) and ``_on_confirm`` to time messages.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys

from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from .wire import (_ACKNACK, _FRAME_HDR, _HEARTBEAT, _U32, _U64, DEFAULT_FRAME_MAX,
                   FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
                   FRAME_OVERHEAD, M_BASIC_ACK, M_BASIC_DELIVER, M_BASIC_NACK, ack_frame)


class AMQPError(Exception):
    """Connection/channel level failure reported by the broker or socket."""


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
                            ack_frames.append(ack_frame(self.CHANNEL, self._last_tag,
                                                        self.ack_every > 1))
                            self._unacked = 0
                            self.acks_sent += 1
                    if self.verify:
                        self._v_need_seq = True
                elif mid == M_BASIC_ACK or mid == M_BASIC_NACK:
                    tag, bits = _ACKNACK.unpack_from(buf, pos + 11)  # the payload's args
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
            self.transport.write(ack_frame(self.CHANNEL, self._last_tag, self.ack_every > 1))
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
                                 "authentication_failure_close": True,
                                 "connection.blocked": True},
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



def run_loop(coro, no_uvloop: bool = False):
    """Run ``coro`` to completion on uvloop when it is installed (and not refused), else on
    asyncio's default loop. SIGTERM is handled like Ctrl-C meanwhile: the main task is
    cancelled, so its ``finally`` blocks still delete queues and close connections."""
    runner = asyncio.run
    if not no_uvloop:
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:
            pass
    previous = signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        return runner(coro)
    finally:
        signal.signal(signal.SIGTERM, previous)
