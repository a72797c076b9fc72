"""Federation links (RabbitMQ's federation plugin): one mover per federated exchange or queue
and upstream.

* :class:`ExchangeLink`: on the upstream, a queue ``federation:X:<this broker>`` bound to the
  upstream exchange with the binding keys of the local exchange X, kept in step as they change
  (checked every ``SYNC_INTERVAL`` s); what arrives there is published into X here.
* :class:`QueueLink`: consumes from the upstream queue of the same name (or ``queue``) only while
  the local queue has consumers and no message ready for them, and puts what it gets into it.

A message's ``user_id`` is removed unless the upstream has ``trust-user-id`` (RabbitMQ's
federation: this broker cannot know the upstream checked it). Each message brought over gets an
``x-received-from`` entry (``uri``, ``exchange``/``queue``,
``redelivered``, ``cluster-name`` of the upstream, as RabbitMQ); a message whose entries already
name this broker (it went round a cycle) or that made ``max-hops`` hops is dropped.
"""

from __future__ import annotations

import asyncio
import json
import re

from pamqp import commands

from exchange_broker.movers import uris
from exchange_broker.movers.amqp import Delivery, LinkError, LocalBroker
from exchange_broker.movers.endpoints import close_quietly, open_first
from exchange_broker.movers.federation_config import Upstream
from exchange_broker.movers.forwarding import Forwarding
from exchange_broker.movers.supervisor import Status
from exchange_broker.protocol import codec
from exchange_broker.protocol.names import method

SYNC_INTERVAL = 0.5  # seconds between checks of the local bindings / the local queue's demand


class _Link:
    kind = ""

    def __init__(self, broker, vhost: str, name: str, upstream: Upstream, local: LocalBroker) -> None:
        self.broker, self.vhost, self.name, self.upstream, self.local = broker, vhost, name, upstream, local
        self.reconnect_delay = upstream.reconnect_delay
        self.moving = Forwarding(upstream.ack_mode, upstream.prefetch)
        self.up_uri = ""
        self.up_name = ""  # the upstream's cluster_name

    async def run(self, status: Status) -> None:
        up = down = None
        label = f"Federation link {self.kind} {self.name} <- {self.upstream.name}"
        try:
            up, self.up_uri = await open_first(self.upstream.uris, self.vhost, self.local, label)
            self.up_name = up.cluster_name
            down, _ = await open_first(("amqp://",), self.vhost, self.local, label)
            await self._link(up, down, status)
        finally:
            await close_quietly(up)
            await close_quietly(down)

    def _stamp(self, d: Delivery, where: dict) -> bytes | None:
        props = codec.parse_properties(d.properties)
        headers = dict(props.get("headers") or {})
        seen = list(headers.get("x-received-from") or [])
        mine = self.broker.cluster_name
        if len(seen) >= self.upstream.max_hops or any(
                isinstance(e, dict) and e.get("cluster-name") == mine for e in seen):
            return None
        seen.append({"uri": uris.redact(self.up_uri), **where, "redelivered": d.redelivered,
                     "cluster-name": self.up_name})
        headers["x-received-from"] = seen
        props["headers"] = headers
        if not self.upstream.trust_user_id:  # the upstream's word for who published: not taken
            props.pop("user_id", None)
        return codec.encode_properties(props)

    def info(self) -> dict:
        return {"type": self.kind, "upstream": self.upstream.name, "uri": uris.redact(self.up_uri or
                                                                                     self.upstream.uris[0]),
                "local_connection": "", "forwarded": self.moving.forwarded, "dropped": self.moving.dropped}


