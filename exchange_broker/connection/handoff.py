"""Handing a client connection over to another broker, byte for byte (a leaders-mode cluster
node, unless ``serve --no-cluster-connection-handoff``): the session's side.

A plug-in from above (the cluster's ``cluster/handoff.py``) may take a connection at its first
queue-bound request (a publish, basic.consume or basic.get) while it holds nothing a client
could miss: no consumer, no delivery, no confirm or transaction under way, no exclusive queue,
no content half read. Then the session stops reading (:meth:`HandOff.suspend`) and gives back
the input not handled yet, that request first, as the client sent it (the request is framed
again by the one codec: its frames were read already). If the other broker takes the
connection, the session is gone (:meth:`HandOff.handed_off`) and the listener passes bytes
through; if not, :meth:`HandOff.resume` handles the input here as if nothing had happened.
"""

from __future__ import annotations

import logging

from exchange_broker.core.names import logsafe
from exchange_broker.protocol import codec
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.frames import publish_frames

log = logging.getLogger("exchange_broker.session")

QUEUE_BOUND = ("Basic.Consume", "Basic.Get")


def reframed(event, frame_max: int) -> bytes:
    """The frames of a publish, a batch of publishes or a method, as a client sends them."""
    t = type(event)
    if t is ev.Method:
        return codec.method_frame(event.channel, event.method)
    items = (event,) if t is ev.Publish else event.items
    out: list = []
    for p in items:
        out.extend(publish_frames(p.channel, codec.short_str(p.exchange), codec.short_str(p.routing_key),
                                  p.mandatory, p.properties, p.body, frame_max))
    return b"".join(out)


def queue_of(event) -> tuple[str, str] | None:
    """(exchange, routing key) of a publish, ("", queue) of basic.consume/get; None otherwise."""
    t = type(event)
    if t is ev.Method:
        return ("", event.method.queue) if event.method.name in QUEUE_BOUND else None
    if t is not ev.Publish and t is not ev.Publishes:
        return None
    items = (event,) if t is ev.Publish else event.items
    if any(p.immediate for p in items):  # refused here (as RabbitMQ does); framed again it would lose the bit
        return None
    return items[0].exchange, items[0].routing_key


class HandOff:
    """Session mixin: suspend, resume, handed off."""

    handoff_open = True   # the first queue-bound request has not come yet
    suspended = False     # waiting to learn whether another broker takes the connection
    login_response: tuple | None = None  # (mechanism, response) of the login, kept for a hand-off
    _events = None        # the events being handled (``Session._work``)

    def holds_nothing(self) -> bool:
        """Nothing a client could miss if its connection went elsewhere now."""
        if self.closed or self.suspended or self.exclusive_queues or self._draining or self.blocked \
                or self.throttled_by or self.login_response is None \
                or not self.conn.detachable():
            return False
        for ch in self.channels.values():
            if ch.consumers or ch.unacked or ch.next_tag != 1 or ch.publish_seq or ch.tx \
                    or ch.reply_tag is not None or ch.closed:
                return False
        return True

    def suspend(self, event) -> bytes:
        """Stop here: ``event`` (just handed up, not handled) and what follows it, as sent."""
        rest = self.conn.detach(self._events)
        later, self._later = b"".join(self._later), []
        self.suspended = True
        self._input = None
        self.flush()  # what was answered before goes out ahead of anything from elsewhere
        self._update_reading()
        return reframed(event, self.conn.frame_max) + rest + later

    def resume(self, data: bytes) -> None:
        """Nobody took it: handle ``data`` (what ``suspend`` gave) here after all."""
        self.suspended = False
        self.conn.reattach()
        self._update_reading()
        self.data_received(data)

    def handed_off(self, where: str) -> None:
        """Another broker serves the connection from now on: this session ends without a word."""
        log.info("connection %s (user '%s', vhost '%s') handed off to %s", self.name,
                 logsafe(self.user or ""), logsafe(self.vhost.name if self.vhost else ""), where)
        self._handle_closing(None)
        self.closed = True
