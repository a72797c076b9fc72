"""Headers exchange index: match binding arguments against message headers."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType

X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")
_SIMPLE = (str, int, float, bool)


def parse_x_match(args: dict) -> str:
    """Return the x-match mode ("all" when absent); ValueError if invalid."""
    if "x-match" not in args:
        return "all"
    value = args["x-match"]
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode()
        except UnicodeDecodeError:
            pass
    if isinstance(value, str) and value in X_MATCH_MODES:
        return value
    raise ValueError(
        f"invalid x-match field value {value!r}; expected all, any, all-with-x or any-with-x"
    )


def _kind(value: Any) -> str:
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, Decimal)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, datetime):
        return "timestamp"
    return type(value).__qualname__


def _as_text(value: Any) -> Any:
    """bytes that are valid UTF-8 become str (AMQP long strings may be raw bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value)
    return value


def values_equal(a: Any, b: Any) -> bool:
    """Typed equality: True != 1, 1 != "1", b"x" == "x" (UTF-8), nested tables/arrays."""
    ta = type(a)
    if ta is type(b) and ta in _SIMPLE:
        return a == b
    a, b = _as_text(a), _as_text(b)
    kind = _kind(a)
    if kind != _kind(b):
        return False
    if kind == "table":
        return a.keys() == b.keys() and all(values_equal(v, b[k]) for k, v in a.items())
    if kind == "array":
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return a == b


def compile_binding(args: dict) -> tuple[bool, tuple[tuple[Any, Any], ...]]:
    """Return (require_all, considered (key, value) pairs) for binding arguments."""
    mode = parse_x_match(args)
    with_x = mode.endswith("-with-x")
    pairs = tuple(
        (k, v)
        for k, v in args.items()
        if k != "x-match" and (with_x or not (isinstance(k, str) and k.startswith("x-")))
    )
    return mode.startswith("all"), pairs


def headers_match(require_all: bool, pairs: tuple, headers: dict) -> bool:
    """Evaluate one compiled binding; a None binding value tests presence only."""
    missing = object()
    for key, want in pairs:
        got = headers.get(key, missing)
        ok = got is not missing and (want is None or values_equal(want, got))
        if ok and not require_all:
            return True
        if not ok and require_all:
            return False
    return require_all


class HeadersIndex(BindingTable):
    """Routing key ignored; each binding's x-match rule is evaluated per message."""

    wants_headers = True

    def __init__(self) -> None:
        super().__init__()
        self._rules: dict[BindingKey, tuple[Dest, bool, tuple]] = {}

    def _validate(self, args: dict) -> None:
        parse_x_match(args)

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        self._rules[key] = (dest, *compile_binding(args))

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        del self._rules[key]

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        """Destinations of matching bindings, each once, in binding order."""
        headers = headers or {}
        out: dict[Dest, None] = {}
        for dest, require_all, pairs in self._rules.values():
            if dest not in out and headers_match(require_all, pairs, headers):
                out[dest] = None
        return list(out)


class HeadersType(ExchangeType):
    name = "headers"
    index_class = HeadersIndex
