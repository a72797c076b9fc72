"""Stream range reads through the broker's admin API: ``GET /api/stream-chunks`` hands over a
stored stream's offsets as the store's own chunks (``persistence/stream_chunks.py``), so the broker
does no work per message and the reader slices every message out of a few large blobs.

Rows are the very rows an AMQP read of the same offsets gives (``reader.read_stream_range``): the
``x-stream-offset`` header is added to each message's headers as the broker adds it to a
delivery, and the delivery tags count from 1 in each read. What the chunks do not cover yet
(offsets published but not committed when the request was made) is read over AMQP.

``streamRead`` chooses: ``auto`` (chunks when ``adminUrl`` is given and the broker serves them,
else AMQP: e.g. RabbitMQ), ``chunks`` (fail when it cannot), ``amqp``.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from typing import Iterator

from persistence.stream_chunks import FRAME_HEAD, Chunk

from .amqp import ConnectionParams, DeliveryBatch
from .amqp.codec import EMPTY_PROPERTIES, decode_properties

log = logging.getLogger(__name__)

_NO_PROPERTIES = b"\x00\x00"
_CACHE_MAX = 1024


class ChunksUnavailable(RuntimeError):
    """The broker does not serve /api/stream-chunks for this queue (not this broker, an
    in-memory broker, no admin API): read over AMQP instead."""


def _read_exact(resp, n: int) -> bytes:
    parts, left = [], n
    while left:
        got = resp.read(left)
        if not got:
            raise ConnectionError("the admin API's answer ended in the middle of a chunk")
        parts.append(got)
        left -= len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def open_chunks(admin_url: str, params: ConnectionParams, queue: str, start: int, end: int,
                timeout: float):
    """The HTTP answer for offsets [start, end) (its ``X-Stream-From`` / ``X-Stream-To``
    headers say what it covers); ChunksUnavailable when the broker does not serve chunks."""
    url = (f"{admin_url.rstrip('/')}/api/stream-chunks/{urllib.parse.quote(params.vhost, safe='')}/"
           f"{urllib.parse.quote(queue, safe='')}?from={start}&to={end}")
    token = b64encode(f"{params.username}:{params.password}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        reason = exc.read()[:300].decode("utf-8", "replace")
        if exc.code in (401, 403):
            raise PermissionError(f"admin API {url}: {exc.code} {reason}") from None
        raise ChunksUnavailable(f"admin API {url}: {exc.code} {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ChunksUnavailable(f"admin API {url}: {exc}") from None
    if resp.headers.get("X-Stream-To") is None:
        resp.close()
        raise ChunksUnavailable(f"admin API {url}: not an answer of /api/stream-chunks")
    return resp


def _plain(chunk: Chunk) -> bool:
    """Every message of the chunk without properties, all with one exchange and routing key."""
    n = chunk.n
    start = chunk.props_at
    return chunk.index is None and chunk.pends[-1] == 2 * n and \
        chunk.data[start:start + 2 * n] == bytes(2 * n)


class _Rows:
    """Turns chunk messages into rows as AMQP deliveries give them: the columns of a
    ``DeliveryBatch``, or for runs of chunks of plain messages (no properties, one exchange and
    routing key) Arrow arrays sliced straight out of the chunks' blobs (no work per message)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.flat: list = []
        self.tag = 0
        self._names: dict = {}
        self._props: dict[bytes, object] = {}
        self._plain: list = []   # (bodies array, exchange, routing key, first offset, count)
        self.plain_rows = 0

    def add_plain(self, first: int, chunk: Chunk, lo: int, hi: int) -> None:
        import pyarrow as pa
        data = pa.py_buffer(chunk.data)
        bodies = pa.Array.from_buffers(
            pa.binary(), hi - lo,
            [None, pa.array(chunk.bends, type=pa.int32()).buffers()[1],
             data.slice(chunk.bodies_at, chunk.bends[-1])], offset=lo)
        self._plain.append((bodies, chunk.names[0][0], chunk.names[0][1], first + lo, hi - lo))
        self.plain_rows += hi - lo

    def take_plain(self):
        """The plain rows gathered so far as one Arrow RecordBatch."""
        import pyarrow as pa

        from .rows import plain_stream_batch
        pieces, self._plain, self.plain_rows = self._plain, [], 0
        n = sum(p[4] for p in pieces)

        def strings(i: int):
            return pa.concat_arrays([pa.repeat(pa.scalar(p[i], pa.string()), p[4]) for p in pieces])
        offsets = [o for p in pieces for o in range(p[3], p[3] + p[4])]
        batch = plain_stream_batch(pa.concat_arrays([p[0] for p in pieces]), strings(1),
                                   strings(2), self.tag + 1, offsets, self.queue)
        self.tag += n
        return batch

    def add(self, first: int, chunk: Chunk, lo: int, hi: int) -> None:
        names = self._names
        flat = self.flat
        for offset, exchange, routing_key, props, body, _created in chunk.rows(first, lo, hi):
            self.tag += 1
            pair = names.get((exchange, routing_key))
            if pair is None:
                pair = names[(exchange, routing_key)] = (exchange, routing_key)
            flat.extend((self.tag, False, pair, "", None if props == _NO_PROPERTIES
                         else self._properties(props, offset), body, offset))

    def _properties(self, raw: bytes, offset: int):
        """The delivery's properties: the stored ones with x-stream-offset last in the headers
        (the broker splices it in there, replacing one the message may have carried)."""
        base = self._props.get(raw)
        if base is None:
            if len(self._props) >= _CACHE_MAX:
                self._props.clear()
            base = self._props[raw] = decode_properties(raw, 2, (raw[0] << 8) | raw[1]) \
                if len(raw) > 2 else EMPTY_PROPERTIES
        headers = dict(base.headers or {})
        headers.pop("x-stream-offset", None)
        headers["x-stream-offset"] = offset
        return base._replace(headers=headers)

    def take(self) -> DeliveryBatch:
        out, self.flat = DeliveryBatch(self.flat), []
        return out


