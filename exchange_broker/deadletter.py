"""Dead-lettering: the republished copy carries RabbitMQ's `x-death` history."""

from __future__ import annotations

import datetime

from .message import Message
from .protocol import codec


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
                       dlrk: str | None) -> Message:
    """A new message for the dead-letter exchange, with x-death updated as RabbitMQ does it.

    Entries are keyed by (queue, reason): a repeat increments ``count`` and moves the entry to the
    front; a new one is prepended. Per-message ``expiration`` is removed and kept as
    ``original-expiration``.
    """
    props = dict(msg.props)
    headers = dict(props.get("headers") or {})
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    entry = None
    for d in deaths:
        if _text(d.get("queue")) == queue_name and _text(d.get("reason")) == reason:
            entry = d
            break
    if entry is not None:
        deaths.remove(entry)
        count = entry.get("count", 1)
        entry["count"] = (count if isinstance(count, int) else 1) + 1
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue_name,
            "time": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0),
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
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue_name
    headers["x-last-death-exchange"] = msg.exchange
    props.pop("expiration", None)
    props["headers"] = headers
    raw = codec.encode_properties(props)
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
