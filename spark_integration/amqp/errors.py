"""Errors raised by the AMQP client; ``code``/``text`` carry the broker's reply when there is one."""

from __future__ import annotations

__all__ = ["AMQPError", "ConnectionFailed", "ChannelClosed", "ConnectionClosed",
           "ConsumerCancelled", "PublishFailed"]


class AMQPError(Exception):
    """Base class; ``code``/``text`` carry the broker's reply code and text when there is one."""

    def __init__(self, message: str, code: int = 0, text: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.text = text


class ConnectionFailed(AMQPError):
    """Could not reach / log in to the broker."""


class ChannelClosed(AMQPError):
    """The broker closed the channel (e.g. 404 NOT_FOUND, 406 PRECONDITION_FAILED)."""


class ConnectionClosed(AMQPError):
    """The broker closed the connection, or the socket died."""


class ConsumerCancelled(AMQPError):
    """The broker cancelled our consumer (queue deleted, failover...)."""



class PublishFailed(AMQPError):
    """The broker nacked a publish, or returned a ``mandatory`` one as unroutable."""
