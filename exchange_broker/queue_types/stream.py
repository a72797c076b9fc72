"""Stream queues (``x-queue-type: stream``): an append-only log consumers replay by offset.

What clients see (checked against RabbitMQ 3.10):

* ``queue.declare`` with ``x-queue-type: stream`` must be durable, not exclusive and not
  auto-delete (406 ``invalid property 'non-durable' | 'exclusive-owner' | 'auto-delete'``);
  ``classic`` or no type is the ordinary queue, anything else is 406 ``unsupported queue
  type``. Queue arguments a stream does not support (``x-max-length``, ``x-message-ttl``,
  DLX, ``x-max-priority`` ...) are 406 ``... of queue type rabbit_stream_queue``.
* Publishing appends; consuming removes nothing. Offsets start at 0 and rise by one per
  message. Every delivery carries the header ``x-stream-offset`` (AMQP type ``l``).
* ``basic.consume`` needs a per-consumer prefetch (``basic.qos`` global=false; else 406
  ``consumer prefetch count is not set for ...``), manual acks (no-ack is 540), takes the
  argument ``x-stream-offset``: ``"first"``, ``"last"``, ``"next"`` (the default), a
  numeric offset, an AMQP timestamp, or an interval string (``"1h"``: now minus one hour).
  ``basic.get``, ``queue.purge``, ``basic.nack`` and ``basic.reject`` are 540.
* ``"last"`` means the last message in the stream (RabbitMQ: the first message of the
  last chunk; this broker has no chunks, so its "chunk" is one message).
* Retention: ``x-max-length-bytes`` and ``x-max-age`` (``7D``, ``12h``; units Y M D h m s)
  drop whole segments (``x-stream-max-segment-size-bytes``, default 500 MB, as RabbitMQ)
  from the head; the active segment is never dropped. A message's size is its body plus its
  raw content-header properties. Byte retention is applied when a segment fills up; age
  retention when a segment fills up or any later message arrives, and when a consumer
  attaches. A consumer asking for a truncated offset starts at the first one kept.

Named consumers (offset tracking), two ways:

* AMQP: the consume argument ``x-stream-consumer-name: "<name>"``. The broker records, per
  name, the offset of the last message acked by that consumer (the acked prefix of its
  deliveries, in delivery order). A later consume with the same name and no
  ``x-stream-offset`` resumes at the stored offset + 1 (no stored offset: ``next``). An
  explicit ``x-stream-offset`` wins but acks are still recorded under the name.
* Admin: :meth:`Broker.stream_offset`, :meth:`Broker.set_stream_offset`,
  :meth:`Broker.stream_offsets`, :meth:`Broker.stream_info` (for the REST layer).

Storage: with the SQL store each message is a row of ``messages`` with
``seq = offset + 1`` and ``created_ms`` = its append time (monotonic), so offsets and
timestamp seeks survive a restart; acks never remove rows; retention deletes the dropped
segments' rows (``seq <= first kept offset``). Named offsets are rows of
``stream_offsets``. Only a bounded tail (:data:`TAIL_MAX` messages, all committed except
the newest) is kept in memory; consumers that are behind read the older offsets back from
the store on the executor, in blocks of :data:`BLOCK` offsets that the stream's consumers
share (a small LRU of :data:`BLOCK_CACHE` blocks). Without a store (in-memory broker) the
whole log is in memory (subject to retention).
"""

from __future__ import annotations

import bisect
import datetime
import logging
import os
import re
import struct
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from exchange_broker.core.message import Message
from exchange_broker.core.names import describe
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.classic import Queue
from exchange_broker.core.queue_args import QueueOptions

if TYPE_CHECKING:
    from exchange_broker.connection.consumer import Consumer

log = logging.getLogger("exchange_broker.stream")

