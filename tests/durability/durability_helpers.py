"""Helpers shared by the durability tests: pika/aio-pika clients and a lean raw-frame
confirm-mode publisher (PostgreSQL access, the subprocess broker and other scaffolding shared with
the other test directories are in eb_support)."""

from __future__ import annotations

import asyncio
import functools
from typing import Iterable

import pika
import pika.exceptions

from eb_support import pika_connect


@functools.lru_cache(maxsize=None)
def serve_has_option(option: str) -> bool:
    """Whether ``exchange-broker serve`` knows ``option`` (the CLI grows while others work)."""
    from exchange_broker.cli import build_parser
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    return option in serve._option_string_actions  # noqa: SLF001 - argparse has no public API


PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def connect(broker, **kw) -> pika.BlockingConnection:
    """A pika connection to a SubprocessBroker (``kw``: further ConnectionParameters)."""
    kw.setdefault("blocked_connection_timeout", 60)
    kw.setdefault("socket_timeout", 10)
    return pika_connect(broker.port, **kw)


def pumper(conn: pika.BlockingConnection):
    """For SubprocessBroker.terminate: let a blocking connection answer the broker's close."""
    def pump() -> None:
        if not conn.is_open:
            raise EOFError
        conn.process_data_events(time_limit=0.02)
    return pump


def message_count(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        if ch.is_open:
            ch.close()


def exists(conn: pika.BlockingConnection, kind: str, name: str) -> bool:
    """Passive declare; False on 404 (the channel the broker closed is thrown away)."""
    ch = conn.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    ch.close()
    return True


def drain(conn: pika.BlockingConnection, queue: str, expected: int | None = None,
          idle: float = 1.0, prefetch: int = 1000) -> list[tuple[bytes, bool]]:
    """Consume (auto-ack) until ``expected`` messages arrived or the queue stays idle.

    Returns (body, redelivered) in delivery order."""
    out: list[tuple[bytes, bool]] = []
    if expected == 0:
        return out
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    for method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=idle):
        if method is None:
            break
        out.append((body, method.redelivered))
        if expected is not None and len(out) >= expected:
            break
    ch.cancel()
    ch.close()
    return out


async def publish_confirmed(channel, routing_key: str, bodies: Iterable[bytes], *,
                            persistent: Iterable[bool] | None = None, in_flight: int = 500,
                            exchange=None) -> int:
    """aio-pika: publish in order with up to ``in_flight`` unconfirmed; raise on any nack."""
    import aio_pika

    ex = exchange or channel.default_exchange
    sem = asyncio.Semaphore(in_flight)
    tasks = []
    flags = iter(persistent) if persistent is not None else None

    async def one(body: bytes, mode) -> None:
        try:
            await ex.publish(aio_pika.Message(body, delivery_mode=mode), routing_key)
        finally:
            sem.release()

    for body in bodies:
        mode = aio_pika.DeliveryMode.PERSISTENT
        if flags is not None and not next(flags):
            mode = aio_pika.DeliveryMode.NOT_PERSISTENT
        await sem.acquire()
        # tasks start in creation order and aiormq serialises publishes on a FIFO lock,
        # so the wire order is the iteration order
        tasks.append(asyncio.ensure_future(one(body, mode)))
    await asyncio.gather(*tasks)
    return len(tasks)


