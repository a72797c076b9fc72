"""Name validation and generated names (RabbitMQ's rules)."""

from __future__ import annotations

import base64
import os

from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError


def check_name(kind: str, name: str, class_id: int, method_id: int) -> None:
    """Exchange and queue names: at most 255 bytes of UTF-8, no control characters."""
    if len(name.encode("utf-8")) > 255:
        raise AMQPError(PRECONDITION_FAILED, f"{kind} name too long", class_id, method_id, hard=False)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise AMQPError(PRECONDITION_FAILED, f"{kind} name {name!r} contains control characters",
                        class_id, method_id, hard=False)


def strip_cr_lf(name: str) -> str:
    """RabbitMQ drops CR and LF from the names in queue.declare/delete, exchange.declare/delete
    and bindings (rabbit_channel:strip_cr_lf): ``"a\r\nb"`` is queue ``"ab"``."""
    if "\r" in name or "\n" in name:
        return name.replace("\r", "").replace("\n", "")
    return name


def generated(prefix: str) -> str:
    """`amq.gen-…` / `amq.ctag-…`: a prefix and 22 URL-safe random characters."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


def describe(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


def logsafe(value) -> str:
    """A name a client sent, for the log: control characters (newline, escape, ...) escaped, so
    that no name can start a forged log line."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    n = ord(c)
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