DEFAULT_SEGMENT_BYTES = 500_000_000   # RabbitMQ's x-stream-max-segment-size-bytes default
TAIL_MAX = int(os.environ.get("EXCHANGE_BROKER_STREAM_TAIL", 50_000))  # stored stream: in memory
BLOCK = 4096                          # offsets per block read back from the store
BLOCK_CACHE = 8                       # blocks a stream keeps (shared by its consumers)
UNCOMMITTED_HIGH = 100_000            # appends awaiting commit before publishers are paused
OFFSET_FLUSH_DELAY = 0.2              # seconds: named offsets are written at most this often

# Queue arguments RabbitMQ knows; those not in STREAM_ARGS are refused for a stream.
KNOWN_QUEUE_ARGS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator", "x-queue-master-locator",
    "x-delivery-limit", "x-dead-letter-strategy"))
STREAM_ARGS = frozenset(("x-queue-type", "x-max-length-bytes", "x-max-age",
                         "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                         "x-queue-leader-locator"))
CONSUMER_NAME_ARG = "x-stream-consumer-name"

_AGE_RE = re.compile(r"^(\d+)([YMDhms])$")
_AGE_UNIT_MS = {"Y": 365 * 86400_000, "M": 30 * 86400_000, "D": 86400_000, "h": 3600_000,
                "m": 60_000, "s": 1000}


def _norm(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _amqp_type(value) -> str:
    """RabbitMQ's name for the AMQP field type a decoded value arrived as."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -2 ** 31 <= value < 2 ** 31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, (bytes, bytearray)):
        return "bytearray"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return "void" if value is None else type(value).__name__


def _erl(value) -> str:
    """An Erlang-ish rendering of a value for RabbitMQ-style error terms."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    return str(value)


def parse_interval_ms(value) -> int | None:
    """``7D``/``12h``/``30m``... as milliseconds (> 0), or None when not such a string."""
    if not isinstance(value, str):
        return None
    match = _AGE_RE.match(value)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * _AGE_UNIT_MS[match.group(2)]


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- declaring ----------------------------------------------------------------------------------
def make_typed_queue(broker, vhost, name: str, durable: bool, owner, auto_delete: bool,
                     arguments: dict) -> "StreamQueue | None":
    """Broker.make_queue's hook: None for a classic queue, a StreamQueue for a stream, else 406."""
    qtype = _norm(arguments.get("x-queue-type"))
    if qtype is None or qtype == "classic":
        return None
    desc = describe("queue", name, vhost.name)
    if qtype != "stream":
        raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for {desc}: "
                        f"\"unsupported queue type '{qtype}'\"", 50, 10, hard=False)
    check_stream_arguments(desc, arguments)
    for bad, prop in ((not durable, "non-durable"), (owner is not None, "exclusive-owner"),
                      (auto_delete, "auto-delete")):
        if bad:
            raise AMQPError(PRECONDITION_FAILED, f"invalid property '{prop}' for {desc}", 50, 10,
                            hard=False)
    return StreamQueue(broker, vhost.name, name, arguments)


def check_stream_arguments(desc: str, arguments: dict) -> None:
    def bad(arg: str, why: str | None = None) -> AMQPError:
        text = f"invalid arg '{arg}' for {desc}"
        text += f": {why}" if why is not None else " of queue type rabbit_stream_queue"
        return AMQPError(PRECONDITION_FAILED, text, 50, 10, hard=False)

    for arg in arguments:
        if arg in KNOWN_QUEUE_ARGS and arg not in STREAM_ARGS:
            raise bad(arg)
    for arg in ("x-max-length-bytes", "x-stream-max-segment-size-bytes"):
        if arg in arguments:
            value = arguments[arg]
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(arg, f'"expected integer, got {_amqp_type(value)}"')
            if value < 0:
                raise bad(arg, f"{{value_negative,{value}}}")
    if "x-max-age" in arguments:
        value = _norm(arguments["x-max-age"])
        if not isinstance(value, str):
            raise bad("x-max-age", f"{{unacceptable_type,{_amqp_type(value)}}}")
        if parse_interval_ms(value) is None:
            raise bad("x-max-age", "invalid_max_age")


# -- the x-stream-offset header -------------------------------------------------------------------
_OFFSET_KEY = b"\x0fx-stream-offset"
_ENTRY_LEN = 16 + 1 + 8                  # key shortstr (len + 15 bytes), type 'l', int64
_U32 = struct.Struct(">I")


def _template(raw: bytes) -> tuple[bytes, bytes]:
    """(head, tail): ``head + int64 offset + tail`` are ``raw`` with the x-stream-offset header."""
    flags, pos = codec.headers_offset(raw)
    if flags & codec.FLAG_HEADERS:
        size = _U32.unpack_from(raw, pos)[0]
        table = raw[pos + 4:pos + 4 + size]
        if _OFFSET_KEY in table:  # e.g. a stream message republished: replace, don't duplicate
            props = codec.parse_properties(raw)
            headers = dict(props.get("headers") or {})
            if headers.pop("x-stream-offset", None) is not None:
                props["headers"] = headers
                return _template(codec.encode_properties(props))
        return (b"".join((raw[:pos], _U32.pack(size + _ENTRY_LEN), table, _OFFSET_KEY, b"l")),
                raw[pos + 4 + size:])
    flags |= codec.FLAG_HEADERS
    return (b"".join((bytes((flags >> 8, flags & 0xFF)), raw[2:pos], _U32.pack(_ENTRY_LEN),
                      _OFFSET_KEY, b"l")), raw[pos:])


_TEMPLATES: dict[bytes, tuple[bytes, bytes]] = {}
_I64 = struct.Struct(">q")


def with_offset_header(raw: bytes, offset: int) -> bytes:
    """Raw content-header properties with ``x-stream-offset: offset`` (AMQP type ``l``, long)
    added to the headers table. Spliced into the bytes, no decode/encode: a template per
    distinct properties value is cached, so the common case is two concatenations."""
    t = _TEMPLATES.get(raw)
    if t is None:
        if len(_TEMPLATES) >= 4096:
            _TEMPLATES.clear()
        t = _TEMPLATES[raw] = _template(bytes(raw))
    return t[0] + _I64.pack(offset) + t[1]


class _Delivery(Message):
    """What stream consumers are sent (shared by all of them): the properties carry the
    x-stream-offset header, and it is never 'stored', so acking it removes no row."""

    __slots__ = ()


def _delivery(exchange: str, routing_key: str, properties: bytes, body: bytes, offset: int,
              created_ms: int, queue) -> Message:
    m = _Delivery(exchange, routing_key, with_offset_header(properties, offset), body, True, 0)
    m.seq = offset + 1
    m.created_ms = created_ms
    m.queue = queue
    return m


def _read_block(store, queue_id: int, start: int, end: int, queue) -> list:
    """Executor: offsets [start, end) as delivery messages, a dense list (None for a missing row)."""
    out: list = [None] * (end - start)
    for seq, exchange, routing_key, props, body, created in store.read_log(queue_id, start, end):
        out[seq - 1 - start] = _delivery(exchange, routing_key, props, body, seq - 1, created, queue)
    return out


# -- consume arguments ----------------------------------------------------------------------------
def parse_offset_spec(value, desc: str) -> tuple:
    """x-stream-offset → ("first",) | ("last",) | ("next",) | ("offset", n) | ("time", ms)."""
    value = _norm(value)
    if value is None:
        return ("next",)
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return (value,)
        interval = parse_interval_ms(value)
        if interval is not None:
            return ("time", _now_ms() - interval)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return ("offset", value)
    elif isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return ("time", int(value.timestamp() * 1000))
    raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for {desc}: "
                    f"{{invalid_stream_offset_arg,{{{_amqp_type(value)},{_erl(value)}}}}}",
                    60, 20, hard=False)


def refuse_reject(channel, delivery_tag: int, multiple: bool, kind: int) -> None:
    """Channel.ack's hook for basic.nack (kind 1) / basic.reject (kind 2): 540 when the
    acknowledgement covers a stream delivery, as RabbitMQ."""
    unacked = channel.unacked
    if multiple:
        entries = []
        for tag, entry in unacked.items():
            if delivery_tag and tag > delivery_tag:
                break
            entries.append(entry)
    else:
        entry = unacked.get(delivery_tag)
        entries = [entry] if entry is not None else []
    for msg, _consumer in entries:
        q = msg.queue
        if q is not None and q.is_stream:
            raise AMQPError(NOT_IMPLEMENTED, f"basic.nack and basic.reject not supported by "
                            f"stream queues {describe('queue', q.name, q.vhost)}",
                            60, 120 if kind == 1 else 90, hard=True)


class Reader:
    """One consumer's position in the stream."""

    __slots__ = ("consumer", "cursor", "name", "min_ts", "ready", "inflight")

    def __init__(self, consumer: "Consumer", name: str | None) -> None:
        self.consumer = consumer
        self.cursor = 0                   # next offset to deliver
        self.name = name                  # named consumer: acked offsets are recorded
        self.min_ts = 0                   # timestamp seek: skip messages older than this
        self.ready = False                # start offset resolved
        self.inflight: deque[tuple[int, int]] = deque()  # (delivery tag, offset), unreconciled


class StreamQueue(Queue):
    is_stream = True
    queue_type = "stream"

    def __init__(self, broker, vhost: str, name: str, arguments: dict) -> None:
        # classic options stay at their defaults: x-max-length-bytes means retention here
        super().__init__(vhost, name, True, None, False, arguments, QueueOptions())
        self.broker = broker
        self.max_bytes = int(arguments.get("x-max-length-bytes") or 0)
        self.max_age_ms = parse_interval_ms(_norm(arguments.get("x-max-age"))) or 0
        self.segment_bytes = int(arguments.get("x-stream-max-segment-size-bytes") or 0) \
            or DEFAULT_SEGMENT_BYTES
        self.first_offset = 0
        self.next_offset = 0
        self.last_ts = 0
        # in-memory tail: tail[i] is the message of offset tail_base + i (as appended, or its
        # _Delivery once delivered)
        self.tail: list[Message] = []
        self.tail_base = 0
        self._pending: deque = deque()     # (first offset, waiter) of uncommitted appends
        self._last_waiter = None
        self._hooked = False
        # segments: [start offset, bytes, newest timestamp]; the last one is active
        self.segments: list[list[int]] = [[0, 0, 0]]
        self.total_bytes = 0
        self.readers: dict = {}            # Consumer -> Reader
        # blocks of older offsets read back from the store, shared by the consumers behind
        self._blocks: "OrderedDict[int, tuple[list, int, int]]" = OrderedDict()  # no -> msgs, start, end
        self._loading: dict[int, set] = {}   # block no -> readers waiting for it
        self._draining: list[Reader] = []  # cancelled named readers whose acks may still come
        self.offsets: dict[str, int] = {}  # named consumer offsets
        self._dirty_offsets: dict[str, int] = {}
        self._offset_flush = None

    # -- state -----------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.next_offset - self.first_offset

    @property
    def _durability(self):
        """The SQL durability (``.store``, ``.loop``) when this stream is stored, else None."""
        if self.store_id is None:
            return None
        d = self.broker.durability
        return d if getattr(d, "enabled", False) else None

    def info(self) -> dict:
        return {"first_offset": self.first_offset, "next_offset": self.next_offset,
                "last_offset": self.next_offset - 1 if self.next_offset > self.first_offset else None,
                "messages": self.message_count, "bytes": self.total_bytes,
                "segments": len(self.segments), "in_memory": len(self.tail),
                "consumers": len(self.readers), "offsets": dict(self.offsets),
                "max_length_bytes": self.max_bytes, "max_age_ms": self.max_age_ms,
                "segment_bytes": self.segment_bytes}

    # -- operations a stream refuses (RabbitMQ: 540, connection error) -----------------------------
    def _unsupported(self, what: str, class_id: int, method_id: int) -> AMQPError:
        return AMQPError(NOT_IMPLEMENTED, f"{what} not supported by stream queues "
                         f"{describe('queue', self.name, self.vhost)}", class_id, method_id,
                         hard=True)

    def get(self):
        raise self._unsupported("basic.get", 60, 70)

    def purge(self):
        raise self._unsupported("queue.purge", 50, 30)

    def requeue(self, msgs) -> None:
        """Channel close / basic.recover: nothing to put back, the log keeps every message.
        After basic.recover the recovering consumer rewinds to its first unacked offset."""
        for r in self.readers.values():
            ch = r.consumer.channel
            if ch.closed or not r.inflight or r.inflight[0][0] in ch.unacked:
                continue
            # every delivery of this channel was just taken back: redeliver from the first
            r.cursor = r.inflight[0][1]
            r.inflight.clear()
            r.min_ts = 0

    def push(self, msg: Message) -> None:
        self.append(msg)

    # -- appending ---------------------------------------------------------------------------------
    def append(self, m: Message, publisher=None):
        """Broker.publish's hook: add one routed message; returns the durability waiter or None."""
        off = self.next_offset
        self.next_offset = off + 1
        seq = off + 1
        self.next_seq = seq + 1
        m.seq = seq
        m.queue = self
        now = _now_ms()
        ts = now if now > self.last_ts else self.last_ts
        self.last_ts = ts
        m.created_ms = ts
        m.expires_ms = None
        m.priority = 0
        waiter = None
        if self.store_id is not None:
            durability = self.broker.durability
            waiter = durability.append(self, m)
            if waiter is not None:
                if waiter is not self._last_waiter:
                    self._last_waiter = waiter
                    self._pending.append((off, waiter))
                if not self._hooked and hasattr(durability, "on_commit"):
                    self._hooked = True
                    durability.on_commit.append(self._on_commit)
        self.tail.append(m)  # made a _Delivery when first delivered
        self.stats_published += 1
        # segments and retention
        size = len(m.body) + len(m.properties)
        segs = self.segments
        seg = segs[-1]
        rolled = False
        if seg[1] >= self.segment_bytes:
            seg = [off, 0, ts]
            segs.append(seg)
            rolled = True
        seg[1] += size
        seg[2] = ts
        self.total_bytes += size
        if rolled or (self.max_age_ms and len(segs) > 1 and segs[0][2] < ts - self.max_age_ms):
            self.apply_retention(ts)
        if self.store_id is not None:
            if len(self.tail) > TAIL_MAX + 1024:
                self._trim_tail()
            pending = self._pending
            if publisher is not None and pending and off - pending[0][0] > UNCOMMITTED_HIGH:
                while pending and pending[0][1].done:
                    pending.popleft()
                if pending and off - pending[0][0] > UNCOMMITTED_HIGH:
                    publisher.throttle(self)
        # wake consumers waiting at the end of the log
        if self.readers:
            for r in self.readers.values():
                if r.cursor == off and r.ready:
                    self._pump(r)
        return waiter

    def _on_commit(self) -> None:
        """After each committed batch: uncommitted bookkeeping, tail trimming, flow release."""
        if self.deleted:
            try:
                self.broker.durability.on_commit.remove(self._on_commit)
            except (AttributeError, ValueError):
                pass
            return
        pending = self._pending
        while pending and pending[0][1].done:
            pending.popleft()
        if not pending:
            self._last_waiter = None
        if len(self.tail) > TAIL_MAX:
            self._trim_tail()
        if self.flow_blocked and (not pending or
                                  self.next_offset - pending[0][0] < UNCOMMITTED_HIGH // 2):
            self.release_publishers()

    def _trim_tail(self) -> None:
        """Drop the oldest in-memory messages beyond TAIL_MAX, only committed ones."""
        pending = self._pending
        while pending and pending[0][1].done:
            pending.popleft()
        bound = pending[0][0] if pending else self.next_offset
        keep_from = self.next_offset - TAIL_MAX
        new_base = min(keep_from, bound)
        if new_base > self.tail_base:
            self._drop_tail_before(new_base)

    def _drop_tail_before(self, offset: int) -> None:
        offset = min(offset, self.next_offset)
        if offset > self.tail_base:
            del self.tail[:offset - self.tail_base]
            self.tail_base = offset

    # -- retention ----------------------------------------------------------------------------------
    def apply_retention(self, now: int | None = None) -> None:
        segs = self.segments
        if len(segs) < 2 or not (self.max_bytes or self.max_age_ms):
            return
        now = _now_ms() if now is None else now
        drop = 0
        total = self.total_bytes
        while len(segs) - drop > 1:
            s = segs[drop]
            if (self.max_bytes and total > self.max_bytes) or \
                    (self.max_age_ms and s[2] < now - self.max_age_ms):
                total -= s[1]
                drop += 1
            else:
                break
        if not drop:
            return
        del segs[:drop]
        self.total_bytes = total
        self.truncate(segs[0][0])

    def truncate(self, first: int) -> None:
        """Forget every offset below ``first`` (memory and store)."""
        if first <= self.first_offset:
            return
        self.first_offset = first
        if self.tail_base < first:
            self._drop_tail_before(first)
        st = self._durability
        if st is not None and not self.deleted:
            qid = self.store_id
            st._definition(lambda s: s.delete_messages_upto(qid, first))

    # -- consumers ----------------------------------------------------------------------------------
    def check_consume(self, channel, method) -> None:
        """Session._basic_consume's hook, before consume-ok: RabbitMQ's rules and their order."""
        desc = describe("queue", self.name, self.vhost)
        args = method.arguments or {}
        if "x-priority" in args:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for {desc} of queue "
                            f"type rabbit_stream_queue", 60, 20, hard=False)
        parse_offset_spec(args.get("x-stream-offset"), desc)
        name = args.get(CONSUMER_NAME_ARG)
        if name is not None and not isinstance(_norm(name), str):
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{CONSUMER_NAME_ARG}' for {desc}: "
                            f"expected a string", 60, 20, hard=False)
        if not channel.prefetch:
            raise AMQPError(PRECONDITION_FAILED, f"consumer prefetch count is not set for "
                            f"'{desc}'", 60, 20, hard=False)
        if method.no_ack:
            raise self._unsupported("automatic acknowledgement", 60, 20)

    def add_consumer(self, consumer: "Consumer") -> None:
        args = consumer.arguments or {}
        name = _norm(args.get(CONSUMER_NAME_ARG))
        r = Reader(consumer, name if isinstance(name, str) else None)
        self.had_consumer = True
        self.consumers.append(consumer)
        self.readers[consumer] = r
        if self.max_age_ms:
            self.apply_retention()
        raw = args.get("x-stream-offset")
        if raw is None and r.name is not None and r.name in self.offsets:
            spec = ("offset", self.offsets[r.name] + 1)
        else:
            spec = parse_offset_spec(raw, describe("queue", self.name, self.vhost))
        self._start(r, spec)

    def _start(self, r: Reader, spec: tuple) -> None:
        kind = spec[0]
        if kind == "first":
            r.cursor = self.first_offset
        elif kind == "last":
            r.cursor = max(self.first_offset, self.next_offset - 1)
        elif kind == "next":
            r.cursor = self.next_offset
        elif kind == "offset":
            r.cursor = min(max(spec[1], self.first_offset), self.next_offset)
        else:  # time
            ts = spec[1]
            r.min_ts = ts
            tail = self.tail
            st = self._durability
            if st is None or self.tail_base <= self.first_offset or \
                    (tail and tail[0].created_ms < ts):
                i = bisect.bisect_left(tail, ts, key=lambda m: m.created_ms)
                r.cursor = self.tail_base + i
            else:
                # may be older than the in-memory tail: find it in the store, off the loop
                base = self.tail_base
                fut = st.loop.run_in_executor(None, st.store.find_seq_at_time, self.store_id, ts)
                fut.add_done_callback(lambda f: self._started_at(r, f, base))
                return
        r.ready = True
        self._pump(r)

    def _started_at(self, r: Reader, fut, base: int) -> None:
        exc = fut.exception()
        if exc is not None:
            log.error("stream '%s': timestamp lookup failed: %s", self.name, exc)
            seq = None
        else:
            seq = fut.result()
        r.cursor = max(self.first_offset, seq - 1 if seq else base)
        r.ready = True
        if r.consumer.active and not self.deleted:
            self._pump(r)

    def remove_consumer(self, consumer: "Consumer") -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        r = self.readers.pop(consumer, None)
        if r is not None and r.name is not None:
            if self._reconcile(r):
                self._draining.append(r)  # acks may still arrive after basic.cancel
            self._flush_offsets()

    def dispatch(self) -> None:
        if self.deleted:
            return
        if self._draining:
            before = len(self._draining)
            self._draining = [r for r in self._draining if self._reconcile(r)]
            if len(self._draining) < before:
                self._flush_offsets()  # a cancelled consumer's last acks: write them now
        for r in list(self.readers.values()):
            if r.inflight:
                self._reconcile(r)
            if r.ready:
                self._pump(r)

    def congested(self) -> bool:
        return False

    # -- delivery -----------------------------------------------------------------------------------
    def _pump(self, r: Reader) -> None:
        """Deliver to one consumer from its cursor while it has credit."""
        c = r.consumer
        if self.deleted or not c.active:
            return
        ch = c.channel
        can_take = c.can_take
        tail = self.tail
        inflight = r.inflight
        blk = None
        blk_start = blk_end = 0
        while can_take():
            cur = r.cursor
            if cur < self.first_offset:
                cur = r.cursor = self.first_offset
            if cur >= self.next_offset:
                return
            if cur >= self.tail_base:
                msg = tail[cur - self.tail_base]
                if type(msg) is not _Delivery:  # as appended: never deliver that one (stored)
                    msg = tail[cur - self.tail_base] = _delivery(
                        msg.exchange, msg.routing_key, msg.properties, msg.body, cur,
                        msg.created_ms, self)
            else:
                if not blk_start <= cur < blk_end:
                    got = self._block(cur, r)
                    if got is None:
                        return  # being read back; the read's completion pumps again
                    blk, blk_start, blk_end = got
                msg = blk[cur - blk_start]
                if msg is None:  # no row (a failed write): skip the offset
                    r.cursor = cur + 1
                    continue
            r.cursor = cur + 1
            if r.min_ts:
                if msg.created_ms < r.min_ts:
                    continue
                r.min_ts = 0
            inflight.append((ch.next_tag, cur))
            self.stats_delivered += 1
            ch.deliver(c, msg)

    def _block(self, offset: int, r: Reader | None) -> "tuple[list, int, int] | None":
        """The cached block holding ``offset`` (starting the read of the next one ahead), or None
        after starting (or joining) its read-back; ``r`` is pumped when it completes."""
        no = offset // BLOCK
        got = self._blocks.get(no)
        if got is not None and offset < got[2]:
            self._blocks.move_to_end(no)
            nxt = no + 1
            if nxt not in self._blocks and nxt not in self._loading and \
                    nxt * BLOCK < self.tail_base and offset - got[1] >= BLOCK // 4:
                self._load(nxt, None)
            return got
        self._load(no, r)
        return None

    def _load(self, no: int, r: Reader | None) -> None:
        waiting = self._loading.get(no)
        if waiting is not None:
            if r is not None:
                waiting.add(r)
            return
        st = self._durability
        start = max(no * BLOCK, self.first_offset)
        end = min((no + 1) * BLOCK, self.tail_base)
        if st is None or start >= end:  # nothing stored there (not expected): skip ahead
            if r is not None:
                r.cursor = max(r.cursor, self.tail_base)
                self.broker.call_later(0, lambda: self._pump(r))
            return
        self._loading[no] = {r} if r is not None else set()
        fut = st.loop.run_in_executor(None, _read_block, st.store, self.store_id, start, end, self)
        fut.add_done_callback(lambda f: self._loaded(no, start, end, f))

    def _loaded(self, no: int, start: int, end: int, fut) -> None:
        waiting = self._loading.pop(no, set())
        if self.deleted:
            return
        exc = fut.exception()
        if exc is not None:
            log.error("stream '%s': reading back from the store failed: %s", self.name, exc)
            for r in waiting:
                self._durability.loop.call_later(1.0, self._pump, r)
            return
        blocks = self._blocks
        blocks[no] = (fut.result(), start, end)
        blocks.move_to_end(no)
        while len(blocks) > BLOCK_CACHE:
            blocks.popitem(last=False)
        for r in waiting:
            if self.readers.get(r.consumer) is r:
                self._pump(r)

    # -- named consumer offsets -----------------------------------------------------------------------
    def _reconcile(self, r: Reader) -> bool:
        """Forget the acked prefix of a consumer's deliveries (recording the last one's offset for
        a named consumer); True while some remain unacked. Run after acks (dispatch)."""
        ch = r.consumer.channel
        inflight = r.inflight
        if ch.closed:  # closing took everything back unacked: nothing more was processed
            inflight.clear()
            return False
        unacked = ch.unacked
        last = None
        while inflight and inflight[0][0] not in unacked:
            last = inflight.popleft()[1]
        if last is not None and r.name is not None:
            self.set_offset(r.name, last, flush=False)
        return bool(inflight)

    def query_offset(self, name: str) -> int | None:
        return self.offsets.get(name)

    def set_offset(self, name: str, offset: int, flush: bool = True) -> None:
        self.offsets[name] = int(offset)
        if self._durability is None:
            return
        self._dirty_offsets[name] = int(offset)
        if flush:
            self._flush_offsets()
        elif self._offset_flush is None:
            loop = self._durability.loop
            self._offset_flush = loop.call_later(OFFSET_FLUSH_DELAY, self._flush_offsets)

    def _flush_offsets(self) -> None:
        if self._offset_flush is not None:
            self._offset_flush.cancel()
            self._offset_flush = None
        st = self._durability
        if not self._dirty_offsets or st is None or self.deleted:
            return
        items, self._dirty_offsets = self._dirty_offsets, {}
        vhost, queue = self.vhost, self.name

        def write(store) -> None:
            for name, off in items.items():
                store.store_offset(vhost, queue, name, off)
        try:
            st._definition(write)
        except RuntimeError:  # writer already stopped (shutdown)
            pass

    # -- recovery -----------------------------------------------------------------------------------
    def restore(self, durability, row: dict) -> None:
        """Rebuild the log's state from its stored rows (no message bodies are loaded)."""
        store = durability.store
        count = row.get("message_count") or 0
        max_seq = row.get("max_seq") or 0
        self.next_offset = max_seq
        self.next_seq = max_seq + 1
        self.first_offset = (row.get("min_seq") or 1) - 1 if count else max_seq
        self.tail_base = self.next_offset
        self.offsets = store.load_offsets(self.vhost, self.name)
        if count:
            last = store.load_messages(self.store_id, max_seq - 1, 1)
            if last:
                self.last_ts = last[0].created_ms
        segs = [[self.first_offset, 0, 0]]
        total = 0
        if count and (self.max_bytes or self.max_age_ms):
            limit = self.segment_bytes
            seg = segs[0]
            for seq, size, created in store.iter_message_sizes(self.store_id):
                if seg[1] >= limit:
                    seg = [seq - 1, 0, created]
                    segs.append(seg)
                seg[1] += size
                seg[2] = created
                total += size
        elif count:
            total = store.log_bytes(self.store_id)
            segs[0][1], segs[0][2] = total, self.last_ts
        self.segments = segs
        self.total_bytes = total


# -- admin facade (Broker delegates here) --------------------------------------------------------------
def find_stream(broker, vhost: str, queue: str) -> StreamQueue:
    vh = broker.vhosts.get(vhost)
    q = vh.queues.get(queue) if vh is not None else None
    if q is None:
        raise KeyError(f"no queue '{queue}' in vhost '{vhost}'")
    if not q.is_stream:
        raise ValueError(f"queue '{queue}' in vhost '{vhost}' is not a stream")
    return q