class ExchangeLink(_Link):
    kind = "exchange"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.bound: set[tuple[str, str]] = set()  # (routing key, arguments as JSON) bound upstream
        self.up_exchange = self.upstream.exchange or self.name
        self.queue = ""

    async def _link(self, up, down, status: Status) -> None:
        ex = self._local_exchange()
        ch = await up.channel()
        await ch.call(method(commands.Exchange.Declare, exchange=self.up_exchange, exchange_type=ex.type,
                             durable=ex.durable), commands.Exchange.DeclareOk)
        args = {}
        if self.upstream.expires is not None:
            args["x-expires"] = int(self.upstream.expires)
        if self.upstream.message_ttl is not None:
            args["x-message-ttl"] = int(self.upstream.message_ttl)
        # RabbitMQ's "federation: X -> name", in a name any AMQP client can type
        self.queue = re.sub(r"[^a-zA-Z0-9_.:-]", "_", f"federation:{self.up_exchange}:{self.broker.cluster_name}")
        await ch.call(method(commands.Queue.Declare, queue=self.queue, durable=True, arguments=args),
                      commands.Queue.DeclareOk)
        await self._sync(ch)
        sync = asyncio.get_running_loop().create_task(self._keep_in_step(ch))
        try:
            await self.moving.run(up, down, await up.channel(), await down.channel(), self.queue,
                                  target=lambda d: (self.name, d.routing_key),
                                  properties=lambda d: self._stamp(d, {"exchange": self.up_exchange}),
                                  on_running=status.running)
        finally:
            sync.cancel()

    def _local_exchange(self):
        vh = self.broker.vhosts.get(self.vhost)
        ex = vh.exchanges.get(self.name) if vh is not None else None
        if ex is None:
            raise LinkError(f"no exchange '{self.name}' in vhost '{self.vhost}' here")
        return ex

    def _wanted(self) -> set[tuple[str, str]]:
        return {(rk, json.dumps(args or {}, sort_keys=True, default=str))
                for _dest, rk, args in self._local_exchange().index.bindings()}

    async def _sync(self, ch) -> None:
        wanted = self._wanted()
        for rk, args in wanted - self.bound:
            await ch.call(method(commands.Queue.Bind, queue=self.queue, exchange=self.up_exchange, routing_key=rk,
                                 arguments=json.loads(args)), commands.Queue.BindOk)
            self.bound.add((rk, args))
        for rk, args in self.bound - wanted:
            await ch.call(method(commands.Queue.Unbind, queue=self.queue, exchange=self.up_exchange,
                                 routing_key=rk, arguments=json.loads(args)), commands.Queue.UnbindOk)
            self.bound.discard((rk, args))

    async def _keep_in_step(self, ch) -> None:
        try:
            while True:
                await asyncio.sleep(SYNC_INTERVAL)
                await self._sync(ch)
        except LinkError as exc:
            self.moving.fail(exc)

    def info(self) -> dict:
        return {**super().info(), "exchange": self.name, "upstream_exchange": self.up_exchange,
                "queue": self.queue}


class QueueLink(_Link):
    kind = "queue"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.up_queue = self.upstream.queue or self.name

    async def _link(self, up, down, status: Status) -> None:
        ch = await up.channel()
        await ch.call(method(commands.Queue.Declare, queue=self.up_queue, passive=True), commands.Queue.DeclareOk)
        watch = asyncio.get_running_loop().create_task(self._follow_demand())
        try:
            await self.moving.run(up, down, ch, await down.channel(), self.up_queue,
                                  target=lambda d: ("", self.name),
                                  properties=lambda d: self._stamp(d, {"queue": self.up_queue}),
                                  on_running=status.running, consume=False)
        finally:
            watch.cancel()

    def _demand(self) -> bool:
        """The local queue has consumers and nothing ready for them."""
        vh = self.broker.vhosts.get(self.vhost)
        q = vh.queues.get(self.name) if vh is not None else None
        if q is None:
            raise LinkError(f"no queue '{self.name}' in vhost '{self.vhost}' here")
        # the link's own loopback publishing connection is no consumer; real consumers are
        return bool(q.consumers) and q.message_count == 0

    async def _follow_demand(self) -> None:
        try:
            while True:
                if self._demand():
                    await self.moving.resume()
                else:
                    await self.moving.pause()
                await asyncio.sleep(SYNC_INTERVAL / 5)
        except LinkError as exc:
            self.moving.fail(exc)

    def info(self) -> dict:
        return {**super().info(), "queue": self.name, "upstream_queue": self.up_queue}
