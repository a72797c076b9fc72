"""The default exchange "": every queue is bound by its own name."""
from __future__ import annotations

from typing import Callable


class DefaultIndex:
    """The default exchange "": routes to the queue named by the routing key."""

    wants_headers = False

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
