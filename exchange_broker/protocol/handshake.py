"""Pure checks of the connection handshake (rabbit_reader's rules): which protocol headers are
served, what a tune-ok may ask for, how a refused login is told."""

from __future__ import annotations

from exchange_broker.protocol.constants import (ACCESS_REFUSED, FRAME_MIN_SIZE, NOT_ALLOWED, PROTOCOL_HEADER,
                                                PROTOCOL_HEADER_0_9, PROTOCOL_HEADERS_0_8)
from exchange_broker.protocol.errors import AMQPError

# The protocol each served header gets (rabbit_reader's version negotiation). AMQP 0-9's header is
# answered in 0-9-1: connection.start says 0-9 either way, and the clients that send it (aioamqp,
# Net::AMQP) cope. The 0-8 headers get AMQP 0-8 (protocol/amqp_0_8.py: Mono's RabbitMQ.Client).
SERVED_HEADERS = {PROTOCOL_HEADER: "0-9-1", PROTOCOL_HEADER_0_9: "0-9-1",
                  **{header: "0-8" for header in PROTOCOL_HEADERS_0_8}}


def header_verdict(buf: bytes) -> str | bool | None:
    """The protocol ("0-9-1" or "0-8") of a header served here; False: refuse (answer
    PROTOCOL_HEADER, close); None: wait for more bytes."""
    if len(buf) < 8 and any(h.startswith(buf) for h in SERVED_HEADERS):
        return None
    return SERVED_HEADERS.get(bytes(buf[:8]), False)


class SilentRefusal(AMQPError):
    """A refused login of a client without the authentication_failure_close capability: the
    socket is closed without connection.close."""


def login_refusal(err: AMQPError, capabilities: dict) -> AMQPError:
    """The error to raise for a failed login: connection.close 403 is sent only to the clients
    that announced authentication_failure_close; the others just see the socket closed
    (rabbit_reader:auth_fail and handle_exception in the starting state)."""
    if err.code == ACCESS_REFUSED and capabilities.get("authentication_failure_close") is not True:
        return SilentRefusal(err.code, err.text, err.class_id, err.method_id, hard=True)
    return err


def tuned(method, server_channel_max: int, server_frame_max: int) -> tuple[int, int]:
    """(frame_max, channel_max) a tune-ok settles on; AMQPError 530 outside the server's range."""
    frame_max = method.frame_max or server_frame_max
    if frame_max > server_frame_max:
        raise AMQPError(NOT_ALLOWED, f"frame_max={frame_max} > {server_frame_max} max size", 10, 31, hard=True)
    if frame_max < FRAME_MIN_SIZE:
        raise AMQPError(NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size", 10, 31, hard=True)
    channel_max = method.channel_max or server_channel_max
    if channel_max > server_channel_max:
        raise AMQPError(NOT_ALLOWED, f"channel_max={channel_max} > {server_channel_max} max", 10, 31, hard=True)
    return frame_max, channel_max
