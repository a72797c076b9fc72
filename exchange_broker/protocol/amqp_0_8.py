"""AMQP 0-8, as RabbitMQ 3.x serves it to the clients that still open with it (Mono's
RabbitMQ.Client by default, py-amqplib when asked): the differences from 0-9-1 on the wire,
as small translations around the 0-9-1 codec (rabbit_framing_amqp_0_8 differs in these only).

- connection.close and close-ok are methods 60 and 61 of the connection class (50 and 51 in 0-9-1).
- connection.start says version 8-0 and announces no capabilities.
- channel.open-ok has no fields.
- access.request (class 30) is answered access.request-ok with ticket 1 (tickets are ignored).
- basic.consume has no arguments table.
- RabbitMQ's 0-9-1 extensions that 0-8 lacks (publisher confirms, exchange-to-exchange bindings,
  basic.nack) are refused: 540 NOT_IMPLEMENTED closes the connection,
  where RabbitMQ fails to decode them and drops the socket.
Everything else (queue.unbind and basic.recover included, which RabbitMQ added to its 0-8) is laid
out as in 0-9-1.
"""

from __future__ import annotations

import struct

from exchange_broker.protocol.constants import NOT_IMPLEMENTED
from exchange_broker.protocol.errors import AMQPError

VERSION = (8, 0)
CHANNEL_OPEN_OK = struct.pack(">HH", 20, 11)
ACCESS_REQUEST_OK = struct.pack(">HHH", 30, 11, 1)

ACCESS_REQUEST = 30 << 16 | 10
BASIC_CONSUME = 60 << 16 | 20
_NOT_IN_0_8 = {85 << 16 | 10: "confirm.select", 40 << 16 | 30: "exchange.bind",
               40 << 16 | 40: "exchange.unbind", 60 << 16 | 120: "basic.nack"}
DIFFERENT = frozenset({ACCESS_REQUEST, BASIC_CONSUME, *_NOT_IN_0_8})


def server_properties(properties: dict) -> dict:
    """connection.start's server properties for a 0-8 client: no capabilities (as RabbitMQ)."""
    return {**properties, "capabilities": {}}


def as_0_9_1(mid: int, payload: bytes) -> bytes | None:
    """The 0-9-1 payload of a 0-8 method in ``DIFFERENT``; None: access.request, answered by
    ACCESS_REQUEST_OK; AMQPError 540 for a method 0-8 does not have."""
    if mid == BASIC_CONSUME:
        # ticket (2), queue, consumer tag (short strings), one byte of bits: then 0-9-1's table
        end = 6
        for _ in range(2):
            end += 1 + payload[end] if end < len(payload) else 1
        return payload + b"\x00\x00\x00\x00" if len(payload) == end + 1 else payload
    if mid == ACCESS_REQUEST:
        return None
    name = _NOT_IN_0_8[mid]
    raise AMQPError(NOT_IMPLEMENTED, f"{name} is not part of AMQP 0-8 (connect with AMQP 0-9-1 to use it)",
                    mid >> 16, mid & 0xFFFF, hard=True)


_CLOSE_0_8 = {b"\x00\x0a\x00\x3c": b"\x00\x0a\x00\x32", b"\x00\x0a\x00\x3d": b"\x00\x0a\x00\x33"}
_CLOSE_0_9_1 = {v: k for k, v in _CLOSE_0_8.items()}


def connection_method(payload: bytes) -> bytes:
    """A channel-0 method payload of a 0-8 client in 0-9-1's numbering."""
    renumbered = _CLOSE_0_8.get(payload[:4])
    return renumbered + payload[4:] if renumbered else payload


def connection_frame(frame: bytes) -> bytes:
    """A channel-0 method frame of this server (connection.close or close-ok) in 0-8's numbering."""
    renumbered = _CLOSE_0_9_1.get(frame[7:11])
    return frame[:7] + renumbered + frame[11:] if renumbered else frame
