"""A classic queue's deduplication: the key of a message (x-deduplication-header, else
message_id) and the cache of keys seen (x-cache-size entries, each for x-cache-ttl ms or for good)."""

from __future__ import annotations

from collections import OrderedDict

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


def is_duplicate(cache: OrderedDict, key, now_ms: int) -> bool:
    """``key`` was seen and its entry has not expired (0: kept until pushed out)."""
    expiry = cache.get(key)
    return expiry is not None and (expiry == 0 or expiry > now_ms)


def remember(cache: OrderedDict, key, now_ms: int, ttl: int | None, size: int) -> None:
    """``key`` seen now: the newest entry, for ``ttl`` ms (None or 0: until pushed out); the
    oldest entries go beyond ``size``."""
    cache[key] = now_ms + ttl if ttl else 0
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)
