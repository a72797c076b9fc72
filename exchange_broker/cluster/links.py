"""The node's links to other nodes: one :class:`~exchange_broker.client.Connection` per (node
address, vhost), opened when first needed and opened again after it was lost, and one
:class:`Forwarder` per link: the confirm-mode channel publishes for queues another node leads go
through (docs/cluster-design.md, step 3).

A forwarded publish is confirmed to its publisher only when the leader acked it: the
:class:`Forwarder` answers each publish with a :class:`~exchange_broker.core.ports.Waiter` that
fires True on the leader's ack, and False on its nack, on a basic.return (forwards are mandatory:
a leader that no longer has the queue returns the message, then acks it, and that ack must not
reach the publisher), when the channel or link is lost first, or when the link cannot be opened.
The publishes to one queue written to the link together share their Waiter: it fires True only
once the leader acked each of them, False if it nacked or returned one (the publisher gets nacks
for the batch and publishes them again: nothing is acked that the leader did not take).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from functools import partial
from typing import Callable, NamedTuple

from exchange_broker.client import Channel, ClientError, Connection
from exchange_broker.core.ports import Waiter
from exchange_broker.protocol import codec

log = logging.getLogger("exchange_broker.cluster")

FLOW_HIGH = 4000   # forwards awaiting the leader's confirm before publishers are paused
FLOW_LOW = 1000    # ... and read again below this
RETRY_AFTER = 0.5  # s: after a failed open, callers get that failure again until this passed


_tasks: set[asyncio.Task] = set()


def spawn(coro) -> asyncio.Task:
    """A task on the running loop, referenced until it ends (asyncio keeps only weak ones)."""
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


class Address(NamedTuple):
    host: str
    port: int


class Links:
    """Links of this node, by (address, vhost); ``user``/``password`` log in on every node."""

    def __init__(self, user: str, password: str, *, name: str = "exchange-broker node",
                 heartbeat: float = 10.0) -> None:
        self.user = user
        self.password = password
        self.name = name
        self.heartbeat = heartbeat
        self._links: dict[tuple, Connection] = {}
        self._opening: dict[tuple, asyncio.Task] = {}
        self._forwarders: dict[tuple, Forwarder] = {}
        self._failed: dict[tuple, tuple[float, ClientError]] = {}  # key -> (when, why)
        self.closed = False

    async def link(self, address: Address, vhost: str) -> Connection:
        """The open link to ``address`` for ``vhost`` (opened now if there is none)."""
        if self.closed:
            raise ClientError("this node's links are closed")
        key = (address, vhost)
        link = self._links.get(key)
        if link is not None and link.error is None:
            return link
        task = self._opening.get(key)
        if task is None:
            failed = self._failed.get(key)
            now = asyncio.get_running_loop().time()
            if failed is not None and now - failed[0] < RETRY_AFTER:
                raise failed[1]  # a node that just refused is not dialled again at once
            task = self._opening[key] = spawn(self._open(key))
        return await asyncio.shield(task)

    async def _open(self, key: tuple) -> Connection:
        (host, port), vhost = key
        try:
            link = await Connection.open(host, port, self.user, self.password, vhost,
                                         name=f"{self.name} -> {host}:{port}", heartbeat=self.heartbeat,
                                         product="exchange-broker cluster link")
        except ClientError as exc:
            if key not in self._failed:
                log.warning("link to %s:%s (vhost %s) cannot be opened: %s", host, port, vhost, exc)
            self._failed[key] = (asyncio.get_running_loop().time(), exc)
            raise
        finally:
            self._opening.pop(key, None)
        if self._failed.pop(key, None) is not None:
            log.info("link to %s:%s (vhost %s) open again", host, port, vhost)
        if self.closed:
            await link.close()
            raise ClientError("this node's links are closed")
        self._links[key] = link
        link.on_lost.append(partial(self._lost, key, link))
        return link

    def _lost(self, key: tuple, link: Connection, error: ClientError) -> None:
        if self._links.get(key) is link:
            del self._links[key]
        log.info("link %s lost: %s", link.name, error)

    def forwarder(self, address: Address, vhost: str) -> "Forwarder":
        key = (address, vhost)
        fw = self._forwarders.get(key)
        if fw is None:
            fw = self._forwarders[key] = Forwarder(self, address, vhost)
        return fw

    async def close(self) -> None:
        self.closed = True
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()


class _Batch:
    """The forwards of one event-loop turn to one (exchange, routing key): one Waiter for all of
    them, fired once the leader confirmed each (True only if it acked every one and returned
    none). The link channel tracks the batch's publishes as one run and calls it with each
    confirm's count of them."""
    __slots__ = ("forwarder", "key", "gen", "waiter", "pending", "ok", "shorts")

    def __init__(self, forwarder: "Forwarder", key: tuple, gen: int) -> None:
        self.forwarder = forwarder
        self.key = key          # (exchange, routing key)
        self.gen = gen          # the link's flush count when it opened: it takes publishes until the next write
        self.waiter = Waiter()
        self.pending = 0        # sent (or waiting to be), not yet confirmed
        self.ok = True
        self.shorts = (codec.short_cached(key[0]), codec.short_cached(key[1]))  # as framed

    def __call__(self, ok: bool, count: int = 1) -> None:
        if not ok:
            self.ok = False
        self.pending -= count
        fw = self.forwarder
        fw.in_flight -= count
        if self.pending <= 0:
            fw._done(self)


