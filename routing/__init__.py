"""Pure-Python AMQP 0-9-1 routing: per-exchange-type binding indexes and route().

Destinations are opaque hashable tuples, ``("q", queue)`` or ``("e", exchange)``.
"""
from __future__ import annotations

from typing import Callable

from .direct import DirectIndex
from .fanout import BindingTable, FanoutIndex, args_key
from .headers import HeadersIndex
from .route import route
from .topic import TopicIndex

_TYPES: dict[str, type[BindingTable]] = {
    "direct": DirectIndex,
    "fanout": FanoutIndex,
    "topic": TopicIndex,
    "headers": HeadersIndex,
}


def make_index(exchange_type: str) -> BindingTable:
    """A fresh index for "direct", "fanout", "topic" or "headers"."""
    try:
        return _TYPES[exchange_type]()
    except KeyError:
        raise ValueError(f"unknown exchange type {exchange_type!r}") from None


class DefaultIndex:
    """The default exchange "": routes to the queue named by the routing key."""

    def __init__(self, queue_exists: Callable[[str], bool]) -> None:
        self._queue_exists = queue_exists

    def bind(self, dest, routing_key: str, arguments: dict | None = None) -> bool:
        raise ValueError("operation not permitted on the default exchange")

    unbind = bind

    def remove_destination(self, dest) -> int:
        return 0

    def match(self, routing_key: str, headers: dict | None = None) -> list:
        return [("q", routing_key)] if self._queue_exists(routing_key) else []

    def bindings(self) -> list:
        return []

    def has_destination(self, dest) -> bool:
        return False

    def __len__(self) -> int:
        return 0


__all__ = [
    "BindingTable",
    "DefaultIndex",
    "DirectIndex",
    "FanoutIndex",
    "HeadersIndex",
    "TopicIndex",
    "args_key",
    "make_index",
    "route",
]
