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
  last chunk; here "last" is one message, whatever chunk stores it).
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
* Admin: :meth:`StreamQueue.query_offset`, :meth:`StreamQueue.set_offset`, ``offsets`` and
  :meth:`StreamQueue.info` (the management API's stream-offsets endpoints call them).

Storage: with the SQL store the log is stored in chunks (``persistence/stream_chunks.py``: one
``stream_chunks`` row per run of messages appended in one commit), each message with
``seq = offset + 1`` and ``created_ms`` = its append time (the clock's wall time, never going back), so offsets and
timestamp seeks survive a restart; acks never remove anything; retention deletes the dropped
segments' messages (``seq <= first kept offset``). A commit of stream appends alone is not fsynced
(``serve --stream-fsync`` changes that; README, "Stream queues"). Named offsets are rows of
``stream_offsets``. Only a bounded tail (:data:`TAIL_MAX` messages, all committed except
the newest) is kept in memory; consumers that are behind read the older offsets back from
the store off the event loop (``stream_store.py``), in blocks of ``BLOCK`` offsets that the stream's consumers
share (a small LRU of ``BLOCK_CACHE`` blocks). Without a store (in-memory broker) the
whole log is in memory (subject to retention).
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import OrderedDict, deque

from exchange_broker.core.actions import Block
from exchange_broker.core.message import Message
from exchange_broker.core.names import describe
from exchange_broker.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.core.ports import Consumer
from exchange_broker.core.queue import QueueType
from exchange_broker.core.queue_args import QueueOptions
from exchange_broker.queue_types.stream_args import (CONSUMER_NAME_ARG, _norm,
                                                     check_stream_arguments, parse_interval_ms,
                                                     parse_offset_spec)
from exchange_broker.queue_types.stream_delivery import _OffsetDelivery, _delivery, _find_seq_at_time
from exchange_broker.queue_types import stream_filter
from exchange_broker.queue_types.ready import RUN_COUNT
from exchange_broker.queue_types.stream_retention import Retention
from exchange_broker.queue_types.stream_store import StoredLog

log = logging.getLogger("exchange_broker.stream")

DEFAULT_SEGMENT_BYTES = 500_000_000   # RabbitMQ's x-stream-max-segment-size-bytes default
TAIL_MAX = int(os.environ.get("EXCHANGE_BROKER_STREAM_TAIL", 50_000))  # stored stream: in memory
UNCOMMITTED_HIGH = 100_000            # appends awaiting commit before publishers are paused
class Reader:
    """One consumer's position in the stream."""

    __slots__ = ("consumer", "cursor", "name", "min_ts", "ready", "inflight", "filter")

    def __init__(self, consumer: Consumer, name: str | None) -> None:
        self.consumer = consumer
        self.cursor = 0                   # next offset to deliver
        self.name = name                  # named consumer: acked offsets are recorded
        self.min_ts = 0                   # timestamp seek: skip messages older than this
        self.ready = False                # start offset resolved
        self.inflight: deque[tuple[int, int]] = deque()  # (delivery tag, offset), unreconciled
        self.filter = stream_filter.filter_spec(consumer.arguments)  # x-stream-filter (None: all)


class StreamQueue(StoredLog, Retention, QueueType):
    queue_type = "stream"

    def __init__(self, broker, vhost: str, name: str, arguments: dict) -> None:
        # classic options stay at their defaults: x-max-length-bytes means retention here
        super().__init__(broker, vhost, name, True, None, False, arguments, QueueOptions())
        self.max_bytes = int(arguments.get("x-max-length-bytes") or 0)
        self.max_age_ms = parse_interval_ms(_norm(arguments.get("x-max-age"))) or 0
        self.segment_bytes = int(arguments.get("x-stream-max-segment-size-bytes") or 0) \
            or DEFAULT_SEGMENT_BYTES
        self.first_offset = 0
        self.next_offset = 0
        self.last_ts = 0
        # in-memory tail: tail[i] is the message of offset tail_base + i (as appended, or its
        # _OffsetDelivery once delivered)
        self.tail: list[Message] = []
        self.tail_base = 0
        self._pending: deque = deque()     # (first offset, waiter) of uncommitted appends
        self._last_waiter = None
        self._hooked = False
        self._waking = False               # a _wake of the consumers at the end is scheduled
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

    @classmethod
    def declare(cls, broker, vhost, name: str, durable: bool, owner, auto_delete: bool,
                arguments: dict) -> "StreamQueue":
        """Durable, not exclusive, not auto-delete, and only the arguments a stream knows (406)."""
        desc = describe("queue", name, vhost.name)
        check_stream_arguments(desc, arguments)
        stream_filter.check_filter_size(desc, arguments)
        for bad, prop in ((not durable, "non-durable"), (owner is not None, "exclusive-owner"),
                          (auto_delete, "auto-delete")):
            if bad:
                raise AMQPError(PRECONDITION_FAILED, f"invalid property '{prop}' for {desc}", 50, 10,
                                hard=False)
        return cls(broker, vhost.name, name, arguments)

    # -- state -----------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.next_offset - self.first_offset

    @property
    def message_bytes(self) -> int:
        return self.total_bytes

    @property
    def wants_dispatch(self) -> bool:
        return not self.deleted  # each consumer has its own backlog

    @property
    def _durability(self):
        """The durability (its ``write`` and ``read``) when this stream is stored, else None."""
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

    def check_reject(self, kind: int) -> None:
        raise self._unsupported("basic.nack and basic.reject", 60, 120 if kind == 1 else 90)

    def settle(self, msg: Message) -> None:
        pass  # acks remove nothing from the log

    def delivered(self, msg: Message) -> None:
        pass

    def purge(self):
        raise self._unsupported("queue.purge", 50, 30)

    def requeue(self, msgs) -> None:
        """Channel close / basic.recover: nothing to put back, the log keeps every message.
        After basic.recover the recovering consumer rewinds to its first unacked offset."""
        for r in self.readers.values():
            c = r.consumer
            if c.closed or not r.inflight or r.inflight[0][0] in c.outstanding:
                continue
            # every delivery of this channel was just taken back: redeliver from the first
            r.cursor = r.inflight[0][1]
            r.inflight.clear()
            r.min_ts = 0

    def enqueue(self, m: Message, publisher, per_message_ttl: int | None):
        return self.append(m, publisher)

    # -- appending ---------------------------------------------------------------------------------
    def append(self, m: Message, publisher=None):
        """Add one routed message (``enqueue``): the durability waiter, None, or a ``Block``."""
        off = self.next_offset
        self.next_offset = off + 1
        seq = off + 1
        self.next_seq = seq + 1
        m.seq = seq
        m.queue = self
        now = self.broker.now_ms()
        ts = now if now > self.last_ts else self.last_ts
        self.last_ts = ts
        m.created_ms = ts
        m.expires_ms = None
        m.priority = 0
        waiter = None
        if self.store_id is not None:
            durability = self.broker.durability
            # stored as chunks of the log; like RabbitMQ's streams, a commit of stream appends
            # alone need not be fsynced (the durability's policy decides: serve --stream-fsync)
            waiter = durability.append_log(self, m)
            if waiter is not None:
                if waiter is not self._last_waiter:
                    self._last_waiter = waiter
                    self._pending.append((off, waiter))
                if not self._hooked and hasattr(durability, "on_commit"):
                    self._hooked = True
                    durability.on_commit.append(self._on_commit)
        self.tail.append(m)  # made an _OffsetDelivery when first delivered
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
            if publisher is not None and pending and off - pending[0][0] > UNCOMMITTED_HIGH and \
                    off - self.committed_end() > UNCOMMITTED_HIGH and publisher not in self.flow_blocked:
                waiter = Block(self, waiter)  # the publishing channel stops reading its connection
        # wake consumers waiting at the end of the log: once, after this event (a batch of
        # publishes is then delivered by one pump per consumer, not one per message)
        if self.readers and not self._waking:
            for r in self.readers.values():
                if r.cursor == off and r.ready:
                    self._waking = True
                    if self.broker.clock.call_soon(self._wake) is None:  # a clock without timers
                        self._wake()
                    break
        return waiter

    def _wake(self) -> None:
        self._waking = False
        if not self.deleted:
            for r in list(self.readers.values()):
                if r.ready:
                    self._pump(r)

    def _on_commit(self) -> None:
        """After each committed batch: uncommitted bookkeeping, tail trimming, flow release."""
        if self.deleted:
            try:
                self.broker.durability.on_commit.remove(self._on_commit)
            except (AttributeError, ValueError):
                pass
            return
        uncommitted = self.next_offset - self.committed_end()
        if not self._pending:
            self._last_waiter = None
        if len(self.tail) > TAIL_MAX:
            self._trim_tail()
        if self.flow_blocked and uncommitted < UNCOMMITTED_HIGH // 2:
            self.release_publishers()

    def _trim_tail(self) -> None:
        """Drop the oldest in-memory messages beyond TAIL_MAX, only committed ones."""
        new_base = min(self.next_offset - TAIL_MAX, self.committed_end())
        if new_base > self.tail_base:
            self._drop_tail_before(new_base)

    def _drop_tail_before(self, offset: int) -> None:
        offset = min(offset, self.next_offset)
        if offset > self.tail_base:
            del self.tail[:offset - self.tail_base]
            self.tail_base = offset

    # -- consumers ----------------------------------------------------------------------------------
    def check_consume(self, channel, method) -> None:
        """Session._basic_consume's hook, before consume-ok: RabbitMQ's rules and their order."""
        desc = describe("queue", self.name, self.vhost)
        args = method.arguments or {}
        if "x-priority" in args:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for {desc} of queue "
                            f"type rabbit_stream_queue", 60, 20, hard=False)
        parse_offset_spec(args.get("x-stream-offset"), desc, 0)  # checked only
        name = args.get(CONSUMER_NAME_ARG)
        if name is not None and not isinstance(_norm(name), str):
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{CONSUMER_NAME_ARG}' for {desc}: "
                            f"expected a string", 60, 20, hard=False)
        if not channel.prefetch:
            raise AMQPError(PRECONDITION_FAILED, f"consumer prefetch count is not set for "
                            f"'{desc}'", 60, 20, hard=False)
        if method.no_ack:
            raise self._unsupported("automatic acknowledgement", 60, 20)

    def add_consumer(self, consumer: Consumer) -> None:
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
            spec = parse_offset_spec(raw, describe("queue", self.name, self.vhost),
                                     self.broker.now_ms())
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
                st.read(_find_seq_at_time, self.store_id, ts,
                        done=lambda seq, exc: self._started_at(r, seq, exc, base))
                return
        r.ready = True
        self._pump(r)

    def _started_at(self, r: Reader, seq, exc, base: int) -> None:
        if exc is not None:
            log.error("stream '%s': timestamp lookup failed: %s", self.name, exc)
            seq = None
        r.cursor = max(self.first_offset, seq - 1 if seq else base)
        r.ready = True
        if r.consumer.active and not self.deleted:
            self._pump(r)

    def remove_consumer(self, consumer: Consumer) -> None:
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
        """Deliver to one consumer from its cursor while it has credit (in runs if it takes them)."""
        c = r.consumer
        if self.deleted or not c.active:
            return
        can_take = c.can_take
        run_sink = c.deliver_run
        deliver = c.deliver
        push = r.inflight.append
        tail = self.tail
        base = self.tail_base
        end = self.next_offset
        cur = r.cursor
        if cur < self.first_offset:
            cur = self.first_offset
        min_ts = r.min_ts
        blk, blk_start, blk_end, sent = None, 0, 0, 0
        run, offsets, room = [], [], 0
        while cur < end:
            if not room:  # the run so far goes out; how many more may go?
                if run:
                    for pair in zip(run_sink(run), offsets):
                        push(pair)
                    sent += len(run)
                    run, offsets = [], []
                if not can_take():
                    break
                room = min(RUN_COUNT, c.room()) if run_sink is not None else 1
            if cur >= base:
                msg = tail[cur - base]
                if type(msg) is not _OffsetDelivery:  # as appended: never deliver that one (stored)
                    msg = tail[cur - base] = _delivery(msg.exchange, msg.routing_key,
                                                       msg.properties, msg.body, cur,
                                                       msg.created_ms, self)
            else:
                if not blk_start <= cur < blk_end:
                    r.cursor = cur
                    got = self._block(cur, r)
                    if got is None:  # being read back; the read's completion pumps again
                        break
                    blk, blk_start, blk_end = got
                msg = blk[cur - blk_start]
                if msg is None:  # no row (a failed write): skip the offset
                    cur += 1
                    continue
            if min_ts:
                if msg.created_ms < min_ts:
                    cur += 1
                    continue
                min_ts = r.min_ts = 0
            if r.filter is not None and not stream_filter.wanted(r.filter, msg.properties):
                cur += 1
                continue
            if run_sink is None:
                push((deliver(msg), cur))
                sent += 1
            else:
                run.append(msg)
                offsets.append(cur)
            room -= 1
            cur += 1
        if run:
            for pair in zip(run_sink(run), offsets):
                push(pair)
            sent += len(run)
        r.cursor = cur
        self.stats_delivered += sent

    # -- named consumer offsets -----------------------------------------------------------------------
    def _reconcile(self, r: Reader) -> bool:
        """Forget the acked prefix of a consumer's deliveries (recording the last one's offset for
        a named consumer); True while some remain unacked. Run after acks (dispatch)."""
        c = r.consumer
        inflight = r.inflight
        if c.closed:  # closing took everything back unacked: nothing more was processed
            inflight.clear()
            return False
        outstanding = c.outstanding
        last = None
        popleft = inflight.popleft
        while inflight and inflight[0][0] not in outstanding:
            last = popleft()[1]
        if last is not None and r.name is not None:
            self.set_offset(r.name, last, flush=False)
        return bool(inflight)


def find_stream(broker, vhost: str, queue: str) -> StreamQueue:
    """The stream queue ``queue`` of ``vhost`` (KeyError: no such queue; ValueError: not a stream)."""
    vh = broker.vhosts.get(vhost)
    q = vh.queues.get(queue) if vh is not None else None
    if q is None:
        raise KeyError(f"no queue '{queue}' in vhost '{vhost}'")
    if not isinstance(q, StreamQueue):
        raise ValueError(f"queue '{queue}' in vhost '{vhost}' is not a stream")
    return q
