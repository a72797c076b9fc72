"""Direct exchange index: exact routing-key match via a dict lookup."""
from __future__ import annotations

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType


class DirectIndex(BindingTable):
    """Destinations whose binding key equals the routing key."""

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, dict[BindingKey, Dest]] = {}
        self._match: dict[str, list[Dest]] = {}

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        self._by_key.setdefault(routing_key, {})[key] = dest
        self._refresh(routing_key)

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        del self._by_key[routing_key][key]
        self._refresh(routing_key)

    def _refresh(self, routing_key: str) -> None:
        entries = self._by_key.get(routing_key)
        if entries:
            self._match[routing_key] = list(dict.fromkeys(entries.values()))
        else:
            self._by_key.pop(routing_key, None)
            self._match.pop(routing_key, None)

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        """Hot path: one dict lookup; the returned list is shared, do not mutate."""
        result = self._match.get(routing_key)
        return result if result is not None else []


class DirectType(ExchangeType):
    name = "direct"
    index_class = DirectIndex
