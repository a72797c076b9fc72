"""The key a classic queue deduplicates a message by (x-deduplication-header, else message_id)."""

from __future__ import annotations

from exchange_broker.core.message import Message


def deduplication_key(msg: Message):
    """The message's deduplication key, hashable; None without one."""
    headers = msg.headers or {}
    key = headers.get("x-deduplication-header")
    if key is None:
        key = msg.props.get("message_id")
    if isinstance(key, bytearray):
        key = bytes(key)
    if isinstance(key, (dict, list)):
        key = repr(key)
    return key
