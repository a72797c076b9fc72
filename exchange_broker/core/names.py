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


def generated(prefix: str) -> str:
    """`amq.gen-…` / `amq.ctag-…`: a prefix and 22 URL-safe random characters."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


def describe(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"