class LeanPublisher:
    """A raw AMQP 0-9-1 publisher in confirm mode on asyncio streams, with many publishes in flight.

    pamqp frames the handshake and parses incoming frames; each publish is three pre-built frames
    written without awaiting anything.  Delivery tag n is the n-th publish, so ``outcome[n]`` is
    True (basic.ack), False (basic.nack), or missing (no answer yet).
    """

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.published = 0
        self.outcome: dict[int, bool] = {}
        self._low = 1  # lowest tag without an outcome
        self._changed = asyncio.Event()
        self._buf = bytearray()
        self._task: asyncio.Task | None = None
        self.closed_reason: str | None = None
        self.frame_max = 131072

    # -- plumbing --------------------------------------------------------------------------------
    async def _frame(self):
        from pamqp import frame
        while True:
            if len(self._buf) >= 7:
                total = 8 + int.from_bytes(self._buf[3:7], "big")
                if len(self._buf) >= total:
                    used, channel, value = frame.unmarshal(bytes(self._buf[:total]))
                    del self._buf[:total]
                    return channel, value
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("connection closed by the broker")
            self._buf += data

    async def _expect(self, kind):
        while True:
            _ch, value = await self._frame()
            if isinstance(value, kind):
                return value
            name = getattr(value, "name", type(value).__name__)
            if name in ("Connection.Close", "Channel.Close"):
                raise ConnectionError(f"{name}: {value.reply_code} {value.reply_text}")

    def _send(self, channel: int, value) -> None:
        from pamqp import frame
        self.writer.write(frame.marshal(value, channel))

    async def connect(self, port: int, host: str = "127.0.0.1", user: str = "guest",
                      password: str = "guest", vhost: str = "/") -> "LeanPublisher":
        from pamqp import commands as c
        self.reader, self.writer = await asyncio.open_connection(host, port)
        self.writer.write(b"AMQP\x00\x00\x09\x01")
        await self._expect(c.Connection.Start)
        self._send(0, c.Connection.StartOk({"product": "durability-tests"}, "PLAIN",
                                           f"\0{user}\0{password}", "en_US"))
        tune = await self._expect(c.Connection.Tune)
        self.frame_max = tune.frame_max or self.frame_max
        self._send(0, c.Connection.TuneOk(tune.channel_max, self.frame_max, 0))
        self._send(0, c.Connection.Open(vhost))
        await self._expect(c.Connection.OpenOk)
        self._send(1, c.Channel.Open())
        await self._expect(c.Channel.OpenOk)
        self._send(1, c.Confirm.Select())
        await self._expect(c.Confirm.SelectOk)
        self._task = asyncio.ensure_future(self._read_confirms())
        return self

    async def _read_confirms(self) -> None:
        from pamqp import commands as c
        try:
            while True:
                _ch, value = await self._frame()
                if isinstance(value, (c.Basic.Ack, c.Basic.Nack)):
                    ok = isinstance(value, c.Basic.Ack)
                    tag = value.delivery_tag
                    if value.multiple:
                        for t in range(self._low, tag + 1):
                            self.outcome.setdefault(t, ok)
                    else:
                        self.outcome[tag] = ok
                    while self._low in self.outcome:
                        self._low += 1
                    self._changed.set()
                elif isinstance(value, (c.Connection.Close, c.Channel.Close)):
                    self.closed_reason = f"{value.reply_code} {value.reply_text}"
                    return
        except (ConnectionError, OSError) as exc:
            self.closed_reason = str(exc) or type(exc).__name__
        finally:
            self._changed.set()

    # -- publishing ------------------------------------------------------------------------------
    def publish(self, routing_key: str, body: bytes, exchange: str = "",
                persistent: bool = True) -> int:
        """Write one publish (no waiting); returns its delivery tag."""
        from pamqp import body as pbody
        from pamqp import commands as c
        from pamqp import frame
        from pamqp import header
        props = c.Basic.Properties(delivery_mode=2 if persistent else 1)
        data = frame.marshal(c.Basic.Publish(exchange=exchange, routing_key=routing_key), 1)
        data += frame.marshal(header.ContentHeader(0, len(body), props), 1)
        chunk = self.frame_max - 8
        for i in range(0, len(body), chunk):
            data += frame.marshal(pbody.ContentBody(body[i:i + chunk]), 1)
        self.writer.write(data)
        self.published += 1
        return self.published

    @property
    def in_flight(self) -> int:
        return self.published - len(self.outcome)

    async def wait(self, predicate, timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` holds or the connection is gone."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            if self.closed_reason is not None:
                return False
            self._changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate()
            if self.writer.transport.get_write_buffer_size() > 1 << 20:
                await self.writer.drain()
        return True

    async def publish_all(self, routing_key: str, bodies: Iterable[bytes], in_flight: int = 1000,
                          persistent: Iterable[bool] | None = None, timeout: float = 60) -> None:
        """Publish in order with at most ``in_flight`` unconfirmed; raise unless all are acked."""
        flags = iter(persistent) if persistent is not None else None
        for body in bodies:
            if self.in_flight >= in_flight:
                if not await self.wait(lambda: self.in_flight < in_flight, timeout):
                    raise ConnectionError(f"publisher stalled: {self.closed_reason}")
            self.publish(routing_key, body, persistent=True if flags is None else next(flags))
        if not await self.wait(lambda: self.in_flight == 0, timeout):
            raise ConnectionError(f"confirms missing: {self.closed_reason}")
        nacked = [t for t, ok in self.outcome.items() if not ok]
        if nacked:
            raise AssertionError(f"{len(nacked)} publishes nacked, e.g. tags {nacked[:5]}")

    def confirmed(self) -> set[int]:
        return {t for t, ok in self.outcome.items() if ok}

    async def close(self) -> None:
        from pamqp import commands as c
        if self._task is not None:
            self._task.cancel()
        if self.writer is not None:
            try:
                if self.closed_reason is None:
                    self._send(0, c.Connection.Close(200, "bye"))
                    await asyncio.wait_for(self.writer.drain(), 2)
                self.writer.close()
            except Exception:  # noqa: BLE001 - the broker may be gone
                pass
