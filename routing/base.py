"""The binding table every exchange type's index builds on (binding identity, bookkeeping)."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Hashable

Dest = Hashable
BindingKey = tuple[Hashable, str, tuple]
Binding = tuple[Hashable, str, dict]


def args_key(value: Any) -> tuple:
    """Return a hashable, type-tagged canonical form of an AMQP field value.

    Dicts are order-independent; bool, int, float, str and bytes stay distinct
    so ``{"a": True}`` and ``{"a": 1}`` give two different binding identities.
    """
    if value is None:
        return ("n",)
    if isinstance(value, bool):
        return ("?", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, float):
        return ("f", repr(value))
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("b", bytes(value))
    if isinstance(value, dict):
        return ("d", tuple(sorted((args_key(k), args_key(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("l", tuple(args_key(v) for v in value))
    if isinstance(value, Decimal):
        return ("D", str(value))
    if isinstance(value, datetime):
        return ("t", value.isoformat())
    return ("o", type(value).__qualname__, repr(value))


class BindingTable:
    """Ordered set of bindings ``(dest, routing_key, arguments)``.

    Subclasses maintain their match structures via ``_validate``, ``_added``
    and ``_removed``. Lists returned by ``match`` may be cached: treat them as
    read-only.

    ``wants_headers``: ``match`` reads the message's headers (the core decodes them only for
    exchanges whose index says so).
    """

    wants_headers = False

    def __init__(self) -> None:
        self._bindings: dict[BindingKey, Binding] = {}
        self._by_dest: dict[Dest, dict[BindingKey, None]] = {}

    # -- hooks ---------------------------------------------------------------
    def _validate(self, args: dict) -> None:
        """Raise ValueError for arguments the exchange type rejects."""

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        """Called after a new binding was stored."""

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        """Called after a binding was dropped."""

    # -- public interface ----------------------------------------------------
    def bind(self, dest: Dest, routing_key: str, arguments: dict | None = None) -> bool:
        """Add a binding; False if that exact binding already existed."""
        args = dict(arguments) if arguments else {}
        self._validate(args)
        key = (dest, routing_key, args_key(args))
        if key in self._bindings:
            return False
        self._bindings[key] = (dest, routing_key, args)
        self._by_dest.setdefault(dest, {})[key] = None
        self._added(key, dest, routing_key, args)
        return True

    def unbind(self, dest: Dest, routing_key: str, arguments: dict | None = None) -> bool:
        """Remove a binding; False if it did not exist."""
        key = (dest, routing_key, args_key(dict(arguments) if arguments else {}))
        if key not in self._bindings:
            return False
        self._drop(key)
        return True

    def remove_destination(self, dest: Dest) -> int:
        """Drop every binding to ``dest``; return how many were dropped."""
        keys = list(self._by_dest.get(dest, ()))
        for key in keys:
            self._drop(key)
        return len(keys)

    def bindings(self) -> list[Binding]:
        """All bindings in binding order."""
        return list(self._bindings.values())

    def has_destination(self, dest: Dest) -> bool:
        return dest in self._by_dest

    def __len__(self) -> int:
        return len(self._bindings)

    def _drop(self, key: BindingKey) -> None:
        dest, routing_key, args = self._bindings.pop(key)
        keys = self._by_dest[dest]
        del keys[key]
        if not keys:
            del self._by_dest[dest]
        self._removed(key, dest, routing_key, args)
