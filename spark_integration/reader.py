"""Reading queues into Arrow record batches: the part of the data source that needs no JVM.

Classic (and quorum) queues
    ``read_classic`` runs one consumer.  ``peek`` never acks (the connection is closed at
    the end and the broker puts every delivery back); ``onread`` works in rounds: consume
    with prefetch = round size, collect, cancel, hand the batch to Spark, then ack (multiple)
    and make a round trip so the ack is known to be processed.

Stream queues
    Offsets are immutable, so a read is a pure function of an offset range ``[start, end)``:
    consume with ``x-stream-offset = start`` and stop at ``end``.  This is what makes
    streaming exactly-once with Spark's checkpoints: a replayed micro-batch reads the very
    same messages.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from typing import Iterator, NamedTuple

from .chunk_reader import ChunksUnavailable, read_chunks
from .failover import connect_retrying
from .amqp import (MAX_PREFETCH, AMQPError, ChannelClosed, Connection, ConnectionClosed,
                   ConnectionParams, Delivery, DeliveryBatch)
from .rows import batch_to_record_batch, stream_offset, to_record_batch

log = logging.getLogger(__name__)

# Body bytes per Arrow batch: keeps binary offsets (int32) far from overflowing.
MAX_BATCH_BYTES = 256 * 1024 * 1024


class QueueNotFound(ValueError):
    pass


class DataLossError(RuntimeError):
    pass


class QueueInfo(NamedTuple):
    type: str      # classic | quorum | stream
    ready: int     # ready-message count from queue.declare-ok (0 for RabbitMQ streams)


# ---------------------------------------------------------------------------- connections
def connect(params: ConnectionParams, prefer: int = 0) -> Connection:
    """Connect; with several nodes in the url, start at node ``prefer`` (partitions pass their
    index, so their connections spread over the nodes)."""
    return Connection.connect(params, prefer=prefer)


def declare_passive(conn: Connection, queue: str) -> int:
    """Ready count of an existing queue; QueueNotFound (clear message) when it does not exist."""
    try:
        return conn.queue_declare(queue, passive=True)[1]
    except ChannelClosed as exc:
        if exc.code == 404:
            p = conn.params
            raise QueueNotFound(f"queue '{queue}' not found in vhost '{p.vhost}' on "
                                f"{p.host}:{p.port}") from None
        raise


def admin_queue_type(admin_url: str, params: ConnectionParams, queue: str,
                     timeout: float = 5.0) -> str | None:
    """Queue type from a RabbitMQ-style management API (GET /api/queues/{vhost}/{name})."""
    url = (f"{admin_url.rstrip('/')}/api/queues/{urllib.parse.quote(params.vhost, safe='')}/"
           f"{urllib.parse.quote(queue, safe='')}")
    req = urllib.request.Request(url, headers={
        "Authorization": "Basic " + b64encode(f"{params.username}:{params.password}".encode()).decode()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            qtype = json.load(resp).get("type")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("management API %s unusable (%s); falling back to AMQP probing", url, exc)
        return None
    return qtype if qtype in ("classic", "quorum", "stream") else None


def inspect_queue(params: ConnectionParams, queue: str, queue_type: str = "auto",
                  admin_url: str | None = None, probe_timeout: float = 2.0) -> QueueInfo:
    """Check the queue exists and find its type.

    ``auto`` asks the management API when ``admin_url`` is given.  Otherwise it opens a
    consumer with prefetch 1 and ``x-stream-offset=last``:

    * a stream accepts it and answers with a delivery carrying an ``x-stream-offset`` header;
    * RabbitMQ refuses the argument on classic/quorum queues (406 "invalid arg
      'x-stream-offset' ... of queue type rabbit_classic_queue"): classic, no side effect;
    * a broker that ignores the argument delivers a classic queue's head message, which goes
      straight back when the probe connection closes (flagged redelivered);
    * nothing within ``probe_timeout``: an empty queue of either kind, read as classic.

    (The ready count cannot tell: RabbitMQ reports stream lengths in it too.)
    """
    with connect(params) as conn:
        ready = declare_passive(conn, queue)
        if queue_type != "auto":
            return QueueInfo(queue_type, ready)
        if admin_url:
            found = admin_queue_type(admin_url, params, queue)
            if found:
                return QueueInfo(found, ready)
        conn.basic_qos(1)
        try:
            conn.basic_consume(queue, {"x-stream-offset": "last"})
            got = conn.take(1, probe_timeout)
        except ChannelClosed as exc:
            if exc.code != 406:
                raise
            return QueueInfo("quorum" if "quorum" in exc.text else "classic", ready)
    if got and stream_offset(got[0].properties.headers) is not None:
        return QueueInfo("stream", ready)
    return QueueInfo("classic", ready)


# ---------------------------------------------------------------------------- batching
def batches(deliveries: list[Delivery] | DeliveryBatch, queue: str, stream: bool,
            batch_rows: int):
    """Split into Arrow batches of at most batch_rows rows / MAX_BATCH_BYTES body bytes."""
    if isinstance(deliveries, DeliveryBatch):
        for a, b in _cuts(list(map(len, deliveries.bodies)), batch_rows):
            yield batch_to_record_batch(deliveries.slice(a, b), queue, stream)
        return
    for a, b in _cuts([len(d.body) for d in deliveries], batch_rows):
        yield to_record_batch(deliveries[a:b], queue, stream)


def _cuts(sizes: list[int], batch_rows: int) -> list[tuple[int, int]]:
    """[start, stop) of each batch, given the body sizes."""
    n = len(sizes)
    if sum(sizes) < MAX_BATCH_BYTES:
        return [(a, min(a + batch_rows, n)) for a in range(0, n, batch_rows)]
    out = []
    start = size = 0
    for i, s in enumerate(sizes):
        size += s
        if i + 1 - start >= batch_rows or size >= MAX_BATCH_BYTES:
            out.append((start, i + 1))
            start, size = i + 1, 0
    if start < n:
        out.append((start, n))
    return out


# ---------------------------------------------------------------------------- classic queues
def plan_budgets(ready: int, max_messages: int | None, num_partitions: int) -> list[int]:
    """How many messages each of ``num_partitions`` consumers takes (sums to the total)."""
    total = ready if max_messages is None else min(ready, max_messages)
    n = max(1, num_partitions)
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def fetch_round(conn: Connection, queue: str, want: int, idle_timeout: float,
                expect: int | None = None) -> DeliveryBatch:
    """One round: consume with at most ``want`` unacked, collect, cancel.

    Returns every delivery received before cancel-ok (never more than ``want``).  Collection
    stops at ``expect`` deliveries (default ``want``) or after ``idle_timeout`` without one.
    """
    if want <= 0:
        return DeliveryBatch()
    conn.consume_limited(queue, want)
    got = conn.take_batch_exactly(min(want, expect if expect is not None else want),
                                  idle_timeout)
    conn.cancel_all()
    if len(got) < want:  # stragglers that arrived before cancel-ok
        got.extend(conn.take_batch(want - len(got), 0))
    return got


def read_classic(params: ConnectionParams, queue: str, budget: int, ack_mode: str = "peek",
                 batch_rows: int = 10000, idle_timeout: float = 1.0,
                 prefer: int = 0) -> Iterator:
    """Yield Arrow batches of up to ``budget`` messages from a classic/quorum queue.

    peek:   one consumer with prefetch = budget; nothing is acked; closing the connection
            puts every message back (they are then flagged redelivered).
    onread: rounds of ``batch_rows``; a round is acked (multiple, then a round trip) when
            Spark asks for the next batch, i.e. after it took the previous one.  A batch
            never handed over is never acked.
    """
    if budget <= 0:
        return
    conn = connect(params, prefer)
    try:
        if ack_mode == "peek":
            conn.consume_limited(queue, budget)
            taken = 0
            while taken < budget:
                got = conn.take_batch_exactly(min(batch_rows, budget - taken), idle_timeout)
                if not got:
                    break
                taken += len(got)
                yield from batches(got, queue, False, batch_rows)
        else:
            taken = 0
            while taken < budget:
                got = fetch_round(conn, queue, min(batch_rows, budget - taken), idle_timeout)
                if not got:
                    break
                taken += len(got)
                yield from batches(got, queue, False, batch_rows)
                conn.basic_ack(max(got.tags), multiple=True)
                conn.sync(queue)
    except GeneratorExit:
        conn.abort()   # Spark stopped early: whatever was not acked goes back
        raise
    except BaseException:
        conn.abort()
        raise
    else:
        conn.close()


# ---------------------------------------------------------------------------- stream queues
def consume_stream(conn: Connection, queue: str, offset: str | int) -> str:
    try:
        return conn.basic_consume(queue, {"x-stream-offset": offset})
    except ChannelClosed as exc:
        if exc.code == 406 and "x-stream-offset" in exc.text:
            raise AMQPError(f"queue '{queue}' is not a stream queue ({exc.text})",
                            exc.code, exc.text) from None
        raise


def probe_stream(params: ConnectionParams, queue: str, where: str,
                 timeout: float = 2.0, settle: float = 0.1, cap: float = 1.0) -> int | None:
    """Locate a stream's head or tail.

    where='first': offset of the first retained message.
    where='last':  one past the highest offset seen when consuming from ``last`` (the start
                   of the last chunk) until ``settle`` s of silence (or ``cap`` s).
    None when nothing arrives within ``timeout`` (empty stream).  Offsets are never
    overestimated: every offset below the returned tail exists.
    """
    with connect(params) as conn:
        conn.basic_qos(1 if where == "first" else 2000)
        consume_stream(conn, queue, where)
        got = conn.take(1 if where == "first" else 2000, timeout)
        if not got:
            return None
        first = stream_offset(got[0].properties.headers)
        if first is None:
            raise AMQPError(f"queue '{queue}' is not a stream queue (deliveries carry no "
                            f"x-stream-offset header)")
        if where == "first":
            return first
        high = max(stream_offset(d.properties.headers) or 0 for d in got)
        stop = time.monotonic() + cap
        while time.monotonic() < stop:
            conn.basic_ack(got[-1].delivery_tag, multiple=True)
            got = conn.take(2000, settle)
            if not got:
                break
            high = max(high, max(stream_offset(d.properties.headers) or 0 for d in got))
        return high + 1


def resolve_offset(params: ConnectionParams, queue: str, spec: str | int,
                   timeout: float = 2.0) -> int | None:
    """'earliest' / 'latest' / int -> a concrete offset (None: empty stream)."""
    if isinstance(spec, int):
        return spec
    if spec == "earliest":
        return probe_stream(params, queue, "first", timeout)
    if spec == "latest":
        return probe_stream(params, queue, "last", timeout)
    raise ValueError(f"bad offset spec {spec!r}")


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """Split [start, end) into at most ``parts`` contiguous non-empty ranges."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    out, a = [], start
    for i in range(parts):
        b = a + base + (1 if i < extra else 0)
        out.append((a, b))
        a = b
    return out


def _data_lost(queue: str, start: int, first: int, fail: bool) -> None:
    """Offsets [start, first) were truncated by retention: DataLossError, or a warning."""
    msg = f"stream '{queue}': offsets [{start}, {first}) are no longer available (retention?)"
    if fail:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip them")
    log.warning(msg)


def read_stream(opts, start: int, end: int, prefer: int = 0) -> Iterator:
    """A partition's offsets [start, end) of a stream (``opts``: the source's options): from the
    store's chunks through the admin API when ``streamRead`` allows it (``chunk_reader.py``),
    what they do not cover (yet) and everything else over AMQP (``read_stream_range``)."""
    def over_amqp(a: int):
        return read_stream_range(opts.params, opts.queue, a, end, opts.batch_size,
                                 opts.read_timeout, opts.fail_on_data_loss, prefer=prefer,
                                 reconnect_timeout=opts.reconnect_timeout)
    if end <= start:
        return
    if opts.stream_read == "amqp" or not opts.admin_url:
        yield from over_amqp(start)
        return
    parts = read_chunks(opts.admin_url, opts.params, opts.queue, start, end, opts.batch_size,
                        opts.read_timeout)
    try:
        covered_from, covered_to = next(parts)
    except ChunksUnavailable as exc:
        if opts.stream_read == "chunks":
            raise
        log.info("stream '%s': %s; reading over AMQP", opts.queue, exc)
        yield from over_amqp(start)
        return
    if covered_from > start:
        _data_lost(opts.queue, start, covered_from, opts.fail_on_data_loss)
    resume = max(covered_from, start)  # the next offset to yield
    try:
        for got in parts:
            if isinstance(got, DeliveryBatch):
                last = got.offsets[-1]
                yield from batches(got, opts.queue, True, opts.batch_size)
            else:
                last = got.column("offset")[-1].as_py()
                yield got
            resume = last + 1
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # the admin API's node died or the answer broke off: the rest over AMQP, which tries
        # the url's nodes (a cluster failing over)
        log.warning("stream '%s': reading chunks stopped at offset %d (%s); the rest over AMQP",
                    opts.queue, resume, exc)
        yield from over_amqp(resume)
        return
    if covered_to < end:  # published, not committed when asked: over AMQP
        yield from over_amqp(max(covered_to, resume))


def read_stream_range(params: ConnectionParams, queue: str, start: int, end: int,
                      batch_rows: int = 10000, read_timeout: float = 30.0,
                      fail_on_data_loss: bool = True, prefer: int = 0,
                      reconnect_timeout: float = 30.0) -> Iterator:
    """Yield Arrow batches with exactly the messages whose offset is in [start, end).

    If the connection is lost (its node died), the read reconnects, to the next node of the
    url when it lists several (trying them again for ``reconnect_timeout`` s while a cluster
    fails over), and resumes at the offset after the last one it kept: offsets never change,
    so nothing is read twice or skipped.  It gives up after as many lost connections in a row
    as the url has nodes (at least 2)."""
    if end <= start:
        return
    credit = min(max(batch_rows, 1000), MAX_PREFETCH)
    attempts = max(2, len(params.nodes()))
    state = _RangeState(start)
    failures = 0
    conn = None
    try:
        while state.resume < end:
            if failures:  # a node died: its cluster may be failing over
                conn = connect_retrying(params, reconnect_timeout, prefer=prefer + failures)[0]
            else:
                conn = connect(params, prefer)
            try:
                conn.basic_qos(credit)
                consume_stream(conn, queue, state.resume)
                yield from _read_from(conn, queue, state, end, batch_rows, credit, read_timeout,
                                      fail_on_data_loss)
            except ConnectionClosed as exc:
                conn.abort()
                failures += 1
                if failures >= attempts:
                    raise
                log.warning("stream '%s': connection lost at offset %d (%s); reconnecting",
                            queue, state.resume, exc)
                continue
            failures = 0
        if state.rows:
            yield from batches(state.rows, queue, True, batch_rows)
    except BaseException:
        if conn is not None:
            conn.abort()
        raise
    else:
        if conn is not None:
            conn.close()


class _RangeState:
    """Progress of a range read, kept across reconnections."""
    __slots__ = ("resume", "rows", "last")

    def __init__(self, start: int) -> None:
        self.resume = start                   # next offset to keep
        self.last: int | None = None          # last offset received
        self.rows = DeliveryBatch()           # kept, not yielded yet


def _read_from(conn: Connection, queue: str, state: _RangeState, end: int, batch_rows: int,
               credit: int, read_timeout: float, fail_on_data_loss: bool):
    """Consume from ``state.resume`` (the consumer is open) until ``end``, yielding full
    batches; ``state`` always says what was kept, even when the connection fails."""
    first = True
    last = None
    start = state.resume
    while state.resume < end:
        got = conn.take_batch(credit, read_timeout)
        if not got:
            raise TimeoutError(
                f"stream '{queue}': no delivery for {read_timeout:.0f}s while reading offsets "
                f"[{start}, {end}) (last offset seen: {last}); were they removed by retention?")
        offsets = got.offsets
        if None in offsets:
            raise AMQPError(f"queue '{queue}' is not a stream queue (delivery without "
                            f"x-stream-offset header)")
        if first:
            first = False
            if offsets[0] > start:
                _data_lost(queue, start, offsets[0], fail_on_data_loss)
        _keep(got, offsets, state, end)
        last = state.last
        conn.basic_ack(got.last_tag, multiple=True)  # stream credit
        if len(state.rows) >= batch_rows:
            rows, state.rows = state.rows, DeliveryBatch()
            yield from batches(rows, queue, True, batch_rows)


def _keep(got: DeliveryBatch, offsets: list[int], state: _RangeState, end: int) -> None:
    """Add to ``state.rows`` the deliveries with offsets in [state.resume, end), in order;
    ignore the ones below (a stream may start at the beginning of a chunk) and stop at
    ``end``."""
    n = len(offsets)
    state.last = offsets[-1]
    lo, resume = offsets[0], state.resume
    if offsets == list(range(lo, lo + n)):      # consecutive offsets: the usual case
        a = min(max(resume - lo, 0), n)
        b = min(max(end - lo, 0), n)
        if b > a:
            state.rows.extend(got.slice(a, b))
            state.resume = lo + b
        if b < n:
            state.resume = end
        return
    keep = []
    for i, off in enumerate(offsets):
        if off < state.resume:
            continue
        if off >= end:
            state.resume = end
            break
        keep.append(i)
        state.resume = off + 1
        if state.resume >= end:
            break
    for i in keep:
        state.rows.extend(got.slice(i, i + 1))
