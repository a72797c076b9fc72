"""Dead-lettering: the republished copy carries RabbitMQ's `x-death` history."""

from __future__ import annotations

import datetime
import struct

from pamqp import encode as pencode

from exchange_broker.core.message import Message
from exchange_broker.protocol import codec


class _Long(int):
    """An x-death ``count``: RabbitMQ sends a signed 64-bit 'l' (Java clients cast it to Long)."""


def _value(v) -> bytes:
    if isinstance(v, _Long):
        return b"l" + struct.pack(">q", v)
    if isinstance(v, dict):
        return b"F" + _table(v)
    if isinstance(v, list):
        data = b"".join(_value(x) for x in v)
        return b"A" + struct.pack(">I", len(data)) + data
    return pencode.encode_table_value(v)


def _table(d: dict) -> bytes:
    """Encode a field table in insertion order, keeping x-death counts as longs."""
    data = b"".join(pencode.short_string(k) + _value(v) for k, v in d.items())
    return struct.pack(">I", len(data)) + data


def _encode_properties(props: dict) -> bytes:
    """codec.encode_properties, but with the headers table encoded by ``_table``."""
    rest = dict(props)
    headers = rest.pop("headers", None)
    raw = codec.encode_properties(rest)
    if headers is None:
        return raw
    flags = int.from_bytes(raw[:2], "big")
    pos = 2
    if flags & (1 << 15):  # content-type
        pos += 1 + raw[pos]
    if flags & (1 << 14):  # content-encoding
        pos += 1 + raw[pos]
    return (flags | (1 << 13)).to_bytes(2, "big") + raw[2:pos] + _table(headers) + raw[pos:]


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def routing_keys_of(msg: Message) -> list[str]:
    """The routing key plus CC recipients (BCC is never recorded), as x-death lists them."""
    keys = [msg.routing_key]
    headers = msg.headers or {}
    cc = headers.get("CC")
    if isinstance(cc, list):
        keys += [_text(k) for k in cc if isinstance(k, (str, bytes))]
    return keys


def dead_lettered_copy(msg: Message, queue_name: str, reason: str, dlx: str,
                       dlrk: str | None, now: float) -> Message:
    """A new message for the dead-letter exchange, with x-death updated as RabbitMQ does it
    (``now``: the clock's wall time, seconds since the epoch).

    Entries are keyed by (queue, reason): a repeat increments ``count`` and moves the entry to the
    front; a new one is prepended. Per-message ``expiration`` is removed and kept as
    ``original-expiration``.
    """
    props = dict(msg.props)
    headers = dict(props.get("headers") or {})
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    for d in deaths:
        if isinstance(d.get("count"), int) and not isinstance(d["count"], bool):
            d["count"] = _Long(d["count"])
    entry = None
    for d in deaths:
        if _text(d.get("queue")) == queue_name and _text(d.get("reason")) == reason:
            entry = d
            break
    if entry is not None:
        deaths.remove(entry)
        count = entry.get("count", 1)
        entry["count"] = _Long((count if isinstance(count, int) else 1) + 1)
    else:
        entry = {
            "count": _Long(1),
            "reason": reason,
            "queue": queue_name,
            "time": datetime.datetime.fromtimestamp(int(now), datetime.timezone.utc),
            "exchange": msg.exchange,
            "routing-keys": routing_keys_of(msg),
        }
        if props.get("expiration") is not None:
            entry["original-expiration"] = _text(props["expiration"])
    deaths.insert(0, entry)
    headers["x-death"] = deaths
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue_name
        headers["x-first-death-exchange"] = msg.exchange
    # (x-last-death-* headers arrived in RabbitMQ 3.13; 3.10 sends only x-first-death-*)
    if dlrk is not None:
        headers.pop("CC", None)  # RabbitMQ: an explicit dead-letter routing key replaces CC routing
    props.pop("expiration", None)
    props["headers"] = headers
    raw = _encode_properties(props)
    copy = Message(dlx, dlrk if dlrk is not None else msg.routing_key, raw, msg.body, msg.persistent,
                   msg.priority)
    copy._props = props
    return copy


def is_cycle(msg: Message, target_queue: str) -> bool:
    """RabbitMQ drops a dead-lettered message that would return to a queue it already died in,
    unless a rejection happened somewhere in that history (a consumer decided, so no loop)."""
    deaths = (msg.headers or {}).get("x-death") or []
    queues = {_text(d.get("queue")) for d in deaths if isinstance(d, dict)}
    if target_queue not in queues:
        return False
    return not any(_text(d.get("reason")) == "rejected" for d in deaths if isinstance(d, dict))
