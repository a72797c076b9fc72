"""Arrow record batches -> AMQP publishes with confirms (the executor side of the sink).

No JVM here: ``publish_batches(conn, batches, ...)`` is what each sink task runs.

Columns (any others are ignored, so a DataFrame read with ``format("amqp")`` can be written
back as it is):

=============  ==========================  ==============================================
``body``       binary or string            required
``exchange``   string                      unless the ``exchange`` option is set
``routing_key`` string                     unless the ``routingKey`` option is set
``headers``    map<string,string>          the headers table (values sent as strings)
``properties`` struct (the source's)       any subset of its fields
``timestamp``  timestamp                   the ``timestamp`` property (whole seconds)
=============  ==========================  ==============================================

A null exchange or routing key is the empty string; null properties are left out.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

from exchange_broker.protocol.frames import content_frames, publish_method

from .amqp import ConnectionClosed
from .amqp.codec import publish_frames
from .rows import PROPERTY_FIELDS

__all__ = ["PublishStats", "publish_batches", "frames_for_batch"]

_NO_PROPERTIES = b"\x00\x00"  # property flags: none set


class PublishStats:
    __slots__ = ("rows", "bytes", "seconds", "reconnects", "conn")

    def __init__(self) -> None:
        self.rows = 0
        self.bytes = 0
        self.seconds = 0.0
        self.reconnects = 0
        self.conn = None


def _column(batch, name: str):
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx)


def _values(array):
    return None if array is None or array.null_count == len(array) else array.to_pylist()


def _property_columns(props_array) -> list[tuple[str, list]]:
    """(name, values) for each field of the properties struct that is not all null."""
    if props_array is None or props_array.null_count == len(props_array):
        return []
    import pyarrow.compute as pc
    out = []
    for i in range(props_array.type.num_fields):
        name = props_array.type.field(i).name
        if name not in PROPERTY_FIELDS:
            continue
        field = pc.struct_field(props_array, [i])      # null where the struct itself is null
        if field.null_count < len(field):
            out.append((name, field.to_pylist()))
    return out


def _method(exchange: str, routing_key: str, mandatory: bool, cache: dict) -> bytes:
    key = (exchange, routing_key)
    frame = cache.get(key)
    if frame is None:
        ex, rk = exchange.encode(), routing_key.encode()
        if len(ex) > 255 or len(rk) > 255:
            raise ValueError(f"exchange or routing key longer than 255 bytes: {exchange[:40]!r}, "
                             f"{routing_key[:40]!r}")
        frame = publish_method(1, bytes((len(ex),)) + ex, bytes((len(rk),)) + rk, mandatory)
        if len(cache) < 10000:
            cache[key] = frame
    return frame


def frames_for_batch(batch, exchange: str | None, routing_key: str | None, mandatory: bool,
                     frame_max: int, cache: dict) -> tuple[list[bytes], int]:
    """Encode every row of one record batch; returns (one bytes object per row, body bytes)."""
    n = batch.num_rows
    body_col = _column(batch, "body")
    if body_col is None:
        raise ValueError("amqp sink: the DataFrame needs a 'body' column (binary or string)")
    bodies = body_col.to_pylist()
    if exchange is not None:
        exchanges = None
    else:
        exchanges = _values(_column(batch, "exchange"))
    if routing_key is not None:
        keys = None
    else:
        keys = _values(_column(batch, "routing_key"))
    headers = _values(_column(batch, "headers"))
    stamps = _column(batch, "timestamp")
    if stamps is not None and stamps.null_count < n:
        import pyarrow as pa
        stamps = stamps.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    else:
        stamps = None
    props = _property_columns(_column(batch, "properties"))
    simple = headers is None and stamps is None and not props
    out = []
    size = 0
    step = frame_max - 8
    ex_default = exchange or ""
    rk_default = routing_key or ""
    for i in range(n):
        body = bodies[i]
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode("utf-8")
        size += len(body)
        ex = ex_default if exchanges is None else (exchanges[i] or "")
        rk = rk_default if keys is None else (keys[i] or "")
        p = None
        if not simple:
            p = {name: values[i] for name, values in props if values[i] is not None}
            if headers is not None and headers[i] is not None:
                p["headers"] = headers[i]
            if stamps is not None and stamps[i] is not None:
                p["timestamp"] = stamps[i] // 1_000_000
        if p or len(body) > step:
            out.append(publish_frames(ex, rk, body, p, mandatory, frame_max))
            continue
        out.append(_method(ex, rk, mandatory, cache)
                   + b"".join(content_frames(1, 60, _NO_PROPERTIES, body, frame_max)))
    return out, size


def publish_batches(conn, batches: Iterable, exchange: str | None = None,
                    routing_key: str | None = None, mandatory: bool = False,
                    window: int = 20000, chunk: int = 2000, timeout: float = 120.0,
                    reconnect: Callable[[], object] | None = None) -> PublishStats:
    """Publish every row with confirms; returns once all are confirmed.

    Raises ``PublishFailed`` as soon as a nack or a ``mandatory`` return is seen (the task
    fails and Spark retries it: rows confirmed before the failure are published again).

    ``reconnect``: when the connection is lost (a node died, a cluster failed over), get a new
    one from it and publish again every chunk not yet wholly confirmed, then go on (at least
    once: a chunk confirmed in part is published again whole). ``stats.reconnects`` counts them.
    The connection in use at the end is ``stats.conn``."""
    stats = PublishStats()
    t0 = time.perf_counter()
    cache: dict = {}
    conn.confirm_select()
    pending: deque = deque()  # (last sequence number, frames) of chunks not wholly confirmed

    def send(data: bytes, count: int) -> None:
        # kept before it is sent: whatever happens to the connection now, it is sent again
        pending.append((conn._publish_seq + count, data, count))  # noqa: SLF001 - the connection's counter
        conn.publish_raw(data, count)
        if conn.unconfirmed() > window:
            conn.wait_for_confirms(timeout, max_outstanding=window // 2)
        else:
            conn.raise_publish_failures()
        confirmed = conn._confirmed  # noqa: SLF001
        while pending and pending[0][0] <= confirmed:
            pending.popleft()

    def resend() -> None:
        nonlocal conn
        conn.abort()
        conn = reconnect()
        stats.reconnects += 1
        conn.confirm_select()
        again = list(pending)
        pending.clear()
        for i, (_seq, data, count) in enumerate(again):
            try:
                send(data, count)
            except ConnectionClosed:
                pending.extend(again[i + 1:])  # not sent yet: the next attempt sends them
                raise

    original = conn
    try:
        for batch in batches:
            frames, size = frames_for_batch(batch, exchange, routing_key, mandatory, conn.frame_max,
                                            cache)
            for at in range(0, len(frames), chunk):
                part = frames[at:at + chunk]
                try:
                    send(b"".join(part), len(part))
                except ConnectionClosed:
                    if reconnect is None:
                        raise
                    resend_with(resend)  # ``part`` is in ``pending``: sent again with the others
            stats.rows += len(frames)
            stats.bytes += size
        while True:
            try:
                conn.wait_for_confirms(timeout)
                break
            except ConnectionClosed:
                if reconnect is None:
                    raise
                resend_with(resend)
    except BaseException:
        if conn is not original:
            conn.abort()  # the caller aborts the connection it gave
        raise
    stats.seconds = time.perf_counter() - t0
    stats.conn = conn
    return stats


RESEND_ATTEMPTS = 10  # connections in a row lost while publishing again before the task fails


def resend_with(resend: Callable[[], None]) -> None:
    """``resend()``, again while the new connection is lost as well (at most RESEND_ATTEMPTS)."""
    for attempt in range(RESEND_ATTEMPTS):
        try:
            resend()
            return
        except ConnectionClosed:
            if attempt == RESEND_ATTEMPTS - 1:
                raise
