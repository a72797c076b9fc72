"""One channel of a client connection (``connection.py``): synchronous calls answered in order,
publishes with confirms, consumers fed by callbacks, basic.get, acks.

Confirms: after :meth:`Channel.confirm_select`, :meth:`Channel.publish` returns a future that
becomes True when the broker acks the message (its queues have it: stored, for durable ones) and
False when it nacks it; it fails with ``ClientError`` if the channel or the connection closes first.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from itertools import count
from typing import Callable

from pamqp import commands

from exchange_broker.client.errors import ClientError
from exchange_broker.protocol import codec
from exchange_broker.protocol.deliveries import Delivery
from exchange_broker.protocol.frames import publish_frames
from exchange_broker.protocol.names import method

OnDelivery = Callable[[Delivery], None]
OnCancel = Callable[[str, "ClientError | None"], None]  # (consumer tag, None: cancelled by the broker)


def _fail(fut: asyncio.Future, error: ClientError) -> None:
    if not fut.done():
        fut.set_exception(error)
        fut.exception()  # retrieved: whoever awaits it still gets the error


def _settle(waiting, ok: bool, count: int) -> None:
    """Confirms arrived: set the publish's future, or call ``on_confirm(ok, count)`` for ``count``
    of the publishes it was given for."""
    if isinstance(waiting, asyncio.Future):
        if not waiting.done():
            waiting.set_result(ok)
    else:
        waiting(ok, count)


class Channel:
    def __init__(self, connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.error: ClientError | None = None
        self.closing = False  # channel.close sent: nothing more goes out on it
        self.confirming = False
        self.on_return: Callable[[Delivery], None] | None = None  # mandatory publishes returned
        self._rpc: deque[tuple[tuple, asyncio.Future]] = deque()
        self._seq = 0
        # publishes awaiting their confirm, as runs [first seq, last seq, future or on_confirm]:
        # consecutive publishes given one on_confirm are one run, however many they are
        self._unconfirmed: deque[list] = deque()
        self._consumers: dict[str, tuple[OnDelivery, OnCancel | None]] = {}
        self._tags = count(1)
        # deliveries not yet settled, in delivery-tag order, and acks not yet sent: the acks of an
        # event-loop turn go as one basic.ack(multiple) where they cover a prefix (flush_acks)
        self._outstanding: OrderedDict[int, None] = OrderedDict()
        self._acks: set[int] = set()
        self._no_ack: set[str] = set()  # consumer tags of no-ack consumers (nothing to settle)

    # -- calls -----------------------------------------------------------------------------------
    async def call(self, m, *replies):
        """Send a synchronous method; returns the broker's reply (one of ``replies``)."""
        if self.error is not None:
            raise self.error
        if self.closing and not isinstance(m, commands.Channel.Close):
            raise ClientError("channel closed")
        self.flush_acks()  # before a cancel or close: what was acked must not come back
        fut = asyncio.get_running_loop().create_future()
        self._rpc.append((replies, fut))
        self.connection._send(codec.method_frame(self.number, m))
        return await fut

    async def confirm_select(self) -> None:
        await self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.confirming = True

    async def close(self) -> None:
        if self.error is None and not self.closing:
            self.flush_acks()
            # from here nothing more is sent on it: the broker forgets the channel once it answered
            # channel.close, and a frame for a channel it forgot closes the whole connection (504)
            self.closing = True
            try:
                await self.call(commands.Channel.Close(reply_code=200, reply_text="Goodbye", class_id=0,
                                                   method_id=0),
                                commands.Channel.CloseOk)
            except ClientError:
                pass
        self._closed(ClientError("channel closed"))

    # -- publishing ------------------------------------------------------------------------------
    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes,
                mandatory: bool = False, on_confirm: Callable[[bool, int], None] | None = None
                ) -> asyncio.Future | None:
        """basic.publish with raw content-header properties (passed on as they are). In confirm
        mode: returns the confirm's future (True: acked, False: nacked) or, given ``on_confirm``,
        calls ``on_confirm(ok, count)`` instead as confirms come (ok False also when the channel or
        connection is lost first; no future, no extra loop turn): publishes in a row given the same
        ``on_confirm`` are tracked as one run, and one multiple ack settles them in one call;
        else None."""
        if self.error is not None:
            raise self.error
        if self.closing:
            raise ClientError("channel closed")
        conn = self.connection
        if conn.transport is None or conn.transport.is_closing():
            raise conn.error or ClientError("connection is closed")
        conn.protocol.publish(self.number, exchange, routing_key, properties, body, mandatory)
        conn._schedule_flush()
        if not self.confirming:
            return None
        seq = self._seq = self._seq + 1
        runs = self._unconfirmed
        if on_confirm is not None:
            if runs:
                last = runs[-1]
                if last[2] is on_confirm and last[1] == seq - 1:
                    last[1] = seq
                    return None
            runs.append([seq, seq, on_confirm])
            return None
        fut = asyncio.get_running_loop().create_future()
        runs.append([seq, seq, fut])
        return fut

    def publish_tracked(self, exchange_sh: bytes, routing_key_sh: bytes, properties: bytes, body: bytes,
                        on_confirm: Callable[[bool, int], None]) -> None:
        """``publish(..., mandatory=True, on_confirm=on_confirm)`` on a channel in confirm mode,
        the exchange and routing key given as encoded short strings (``codec.short_cached``): what
        a link forwarding many publishes to one queue calls for each."""
        if self.error is not None:
            raise self.error
        if self.closing:
            raise ClientError("channel closed")
        conn = self.connection
        t = conn.transport
        if t is None or t.is_closing():
            raise conn.error or ClientError("connection is closed")
        proto = conn.protocol
        proto._out.extend(publish_frames(self.number, exchange_sh, routing_key_sh, True, properties, body,
                                         proto.frame_max))
        if conn._flush_handle is None:
            conn._schedule_flush()
        seq = self._seq = self._seq + 1
        runs = self._unconfirmed
        if runs:
            last = runs[-1]
            if last[2] is on_confirm and last[1] == seq - 1:
                last[1] = seq
                return
        runs.append([seq, seq, on_confirm])

    def _confirm(self, tag: int, multiple: bool, ok: bool) -> None:
        runs = self._unconfirmed
        if multiple:
            while runs and runs[0][0] <= tag:
                run = runs[0]
                first, last, waiting = run
                if last <= tag:
                    runs.popleft()
                    _settle(waiting, ok, last - first + 1)
                else:
                    run[0] = tag + 1
                    _settle(waiting, ok, tag - first + 1)
                    return
            return
        for i, run in enumerate(runs):  # one tag: usually in the first run
            first, last, waiting = run
            if tag < first:
                return
            if tag > last:
                continue
            if first == last:
                del runs[i]
            elif tag == first:
                run[0] = tag + 1
            elif tag == last:
                run[1] = tag - 1
            else:  # out of order, in the middle of a run: split it
                run[1] = tag - 1
                runs.insert(i + 1, [tag + 1, last, waiting])
            _settle(waiting, ok, 1)
            return

    # -- consuming -------------------------------------------------------------------------------
    async def consume(self, queue: str, on_delivery: OnDelivery, *, prefetch: int = 0,
                      on_cancel: OnCancel | None = None, no_ack: bool = False,
                      exclusive: bool = False, arguments: dict | None = None,
                      tag: str = "") -> str:
        """basic.consume (after basic.qos ``prefetch`` when given); returns the consumer tag.
        ``on_delivery`` runs for each delivery; ``on_cancel(tag, error)`` when the broker cancels
        the consumer (error None) or the channel or connection is lost (the error)."""
        if prefetch:
            await self.call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        tag = tag or f"ctag-{self.number}-{next(self._tags)}"
        self._consumers[tag] = (on_delivery, on_cancel)  # deliveries may follow consume-ok at once
        if no_ack:
            self._no_ack.add(tag)
        try:
            await self.call(method(commands.Basic.Consume, queue=queue, consumer_tag=tag, no_ack=no_ack,
                                   exclusive=exclusive, arguments=arguments or {}),
                            commands.Basic.ConsumeOk)
        except BaseException:
            self._consumers.pop(tag, None)
            raise
        return tag

    async def cancel(self, tag: str) -> None:
        await self.call(commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)
        self._consumers.pop(tag, None)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        if self.closing:
            return  # the broker requeues what was not acked on a closed channel
        if multiple:
            self.flush_acks()
            self._settled_upto(delivery_tag)
            self.connection._send(codec.ack_frame(self.number, delivery_tag, True))
            return
        if self.error is not None:
            raise self.error
        acks = self._acks
        if not acks:
            self.connection._ack_later(self)
        acks.add(delivery_tag)

    def flush_acks(self) -> None:
        """Send the acks waiting since the last write: one basic.ack(multiple) for those that are
        the oldest unsettled deliveries, one basic.ack each for the rest."""
        if not self._acks or self.error is not None or self.closing:
            self._acks.clear()
            return
        acks, self._acks = self._acks, set()
        out = self._outstanding
        top = count_prefix = 0
        while out:
            tag = next(iter(out))
            if tag not in acks:
                break
            out.popitem(last=False)
            acks.discard(tag)
            top, count_prefix = tag, count_prefix + 1
        frames = [codec.ack_frame(self.number, top, count_prefix > 1)] if count_prefix else []
        for tag in sorted(acks):
            out.pop(tag, None)
            frames.append(codec.ack_frame(self.number, tag, False))
        self.connection._send(frames)

    def _settled_upto(self, tag: int) -> None:
        out = self._outstanding
        while out and next(iter(out)) <= tag:
            out.popitem(last=False)

    def nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        if self.closing:
            return
        self.flush_acks()
        if multiple:
            self._settled_upto(delivery_tag)
        else:
            self._outstanding.pop(delivery_tag, None)
        self.connection._send(codec.method_frame(self.number, commands.Basic.Nack(
            delivery_tag=delivery_tag, multiple=multiple, requeue=requeue)))

    def reject(self, delivery_tag: int, requeue: bool = True) -> None:
        if self.closing:
            return
        self.flush_acks()
        self._outstanding.pop(delivery_tag, None)
        self.connection._send(codec.method_frame(self.number, commands.Basic.Reject(delivery_tag=delivery_tag,
                                                                  requeue=requeue)))

    async def get(self, queue: str, no_ack: bool = False) -> Delivery | None:
        """basic.get: the message (``message_count`` = how many are left) or None (empty)."""
        got = await self.call(method(commands.Basic.Get, queue=queue, no_ack=no_ack),
                              Delivery, commands.Basic.GetEmpty)
        if not isinstance(got, Delivery):
            return None
        if no_ack:
            self._outstanding.pop(got.delivery_tag, None)  # nothing to settle
        return got

    # -- from the connection------------------------------------------------------------------------
    def _method(self, m) -> None:
        if isinstance(m, commands.Basic.Cancel):  # consumer_cancel_notify
            entry = self._consumers.pop(m.consumer_tag, None)
            if not m.nowait:
                self.connection._send(codec.method_frame(self.number, commands.Basic.CancelOk(consumer_tag=m.consumer_tag)))
            if entry is not None and entry[1] is not None:
                entry[1](m.consumer_tag, None)
        elif isinstance(m, commands.Channel.Close):
            self.connection._send(codec.method_frame(self.number, commands.Channel.CloseOk()))
            self._closed(ClientError(f"channel closed by the broker: {m.reply_code} {m.reply_text}",
                                   m.reply_code))
        elif isinstance(m, commands.Channel.Flow):
            self.connection._send(codec.method_frame(self.number, commands.Channel.FlowOk(active=m.active)))
        else:
            self._reply(m)

    def _content(self, d: Delivery) -> None:
        if d.consumer_tag:
            if d.consumer_tag not in self._no_ack:
                self._outstanding[d.delivery_tag] = None
            entry = self._consumers.get(d.consumer_tag)
            if entry is not None:
                entry[0](d)
        elif d.message_count is not None:
            self._outstanding[d.delivery_tag] = None
            self._reply(d)
        elif self.on_return is not None:
            self.on_return(d)

    def _reply(self, m) -> None:
        if not self._rpc:
            self.connection._fail(ClientError(f"unexpected {type(m).__name__} on channel {self.number}"))
            return
        replies, fut = self._rpc.popleft()
        if not isinstance(m, replies):
            error = ClientError(f"expected {' or '.join(r.__name__ for r in replies)}, got "
                              f"{type(m).__name__}")
            _fail(fut, error)
            self.connection._fail(error)
        elif not fut.done():
            fut.set_result(m)

    def _closed(self, error: ClientError) -> None:
        if self.error is not None:
            return
        self.error = error
        self.connection.channels.pop(self.number, None)
        self.connection.protocol.forget(self.number)
        while self._rpc:
            _fail(self._rpc.popleft()[1], error)
        pending, self._unconfirmed = self._unconfirmed, deque()
        for first, last, waiting in pending:
            if isinstance(waiting, asyncio.Future):
                _fail(waiting, error)
            else:
                waiting(False, last - first + 1)
        consumers, self._consumers = self._consumers, {}
        for tag, (_deliver, on_cancel) in consumers.items():
            if on_cancel is not None:
                on_cancel(tag, error)
