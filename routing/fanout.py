"""Fanout exchange: every bound destination, whatever the routing key."""
from __future__ import annotations

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType


class FanoutIndex(BindingTable):
    """Fanout exchange: every bound destination, each once, in binding order."""

    def __init__(self) -> None:
        super().__init__()
        self._all: list[Dest] | None = None

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        self._all = None

    _removed = _added

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        result = self._all
        if result is None:
            result = self._all = list(dict.fromkeys(b[0] for b in self._bindings.values()))
        return result


class FanoutType(ExchangeType):
    name = "fanout"
    index_class = FanoutIndex
