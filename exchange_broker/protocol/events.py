"""Events of the sans-IO connections: :class:`ServerConnection` (for the broker session) and, at the
end, those only :class:`ClientConnection` produces (it also uses Method, Closing and Closed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Opened:
    """The handshake finished: the client is logged in and the vhost is open."""
    user: str
    vhost: str
    client_properties: dict


@dataclass(slots=True)
class ChannelOpened:
    """channel.open: its open-ok (``reply``) is sent once the session has handled this event,
    unless the session refused the channel meanwhile."""
    channel: int
    reply: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class ChannelClosed:
    """The client closed the channel (or answered our close); its state must be released.

    For the client's channel.close, ``reply`` is the close-ok: the protocol sends it after the
    session handled this event, unless the session took it (set ``reply`` to None) to send it
    itself once the channel's last confirms are out."""
    channel: int
    reply: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Method:
    channel: int
    method: Any  # a pamqp command


@dataclass(slots=True)
class Publish:
    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    properties: bytes  # raw property flags + values, forwarded untouched
    body: bytes
    quick: tuple | None = None  # codec.quick_properties(properties), already computed


@dataclass(slots=True)
class Publishes:
    """Several complete basic.publish in a row on one channel, in order (nothing between them)."""
    channel: int
    items: list  # of Publish


@dataclass(slots=True)
class Ack:
    """basic.ack (kind 0), basic.nack (kind 1) or basic.reject (kind 2)."""
    channel: int
    kind: int
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(slots=True)
class Closing:
    """The connection is going away (client close, or a hard error we sent).

    For the client's connection.close, ``reply`` is the close-ok, sent (behind any held reply)
    after the session handled this event unless the session took it to send it later."""
    code: int
    text: str
    by_client: bool
    reply: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Closed:
    """The close handshake is complete; the transport may be closed once the output is written.
    ``abrupt``: the input could not be framed any more (close soon, do not wait for the peer)."""
    abrupt: bool = field(default=False, compare=False)


# -- events of the client side (``client.py``) ------------------------------------------------------

@dataclass(slots=True)
class Connected:
    """Client: the handshake finished (connection.open-ok); the negotiated limits."""
    server_properties: dict
    frame_max: int
    channel_max: int
    heartbeat: int


@dataclass(slots=True)
class Delivered:
    """Client: a basic.deliver, basic.get-ok or basic.return with its content
    (``deliveries.Delivery``: raw properties, body)."""
    channel: int
    delivery: Any


@dataclass(slots=True)
class Confirm:
    """Client: the server's basic.ack (``ack`` True) or basic.nack of published messages."""
    channel: int
    delivery_tag: int
    multiple: bool
    ack: bool
