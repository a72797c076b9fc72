"""Relaying another node's deliveries to local consumers (docs/cluster-design.md, step 4).

For each local consumer of a queue another node leads, a :class:`Relay` holds a consumer on the
leader, on a link channel of its own (basic.qos = the local consumer's prefetch), and hands each
delivery to the local consumer as a local :class:`Message` (the client sees the local channel's
delivery tags). :class:`TagMap` remembers, for each relayed message still unsettled, which link
channel it came on and with which delivery tag, so that the client's ack, nack or reject goes to
the leader: ack -> basic.ack, requeue -> basic.nack requeue, reject without requeue ->
basic.reject (the leader dead-letters).

Once a link channel is gone (lost link, channel error, the leader's basic.cancel), its delivery
tags mean nothing: the leader requeued what was unacked there, and settling such a message later
sends nothing (a tag of a dead channel is never sent on a live one). :class:`Getter` is basic.get
over the link, on one channel per remote queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from exchange_broker.queue_types.ready import RUN_BYTES, RUN_COUNT, take_run
from exchange_broker.client import Channel, ClientError
from exchange_broker.cluster.links import spawn
from exchange_broker.core.message import Message
from exchange_broker.protocol import codec

log = logging.getLogger("exchange_broker.cluster")

NO_ACK_WINDOW = 256  # leader's prefetch for a no-ack local consumer (relayed messages ack at once)
RETRY_LINK = 0.5  # seconds between attempts to reach a leader for a waiting consumer

ACK, NACK, REJECT = 0, 1, 2


def quick(properties: bytes) -> tuple[bool, int]:
    """(persistent, priority) read from raw properties."""
    dm, prio, _flags = codec.quick_properties(properties)
    return dm == 2, prio


def relayed_message(d, queue, properties: bytes, persistent: bool, priority: int) -> Message:
    """A local Message for a delivery from the leader (raw properties and body kept)."""
    msg = Message(d.exchange, d.routing_key, properties, d.body, persistent, priority)
    msg.redelivered = d.redelivered
    msg.queue = queue
    return msg


class Holder:
    """What relayed messages came through: a link channel and a count of unsettled ones."""

    channel: Channel | None = None
    outstanding = 0

    def settled(self) -> None:
        """The last unsettled message may have gone."""


class TagMap:
    """Relayed messages not yet settled -> (holder, the leader's delivery tag)."""

    def __init__(self) -> None:
        self.entries: dict[Message, tuple[Holder, Channel, int]] = {}

    def add(self, msg: Message, holder: Holder, channel: Channel, tag: int) -> None:
        self.entries[msg] = (holder, channel, tag)
        holder.outstanding += 1

    def __contains__(self, msg: Message) -> bool:
        return msg in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def settle(self, msg: Message, kind: int, requeue: bool = True) -> None:
        """Tell the leader (ack, nack or reject) if the channel it came on still lives."""
        entry = self.entries.pop(msg, None)
        if entry is None:
            return
        holder, ch, tag = entry
        holder.outstanding -= 1
        if ch.error is None:
            try:
                if kind == ACK:
                    ch.ack(tag)
                elif kind == NACK:
                    ch.nack(tag, requeue=requeue)
                else:
                    ch.reject(tag, requeue=requeue)
            except ClientError:
                pass  # lost meanwhile: the leader requeued it
        holder.settled()

    def forget(self, holder: Holder) -> None:
        """The holder's channel is gone: drop its entries (nothing can be settled there)."""
        for msg in [m for m, (h, _ch, _tag) in self.entries.items() if h is holder]:
            del self.entries[msg]
        holder.outstanding = 0


async def _close(ch: Channel | None) -> None:
    if ch is not None and ch.error is None:
        try:
            await ch.close()
        except ClientError:
            pass


class Relay(Holder):
    """One local consumer fed from a consumer on the leader."""

    def __init__(self, queue, consumer) -> None:
        self.queue = queue
        self.consumer = consumer
        self.remote_tag: str | None = None
        self.buffer: deque[Message] = deque()  # received, not yet handed to the local consumer
        self.stopping = False  # the local consumer is gone (remove_consumer)
        self.dead = False      # the link channel or the remote consumer is gone
        self.task: asyncio.Task | None = None

    @property
    def prefetch(self) -> int:
        c = self.consumer
        if c.no_ack:
            return NO_ACK_WINDOW
        channel = getattr(c, "channel", None)
        return getattr(c, "prefetch", 0) or getattr(channel, "global_prefetch", 0) or 0

    def start(self) -> None:
        if self.stopping or self.dead:
            return
        self.task = spawn(self._start())

    async def _start(self) -> None:
        q, c = self.queue, self.consumer
        address = q.address
        try:
            link = await q.links.link(address, q.vhost)
        except (ClientError, OSError) as exc:
            # the leader cannot be reached (it is stopping, or dead and not yet replaced): the local
            # consumer waits, and the relay tries again; when the queue moves, ``retarget`` cancels
            # it (basic.cancel) and the client consumes again through the new leader
            log.debug("relaying %s: the leader at %s:%s cannot be reached (%s); trying again", q.describe(),
                      *address, exc)
            asyncio.get_running_loop().call_later(RETRY_LINK, self.start)
            return
        try:
            ch = await link.channel()
            if self.stopping or self.dead:
                # stopped, or gone (the queue moved: ``retarget``) while the link or the channel
                # opened: a consumer started now would hold up to its prefetch of the leader's
                # messages unacked, on a channel nobody closes, for a relay that drops deliveries
                await _close(ch)
                return
            self.channel = ch
            self.remote_tag = await ch.consume(
                q.name, self._on_delivery, prefetch=self.prefetch, on_cancel=self._on_cancel,
                exclusive=c.exclusive, arguments=dict(c.arguments or {}))
        except (ClientError, OSError) as exc:
            if not self.dead:
                log.warning("relaying %s: consume on %s:%s failed: %s", q.describe(), *address, exc)
            self.gone()
            return
        if self.stopping:
            await self._stop_remote()

    # -- from the leader ---------------------------------------------------------------------------
    _props = b""            # the last delivery's properties, and (persistent, priority) read from them
    _quick = (False, 0)
    _pump_queued = False   # a pump waits for the end of the link's read

    def _on_delivery(self, d) -> None:
        """A delivery from the leader: buffered; the deliveries of one read of the link go to the
        local consumer as one run at its end (``_after_read``). Properties equal to the last
        message's become that same object, so the local channel frames the run from one
        template."""
        if self.dead:
            return
        props = d.properties
        if props == self._props:
            props = self._props
        else:
            self._props, self._quick = props, quick(props)
        msg = relayed_message(d, self.queue, props, *self._quick)
        q = self.queue
        q.tags.entries[msg] = (self, self.channel, d.delivery_tag)  # TagMap.add, inline (per message)
        self.outstanding += 1
        self.buffer.append(msg)
        if not self.stopping and not self._pump_queued:
            self._pump_queued = True
            self.channel.connection.after_read.append(self._after_read)

    def _after_read(self) -> None:
        self._pump_queued = False
        if not self.dead and not self.stopping and self.buffer:
            self.pump()

    def _on_cancel(self, _tag: str, error: ClientError | None) -> None:
        """The leader cancelled the consumer (queue deleted there) or the channel/link is lost."""
        if error is not None:
            log.info("relay of %s lost: %s", self.queue.describe(), error)
        self.gone()

    def gone(self) -> None:
        """Nothing more comes from the leader: cancel the local consumer as a deleted queue does
        (basic.cancel to clients that asked for it); unsettled tags are dropped, and the link
        channel is closed (the leader requeues what was unacked on it)."""
        if self.dead:
            return
        self.dead = True
        self.buffer.clear()
        self.queue.tags.forget(self)
        ch, self.channel = self.channel, None
        if ch is not None and ch.error is None:
            spawn(_close(ch))
        self.queue.relay_gone(self)

    # -- to the local consumer ---------------------------------------------------------------------
    def pump(self) -> None:
        """Hand buffered deliveries to the local consumer while it has credit."""
        c, buf, q = self.consumer, self.buffer, self.queue
        run_sink = c.deliver_run
        while buf and c.active and not self.stopping and c.can_take():
            if run_sink is not None:  # as many as it may take, at once
                run = take_run(buf, min(RUN_COUNT, c.room()), RUN_BYTES)[0]
                q.stats_delivered += len(run)
                run_sink(run)
            else:
                q.stats_delivered += 1
                c.deliver(buf.popleft())

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """The local consumer was cancelled (or its channel closed): cancel on the leader; the
        link channel closes once the client settled what it holds (acks after basic.cancel are
        allowed), the buffer goes back to the leader."""
        if self.stopping:
            return
        self.stopping = True
        if self.dead or self.remote_tag is None:
            return  # never consumed (``_start`` finishes the stop) or already gone
        spawn(self._stop_remote())

    async def _stop_remote(self) -> None:
        ch = self.channel
        if ch is None or ch.error is not None:
            return
        try:
            await ch.cancel(self.remote_tag)
        except ClientError:
            return
        tags = self.queue.tags
        for msg in list(self.buffer):  # never delivered locally: back to the leader, in order
            tags.settle(msg, NACK, True)
        self.buffer.clear()
        self.settled()

    def settled(self) -> None:
        if self.stopping and not self.buffer and self.outstanding <= 0 and not self.dead:
            self.dead = True
            ch, self.channel = self.channel, None
            if ch is not None and ch.error is None:
                spawn(_close(ch))


class Getter(Holder):
    """basic.get over the link: one link channel per remote queue, (re)opened when needed."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self._lock = asyncio.Lock()

    async def _channel(self) -> Channel:
        async with self._lock:  # concurrent gets open one channel
            ch = self.channel
            if ch is None or ch.error is not None:
                if ch is not None:
                    self.queue.tags.forget(self)
                q = self.queue
                link = await q.links.link(q.address, q.vhost)
                ch = self.channel = await link.channel()
            return ch

    async def fetch(self) -> Message | None:
        """One basic.get on the leader: the message (unacked there until settled) or None."""
        q = self.queue
        ch = await self._channel()
        d = await ch.get(q.name)
        q.last_count = d.message_count if d is not None else 0
        if d is None:
            return None
        msg = relayed_message(d, q, d.properties, *quick(d.properties))
        q.tags.add(msg, self, ch, d.delivery_tag)
        return msg

    async def close(self) -> None:
        ch, self.channel = self.channel, None
        await _close(ch)
