"""The node's links to other nodes: one :class:`~exchange_broker.client.Connection` per (node
address, vhost), opened when first needed and opened again after it was lost, and one
:class:`Forwarder` per link: the confirm-mode channel publishes for queues another node leads go
through (docs/cluster-design.md, step 3).

A forwarded publish is confirmed to its publisher only when the leader acked it: the
:class:`Forwarder` answers each publish with a :class:`~exchange_broker.core.ports.Waiter` that
fires True on the leader's ack, and False on its nack, on a basic.return (forwards are mandatory:
a leader that no longer has the queue returns the message, then acks it, and that ack must not
reach the publisher), when the channel or link is lost first, or when the link cannot be opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from functools import partial
from typing import Callable, NamedTuple

from exchange_broker.client import Channel, ClientError, Connection
from exchange_broker.core.ports import Waiter

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


class _Forward:
    """One forwarded message; called with the leader's confirm (the channel's ``on_confirm``)."""
    __slots__ = ("forwarder", "routing_key", "properties", "body", "waiter", "returned", "exchange")

    def __init__(self, forwarder: "Forwarder", routing_key: str, properties: bytes, body: bytes,
                 waiter: Waiter, exchange: str = "") -> None:
        self.forwarder = forwarder
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.waiter = waiter
        self.returned = False

    def __call__(self, ok: bool) -> None:
        self.forwarder._confirmed(self, ok)


class Forwarder:
    """Publishes to the default exchange of one (node, vhost), in order, with confirms."""

    def __init__(self, links: Links, address: Address, vhost: str) -> None:
        self.links = links
        self.address = address
        self.vhost = vhost
        self.channel: Channel | None = None
        self.backlog: deque[_Forward] = deque()     # waiting for the channel to open
        self.outstanding: deque[_Forward] = deque()  # sent, awaiting the leader's confirm
        self._opening: asyncio.Task | None = None
        self.on_drained: list[Callable[[], None]] = []  # paused publishers' queues (flow)

    @property
    def in_flight(self) -> int:
        return len(self.backlog) + len(self.outstanding)

    def publish(self, routing_key: str, properties: bytes, body: bytes, exchange: str = "") -> Waiter:
        """Forward one message (to the default exchange unless told: a delayed-message exchange's
        publish goes to that exchange on the node that fires them); the waiter fires with the
        leader's confirm (see module doc)."""
        fwd = _Forward(self, routing_key, properties, body, Waiter(), exchange)
        ch = self.channel
        if ch is not None and ch.error is None and not self.backlog:
            self._send(ch, fwd)
        else:
            self.backlog.append(fwd)
            self._open()
        return fwd.waiter

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
            self._send(ch, self.backlog.popleft())
        if self.backlog:  # lost again while sending
            self._fail_backlog()

    def _fail_backlog(self) -> None:
        failed, self.backlog = self.backlog, deque()
        for fwd in failed:
            fwd.waiter.fire(False)
        self._check_drained()

    def _send(self, ch: Channel, fwd: _Forward) -> None:
        """Raw properties and body go out as they came in (framed once, by the channel); the
        channel's confirm tracking calls ``fwd`` with the outcome."""
        try:
            ch.publish(fwd.exchange, fwd.routing_key, fwd.properties, fwd.body, mandatory=True, on_confirm=fwd)
        except ClientError:
            fwd.waiter.fire(False)
            return
        self.outstanding.append(fwd)

    def _confirmed(self, fwd: _Forward, ok: bool) -> None:
        out = self.outstanding
        if out and out[0] is fwd:
            out.popleft()
        else:
            try:
                out.remove(fwd)
            except ValueError:
                pass
        fwd.waiter.fire(ok and not fwd.returned)
        self._check_drained()

    def _returned(self, d) -> None:
        """basic.return of a forward (the leader has no such queue): the first outstanding
        forward with that routing key and body is the one (returns come in publish order)."""
        for fwd in self.outstanding:
            if not fwd.returned and fwd.routing_key == d.routing_key and \
                    (fwd.body is d.body or fwd.body == d.body):
                fwd.returned = True
                log.info("forward to queue '%s' on %s:%s returned: %s %s", d.routing_key,
                            *self.address, d.reply_code, d.reply_text)
                return

    def _check_drained(self) -> None:
        if self.on_drained and self.in_flight < FLOW_LOW:
            waiting, self.on_drained = self.on_drained, []
            for fn in waiting:
                fn()