def read_chunks(admin_url: str, params: ConnectionParams, queue: str, start: int, end: int,
                batch_rows: int, timeout: float = 30.0) -> Iterator[tuple]:
    """First ``(covered_from, covered_to)``: what the answer covers (offsets below
    ``covered_from`` are gone, offsets from ``covered_to`` were not committed yet); then, in
    offset order, a ``DeliveryBatch`` or an Arrow RecordBatch (plain messages) at a time. ChunksUnavailable (when the broker
    does not serve chunks) is raised before anything is yielded."""
    resp = open_chunks(admin_url, params, queue, start, end, timeout)
    covered = (int(resp.headers["X-Stream-From"]), int(resp.headers["X-Stream-To"]))
    yield covered
    rows = _Rows(queue)
    with resp:
        while True:
            head = resp.read(FRAME_HEAD.size)
            if not head:
                break
            if len(head) < FRAME_HEAD.size:
                head += _read_exact(resp, FRAME_HEAD.size - len(head))
            first, size = FRAME_HEAD.unpack(head)
            chunk = Chunk(_read_exact(resp, size))
            lo = max(covered[0] - first, 0)
            hi = min(covered[1] - first, chunk.n)
            if lo >= hi:
                continue
            if _plain(chunk):  # in order: rows of other chunks gathered before go first
                if rows.flat:
                    yield rows.take()
                rows.add_plain(first, chunk, lo, hi)
                if rows.plain_rows >= batch_rows:
                    yield rows.take_plain()
            else:
                if rows.plain_rows:
                    yield rows.take_plain()
                rows.add(first, chunk, lo, hi)
                if len(rows.flat) >= batch_rows * 7:
                    yield rows.take()
    if rows.flat:
        yield rows.take()
    if rows.plain_rows:
        yield rows.take_plain()