class Forwarder:
    """Publishes to the default exchange of one (node, vhost), in order, with confirms.

    One confirm tracker: the publishes of one event-loop turn to one queue share a :class:`_Batch`
    (one Waiter, so the publisher's channel tracks them as one run, and one run of the link
    channel) that the leader's confirms count down: no per-message object or callback."""

    def __init__(self, links: Links, address: Address, vhost: str) -> None:
        self.links = links
        self.address = address
        self.vhost = vhost
        self.channel: Channel | None = None
        self.backlog: deque[tuple] = deque()  # (batch, exchange, routing key, properties, body) until the channel opens
        self.batches: dict[tuple, _Batch] = {}  # (exchange, routing key) -> the batch publishes join now
        self.outstanding: set[_Batch] = set()   # batches not yet confirmed in full
        self.in_flight = 0                      # forwards not yet confirmed
        self._opening: asyncio.Task | None = None
        self.on_drained: list[Callable[[], None]] = []  # paused publishers' queues (flow)

    def publish(self, routing_key: str, properties: bytes, body: bytes, exchange: str = "") -> Waiter:
        """Forward one message (to the default exchange unless told: a delayed-message exchange's
        publish goes to that exchange on the node that fires them); the waiter fires with the
        leader's confirm of it and of the others of its batch (see module doc)."""
        ch = self.channel
        ready = ch is not None and ch.error is None and not self.backlog
        gen = ch.connection.flushes if ready else -1
        key = (exchange, routing_key)
        batch = self.batches.get(key)
        if batch is None or batch.gen != gen or not batch.ok:
            batch = self.batches[key] = _Batch(self, key, gen)
            self.outstanding.add(batch)
        batch.pending += 1
        self.in_flight += 1
        if ready:
            try:  # raw properties and body go out as they came in, framed once, by the channel
                ch.publish_tracked(batch.shorts[0], batch.shorts[1], properties, body, batch)
            except ClientError:
                batch(False)
        else:
            self.backlog.append((batch, exchange, routing_key, properties, body))
            self._open()
        return batch.waiter

    def _open(self) -> None:
        if self._opening is None:
            self._opening = spawn(self._open_channel())

    async def _open_channel(self) -> None:
        try:
            link = await self.links.link(self.address, self.vhost)
            ch = await link.channel()
            ch.on_return = self._returned
            await ch.confirm_select()
        except (ClientError, OSError) as exc:
            self._opening = None
            log.debug("forwarding to %s:%s (vhost %s) failed: %s", *self.address, self.vhost, exc)
            self._fail_backlog()
            return
        self._opening = None
        self.channel = ch
        while self.backlog and ch.error is None:
            batch, exchange, routing_key, properties, body = self.backlog.popleft()
            try:
                ch.publish(exchange, routing_key, properties, body, mandatory=True, on_confirm=batch)
            except ClientError:
                batch(False)
        if self.backlog:  # lost again while sending
            self._fail_backlog()

    def _fail_backlog(self) -> None:
        failed, self.backlog = self.backlog, deque()
        for entry in failed:
            entry[0](False)

    def _done(self, batch: _Batch) -> None:
        self.outstanding.discard(batch)
        if self.batches.get(batch.key) is batch:
            del self.batches[batch.key]
        batch.waiter.fire(batch.ok)
        if self.on_drained and self.in_flight < FLOW_LOW:
            waiting, self.on_drained = self.on_drained, []
            for fn in waiting:
                fn()

    def _returned(self, d) -> None:
        """basic.return of a forward (the leader has no such queue). Returns come before the
        confirm of the same publish, so the returned one is in a batch not yet confirmed in full:
        every such batch to that routing key fails (its publishers get nacks and publish again;
        a return is rare, and acking a returned message would lose it)."""
        for batch in self.outstanding:
            if batch.key == (d.exchange, d.routing_key) and batch.ok:
                batch.ok = False
        log.info("forward to queue '%s' on %s:%s returned: %s %s", d.routing_key, *self.address,
                 d.reply_code, d.reply_text)
