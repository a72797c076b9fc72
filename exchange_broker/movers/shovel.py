"""A dynamic shovel: consume from a source queue (or a queue bound to a source exchange), publish
to a destination, acknowledge at the source as ``ack-mode`` says.

``on-confirm`` (the default) acks a message at the source only once the destination confirmed
it, so a failure of either end loses nothing: what was not acked is redelivered by the source
when the shovel reconnects (at least once: a message the destination stored but could not
confirm before it went away comes again). ``on-publish`` acks once published, ``no-ack``
consumes without acks. ``delete-after`` (``queue-length``: the messages there at start; a count)
ends the shovel once that many were moved; its parameter is then removed, as RabbitMQ does.
"""

from __future__ import annotations

import datetime
import time

from pamqp import commands

from exchange_broker.movers import uris
from exchange_broker.movers.amqp import Delivery, LocalBroker
from exchange_broker.movers.endpoints import check_exchange, close_quietly, ensure_queue, open_first
from exchange_broker.movers.forwarding import Forwarding
from exchange_broker.movers.shovel_config import ShovelConfig
from exchange_broker.movers.supervisor import Status
from exchange_broker.protocol import codec
from exchange_broker.protocol.names import method

PROPERTY_NAMES = {"type": "message_type"}  # RabbitMQ's name -> pamqp's, where they differ


class Shovel:
    def __init__(self, vhost: str, name: str, config: ShovelConfig, local: LocalBroker,
                 cluster_name: str = "exchange-broker") -> None:
        self.vhost, self.name, self.config, self.local = vhost, name, config, local
        self.cluster_name = cluster_name
        self.reconnect_delay = config.reconnect_delay
        self.moving = Forwarding(config.ack_mode, config.prefetch)  # counters: forwarded, pending
        self.remaining: int | None = None  # delete-after: messages left to move
        self.src_uri = self.dest_uri = ""
        self._start: int | None = None  # forwarded when the current episode began

    # -- one connection episode ------------------------------------------------------------------
    async def run(self, status: Status) -> None:
        c = self.config
        src = dest = None
        try:
            src, self.src_uri = await open_first(c.src_uris, self.vhost, self.local, f"Shovel {self.name}")
            dest, self.dest_uri = await open_first(c.dest_uris, self.vhost, self.local, f"Shovel {self.name}")
            await self._move(src, dest, status)
        finally:
            await close_quietly(src)  # first: what it did not ack goes back to its queue
            await close_quietly(dest)

    async def _move(self, src, dest, status: Status) -> None:
        c = self.config
        if c.dest_queue is not None:
            await ensure_queue(dest, c.dest_queue, c.dest_queue_args, c.dest_predeclared)
        elif c.dest_exchange is not None:
            await check_exchange(dest, c.dest_exchange)
        if c.src_queue is not None:
            queue = c.src_queue
            count = await ensure_queue(src, queue, c.src_queue_args, c.src_predeclared)
        else:
            await check_exchange(src, c.src_exchange)
            queue, count = "", 0
        if self.remaining is None and c.delete_after != "never":
            self.remaining = count if c.delete_after == "queue-length" else int(c.delete_after)
        if self.remaining == 0:
            return
        dest_ch = await dest.channel()
        src_ch = await src.channel()
        if c.src_queue is None:
            ok = await src_ch.call(method(commands.Queue.Declare, queue="", exclusive=True),
                                   commands.Queue.DeclareOk)
            queue = ok.queue
            await src_ch.call(method(commands.Queue.Bind, queue=queue, exchange=c.src_exchange,
                                     routing_key=c.src_exchange_key), commands.Queue.BindOk)
        before = self._start = self.moving.forwarded
        try:
            await self.moving.run(src, dest, src_ch, dest_ch, queue, target=self._target,
                                  properties=lambda d: self._properties(d.properties),
                                  on_running=status.running, limit=self.remaining)
        finally:
            if self.remaining is not None:
                self.remaining -= self.moving.forwarded - before
            self._start = None

    # -- what is published ----------------------------------------------------------------------
    def _target(self, d: Delivery) -> tuple[str, str]:
        c = self.config
        if c.dest_queue is not None:
            return "", c.dest_queue
        if c.dest_exchange is not None:
            return c.dest_exchange, c.dest_exchange_key if c.dest_exchange_key is not None else d.routing_key
        return d.exchange, d.routing_key

    def _properties(self, raw: bytes) -> bytes:
        c = self.config
        if not (c.forward_headers or c.timestamp_header or c.publish_properties):
            return raw  # passed on untouched
        props = codec.parse_properties(raw)
        for key, value in c.publish_properties.items():
            key = PROPERTY_NAMES.get(key, key)
            if key == "timestamp" and isinstance(value, (int, float)):
                value = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
            props[key] = value
        headers = dict(props.get("headers") or {})
        if c.forward_headers:
            entry = {"shovelled-by": self.cluster_name, "shovel-type": "dynamic", "shovel-name": self.name,
                     "shovel-vhost": self.vhost, "src-uri": uris.redact(self.src_uri),
                     "dest-uri": uris.redact(self.dest_uri)}
            entry.update({k: v for k, v in (("src-queue", c.src_queue), ("src-exchange", c.src_exchange),
                                            ("dest-queue", c.dest_queue), ("dest-exchange", c.dest_exchange))
                          if v is not None})
            headers["x-shovelled"] = [entry] + list(headers.get("x-shovelled") or [])
        if c.timestamp_header:
            headers["x-shovelled-timestamp"] = int(time.time())
        props["headers"] = headers
        return codec.encode_properties(props)

    # -- listing ----------------------------------------------------------------------------------
    def info(self) -> dict:
        c = self.config
        out = {"src_protocol": "amqp091", "dest_protocol": "amqp091",
               "src_uri": uris.redact(self.src_uri or c.src_uris[0]),
               "dest_uri": uris.redact(self.dest_uri or c.dest_uris[0]),
               "ack_mode": c.ack_mode, "forwarded": self.moving.forwarded, "pending": self.moving.pending}
        if c.src_queue is not None:
            out["src_queue"] = c.src_queue
        else:
            out.update({"src_exchange": c.src_exchange, "src_exchange_key": c.src_exchange_key})
        if c.dest_queue is not None:
            out["dest_queue"] = c.dest_queue
        elif c.dest_exchange is not None:
            out["dest_exchange"] = c.dest_exchange
            if c.dest_exchange_key is not None:
                out["dest_exchange_key"] = c.dest_exchange_key
        if self.remaining is not None:
            out["remaining"] = self.remaining - (self.moving.forwarded - self._start if self._start is not None else 0)
        return out
